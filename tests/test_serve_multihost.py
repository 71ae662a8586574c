"""`launch SERVING_PLAN` across real host boundaries: the two servers of tests/netns_hosts.py (network
namespaces, each with its own address and host name, the link between them shaped as the cluster spec's
inter_node link), the launcher on server 0 and mpiexec's own bootstrap starting each rank on its server.

A serving plan whose pipeline crosses the servers (stage 0 on server 0, stage 1 on server 1, two micro-batches)
serves every request the whole model's greedy tokens and reports measured beside predicted figures; a rank
killed mid-serving, or server 1's link taken down mid-serving, ends `launch` with exit status 1, a message naming
the server, the rank and its replica and stage, a failure report that says the same, and no process left in any
namespace. Skipped, saying why, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from netns_hosts import unavailable
from netns_launch import fail_mid_run, gone, ran_on, run_launch, two_servers
from runtime_fixtures import save_config, tiny_gpt2
from serve_fixtures import check_tokens, serving_plan

WHY_NOT = unavailable() if sys.platform.startswith("linux") else "network namespaces are Linux's"
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(WHY_NOT is not None, reason=f"no servers to launch on: {WHY_NOT}")]

REQUESTS = 8
# stage 0 (embed, blocks 0-1) on server 0, stage 1 (blocks 2-3, the head) on server 1: each iteration's hidden
# states cross the shaped link to server 1, its sampled tokens come back
PIPELINE = {
    "degrees": [1, 1],
    "layers": [2, 2],
    "concurrency": 4,
    "micro_batches": 2,
    "classes": ["server0/cpu-core", "server1/cpu-core"],
    "devices": [["server0/cpu-core:0"], ["server1/cpu-core:0"]],
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with two_servers(tmp_path_factory.mktemp("servers")) as made:
        yield made


@pytest.fixture(scope="module")
def pipeline(servers, tmp_path_factory) -> tuple[Path, object]:
    _, spec = servers
    tmp = tmp_path_factory.mktemp("plan")
    config = tiny_gpt2()
    plan = serving_plan(tmp / "serve.yaml", save_config(config, tmp / "gpt2"), [PIPELINE], cluster=spec)
    return plan, config


@pytest.mark.slow  # 25 to 50 s here: each rank's imports (torch, transformers) take about 10 s on a shared 2-core box
def test_a_pipeline_across_two_servers_serves_one_process_tokens_and_reports_measured_and_predicted(
    servers, pipeline, tmp_path
):
    hosts, _ = servers
    plan, config = pipeline
    work = tmp_path / "w"
    proc = run_launch(hosts, plan, work, "--max-requests", str(REQUESTS))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert ran_on(work, 2) == list(hosts.namespaces)  # each stage's rank on its own server
    hostfile = (work / "hostfile").read_text().split()
    assert hostfile == [f"{hosts.addresses[0]}:1", f"{hosts.addresses[1]}:1"]
    report = json.loads((work / "run.json").read_text())
    check_tokens(config, report, json.loads((work / "serving_raw.json").read_text()), REQUESTS)
    (replica,) = report["replicas"]
    assert (
        replica["layout"]
        == "server0/cpu-core: 1 stage x 1 CPU in 1 server -> server1/cpu-core: 1 stage x 1 CPU in 1 server"
    )
    measured, predicted = replica["measured"], replica["predicted"]
    for key in ("tokens_per_s", "tpot_s", "ttft_s", "decode_step_s"):
        assert measured[key] > 0 and predicted[key] > 0, key
    print(
        f"across two servers ({hosts.shaper}): decode step measured {measured['decode_step_s'] * 1e3:.2f} ms, "
        f"predicted {predicted['decode_step_s'] * 1e3:.2f} ms; {measured['tokens_per_s']:.1f} tokens/s, "
        f"predicted {predicted['tokens_per_s']:.1f}"
    )
    assert gone(hosts, 5.0) == []


def serve_until_failure(
    hosts, plan: Path, workdir: Path, fault, timeout_s: float, extra: tuple[str, ...] = ()
) -> tuple[str, dict, float]:
    """Serve far longer than timeout_s, apply `fault(rank 1's pid)` once serving is under way (both stages built,
    then two seconds of serving); the launcher's message and failure report, which holds what was served, and the
    seconds from the fault to the launcher's exit."""
    args = ("--max-requests", str(10**6), *extra)
    built = tuple(f"rank {r}: built replica 0 stage {r}" for r in range(2))
    message, report, ended_s = fail_mid_run(
        hosts, plan, workdir, fault, args=args, timeout_s=timeout_s, ready=built, settle_s=2.0
    )
    print(f"launch ended {ended_s:.1f} s after the fault: {message}")
    served = report["served"]
    (replica,) = served["replicas"]
    assert replica["requests_completed"] > 0 and replica["measured"]["tokens_per_s"] > 0
    assert replica["output_tokens"] == 5 * replica["requests_completed"] == served["total"]["output_tokens"]
    tail = f"served before the failure: {replica['requests_completed']} requests, {replica['output_tokens']} output"
    assert tail in message
    return message, report, ended_s


