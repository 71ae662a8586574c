"""Hosts and paths (issue 26), each defect by its first example: a hostname that is not a host
name or an address is refused naming the file and field; a plan's input paths and a checkpoint's
shard paths are regular files (a FIFO never hangs a command) and shards stay inside the
checkpoint. (`-o` and symbolic links: tests/test_plan_file.py.)"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from llm_planner.core.names import hostname_problem
from llm_planner.core.spec import SpecError, parse_cluster

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
    count = 2 if "{" in hostname else 1  # copies of one template need one host each (test_export_trust.py)
    assert len({d.hostname for d in _cluster(hostname, count).devices()}) == count


def test_the_rules_of_a_host_name():
    assert hostname_problem("a-b.c1") is None and hostname_problem("192.168.1.1") is None
    assert hostname_problem("a" * 254) is not None and "-x" in hostname_problem("-x")


def _verify(plan: Path, capsys) -> tuple[int, str]:
    from llm_planner.cli.main import main

    code = main(["verify", str(plan)])
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    return code, err


def _plan_naming(tmp_path: Path, cluster: str) -> Path:
    from plan_files import written_plan

    plan = written_plan(tmp_path)
    text = re.sub(r"^  cluster: .*$", f"  cluster: {json.dumps(cluster)}", plan.read_text(), count=1, flags=re.M)
    plan.write_text(text)
    return plan


def test_a_plan_naming_a_fifo_as_its_cluster_is_refused_without_hanging(tmp_path, capsys):
    fifo = tmp_path / "cluster-fifo.yaml"
    os.mkfifo(fifo)
    code, err = _verify(_plan_naming(tmp_path, str(fifo)), capsys)
    assert code == 2 and "cluster-fifo.yaml: cannot read: not a regular file (a FIFO)" in err


def test_a_plan_naming_another_file_gets_no_line_of_it_quoted(tmp_path, capsys):
    secret = tmp_path / "secret.yaml"
    secret.write_text("password: [hunter2\n")  # not even valid YAML: a parse error would quote the line
    code, err = _verify(_plan_naming(tmp_path, str(secret)), capsys)
    assert code == 2 and "secret.yaml: the cluster file changed since the plan was made" in err
    assert "hunter2" not in err
    code, err = _verify(_plan_naming(tmp_path, "/etc/passwd"), capsys)
    assert code == 2 and "inputs.cluster: '/etc/passwd' is not a cluster, graph or profile file" in err


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "a/../../x.safetensors", ""])
def test_a_shard_path_may_not_leave_the_checkpoint_directory(tmp_path, shard):
    from llm_planner.runtime.weights import CheckpointWeights, WeightsError

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(WeightsError, match="weight_map.w: .* is not a file name inside the checkpoint directory"):
        CheckpointWeights(tmp_path)


def test_a_shard_that_is_a_fifo_is_refused_before_it_is_opened(tmp_path):
    from llm_planner.runtime.weights import CheckpointWeights, WeightsError

    os.mkfifo(tmp_path / "shard.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "shard.safetensors"}}))
    with pytest.raises(WeightsError, match="shard.safetensors: not a regular file"):
        CheckpointWeights(tmp_path)
    os.mkfifo(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(WeightsError, match="model.safetensors: not a regular file"):
        CheckpointWeights(tmp_path)
