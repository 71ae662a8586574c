"""Hosts and paths (issue 26), each defect by its first example: a hostname that is not a host
name or an address is refused naming the file and field; a plan's input paths and a checkpoint's
shard paths are regular files (a FIFO never hangs a command) and shards stay inside the
checkpoint. (`-o` and symbolic links: tests/test_plan_file.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llm_planner.spec import SpecError, parse_cluster
from llm_planner.spec_fields import hostname_problem

sys.path.insert(0, str(Path(__file__).parent))
from input_mutations import CLUSTER  # noqa: E402


def _cluster(hostname: str, count: int = 2):
    data = json.loads(json.dumps(CLUSTER))
    data["nodes"][0].update(hostname=hostname, count=count)
    return parse_cluster(data, source="cluster.yaml")


@pytest.mark.parametrize(
    "hostname, says",
    [
        ("host-{i}\nevil:64", "label 'host-0\\nevil:64' holds a character other than"),
        ("-oProxyCommand=touch x", "label '-oProxyCommand=touch x' starts or ends with '-'"),
        ("a..b", "label '' is empty"),
        ("x" * 64 + ".lab", "is empty or longer than 63 characters"),
        ("gpu{i:>3}", "holds a character other than a letter, a digit or '-' (RFC 1123"),
        ("host_{i}", "holds a character other than"),
    ],
)
def test_a_hostname_that_is_no_host_name_is_refused_naming_the_field(hostname, says):
    with pytest.raises(SpecError, match="^cluster.yaml: nodes\\[0\\].hostname: ") as info:
        _cluster(hostname)
    assert says in str(info.value)


def test_every_copy_of_a_hostname_template_is_checked():
    _cluster("g{i:x}", count=16)  # hex digits are letters and digits
    with pytest.raises(SpecError, match=r"nodes\[0\].hostname: 'g1,000' .* \(copy 1000 of 'g\{i:,\}'\)"):
        _cluster("g{i:,}", count=1001)  # copies 0 to 999 are host names


@pytest.mark.parametrize("hostname", ["localhost", "gpu{i:02d}.lab", "10.0.0.7", "::1", "fe80::1", "node-1.example."])
def test_host_names_and_addresses_are_accepted(hostname):
    assert len({d.hostname for d in _cluster(hostname).devices()}) >= 1


def test_the_rules_of_a_host_name():
    assert hostname_problem("a-b.c1") is None and hostname_problem("192.168.1.1") is None
    assert hostname_problem("a" * 254) is not None and "-x" in hostname_problem("-x")