@pytest.mark.slow
def test_a_rank_killed_mid_serving_names_its_server_and_stage_and_leaves_nothing(servers, pipeline, tmp_path):
    hosts, _ = servers
    plan, _ = pipeline
    kill = lambda pid: os.kill(pid, signal.SIGKILL)  # noqa: E731
    message, report, _ = serve_until_failure(hosts, plan, tmp_path / "w", kill, timeout_s=60)
    server1 = hosts.addresses[1]
    # a remote rank's end comes as its exit code (9: SIGKILL) from its server's proxy
    assert f"launch failed: rank 1 (replica 0 stage 1 of 2) on host {server1} failed: " in message
    assert f"rank 1 (server1/cpu-core:0) on {server1} died: " in message and "9" in message
    fields = ("status", "failed_rank", "failed_host", "failed_replica", "failed_stage")
    assert [report[k] for k in fields] == ["failed", 1, server1, 0, 1]
    assert "cut off" not in message and "unreachable_hosts" not in report  # its server still answers the probe
    assert gone(hosts, 10.0) == []


@pytest.mark.slow
def test_a_link_taken_down_mid_serving_names_the_server_cut_off_and_its_stage(servers, pipeline, tmp_path):
    """No error crosses a dead link: every rank just waits for its peer. The heartbeats tell the launcher: server
    1's rank sends none (its lines cross the cut link), or the scheduler gets nothing back, within --stall-timeout,
    long before --timeout. The launcher's probe names server 1, cut off, with its rank and the stage it served,
    first; the rank the heartbeats name follows with its own stage."""
    hosts, _ = servers
    plan, _ = pipeline
    try:
        message, report, ended_s = serve_until_failure(
            hosts,
            plan,
            tmp_path / "w",
            lambda pid: hosts.link(1, up=False),
            timeout_s=120,
            extra=("--stall-timeout", "5"),
        )
    finally:
        hosts.link(1, up=True)
    server0, server1 = hosts.addresses
    cut = f"host {server1} (rank 1 (server1/cpu-core:0)) answered when the run started and no longer does"
    assert message.startswith(f"launch failed: cut off from the launcher: {cut}"), message
    assert "the ranks cut off served: rank 1: replica 0 stage 1 of 2; " in message
    assert "(--stall-timeout 5 s)" in message and "exceeded its timeout" not in message
    assert ended_s < 60
    rank = report["failed_rank"]
    assert f"rank {rank} (replica 0 stage {rank} of 2) on host {report['failed_host']} failed: " in message
    assert (report["failed_replica"], report["failed_stage"]) == (0, rank)
    assert server0 not in message.split(";")[0]
    (unreachable,) = report["unreachable_hosts"]
    assert (unreachable["host"], unreachable["ranks"]) == (server1, [1])
    assert unreachable["stages"] == [{"rank": 1, "replica": 0, "stage": 1}]
    assert " ".join(report["error"].split()) == message.removeprefix("launch failed: ")
    assert gone(hosts, 10.0) == []
