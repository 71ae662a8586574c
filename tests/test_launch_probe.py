"""The launcher's host probe (llm_planner.launch.mpiexec_run): a host answers when a TCP connect to the probe port is
accepted or refused; a host that answered when the run started and no longer does is named as cut off."""

from __future__ import annotations

import socket

import pytest

from llm_planner.launch.launch_types import LaunchError
from llm_planner.launch.mpiexec_run import PROBE_PORT_ENV, cut_off, probe, probe_all, probe_port
from llm_planner.runtime.table import RankEntry, RankTable, RunSpec


def _table(hosts: list[str]) -> RankTable:
    ranks = tuple(
        RankEntry(
            rank=i, device=f"n{i}/cpu-core:0", node=f"n{i}", hostname=h, device_type="cpu", gpu_index=None, tasks={}
        )
        for i, h in enumerate(hosts)
    )
    run = RunSpec(plan_path="p.yaml", workload="decoder", workdir=".", report_path="run.json", timeout_s=10.0)
    return RankTable(ranks=ranks, run=run)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_host_that_accepts_or_refuses_answers_and_one_that_does_not_resolve_does_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert probe("127.0.0.1", server.getsockname()[1]) is None
    assert probe("127.0.0.1", _closed_port()) is None  # refused: the host's network stack replied
    assert "does not resolve" in probe("no-such-host.invalid", 22)


def test_only_hosts_that_answered_at_the_start_and_no_longer_do_are_cut_off():
    port = _closed_port()
    table = _table(["127.0.0.1", "no-such-host.invalid", "no-such-host.invalid"])
    # answered at the start, no longer resolves now: cut off, with both its ranks; 127.0.0.1 still answers
    cut = cut_off(table, {"127.0.0.1": None, "no-such-host.invalid": None}, port)
    assert [(c["host"], c["ranks"], c["devices"]) for c in cut] == [
        ("no-such-host.invalid", [1, 2], ["n1/cpu-core:0", "n2/cpu-core:0"])
    ]
    # never answered (a firewall dropping the port, say): not probed again, not named
    assert cut_off(table, {"127.0.0.1": None, "no-such-host.invalid": "no answer"}, port) == []
    assert probe_all(["127.0.0.1"], 0) == {}  # port 0: no probe


@pytest.mark.parametrize("value", ["ssh", "-1", "65536", "2 2"])
def test_a_bad_probe_port_is_refused_naming_the_variable(value):
    with pytest.raises(LaunchError, match=f"{PROBE_PORT_ENV}='{value}'"):
        probe_port({PROBE_PORT_ENV: value}, error=LaunchError)
    assert probe_port({}) == 22 and probe_port({PROBE_PORT_ENV: "0"}) == 0
