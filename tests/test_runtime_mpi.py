"""Real runs with mpiexec on localhost ranks: the pipelined model against the whole model.

Each test starts one `mpiexec` (2 to 4 ranks, one CPU core each in the
localhost cluster) through llm_planner.launch.plan_launch, with a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import alive, sigint_default
from runtime_fixtures import decoder_plan, graph_plan, save_config, tiny_gpt2, tiny_llama

from llm_planner.core.plan import load_plan
from llm_planner.launch.plan_launch import launch_plan
from llm_planner.runtime import gpt
from llm_planner.runtime import graph as rg
from llm_planner.runtime.comm import usable_cores
from llm_planner.runtime.plan_schedule import calls_per_step, in_flight_batches

pytestmark = pytest.mark.mpi
TIMEOUT_S = 150.0


def _whole_tokens(config, prompts, steps, *, seed=0, checkpoint=None):
    config = gpt.prepare_config(config)
    source = gpt.weight_source(config, checkpoint=checkpoint, seed=seed)
    return gpt.generate_whole(gpt.build_whole_model(config, source), config, prompts, steps)


def _ok(result):
    assert result.ok, f"{result.error}\n{result.stderr_tail}"
    return result.report


def test_gpt2_checkpoint_on_four_ranks_split_unevenly_matches_generate(tmp_path):
    """A GPT-2 checkpoint directory, loaded per rank, split unevenly over four ranks: the whole model's
    tokens, each rank holding only its own tensors. One launch checks what two did (the uneven split with
    seeded weights, and a checkpoint on two ranks); seeded weights are the other runtime tests'."""
    from transformers import GPT2LMHeadModel

    config = gpt.prepare_config(tiny_gpt2())
    torch.manual_seed(1)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "ckpt")
    layout = {
        "embed": 0,
        "block.0": 1,
        "block.3": 2,
        "lm_head": 3,
    }  # embed | blocks 0-2 | block 3 + final_norm | lm_head (tied to the embedding)
    plan = decoder_plan(tmp_path / "plan.yaml", tmp_path / "ckpt", [layout], shard_sizes=[3])
    prompts = [[5, 6, 7, 9, 10], [1, 2], [3, 4, 5]]  # uneven lengths: left padding and a 2D mask
    # two untimed warm-up generations first: each starts from fresh KV caches, and only the timed one is counted
    result = launch_plan(
        plan,
        checkpoint=str(tmp_path / "ckpt"),
        prompt_ids=prompts,
        max_new_tokens=10,
        report_path=str(tmp_path / "run.json"),
        workdir=str(tmp_path / "w"),
        timeout_s=TIMEOUT_S,
        warmup=2,
    )
    report = _ok(result)
    assert Path(result.report_path) == (tmp_path / "run.json").resolve()
    assert report["tokens"] == _whole_tokens(config, prompts, 10, checkpoint=str(tmp_path / "ckpt"))
    ranks = report["ranks"]
    assert all(r["warmup_runs"] == 2 for r in ranks)
    # four ranks on one host: they spin while waiting only if the host has four cores (a 2-core CI box: they sleep)
    assert all(r["ranks_on_host"] == 4 and r["host_cores"] == usable_cores() for r in ranks)
    assert {r["wait"] for r in ranks} == {"spin" if usable_cores() >= 4 else "sleep"}
    assert (
        sum(t["count"] for t in ranks[1]["transfers"] if t["direction"] == "recv") == 10
    )  # the timed run's messages only
    assert [sorted(r["tasks"]) for r in ranks] == [
        ["embed"],
        ["block.0", "block.1", "block.2"],
        ["block.3", "final_norm"],
        ["lm_head"],
    ]
    assert all(calls == 10 for r in ranks for calls in r["task_calls"].values())
    weights = [r["weights"] for r in ranks]
    assert [w["source"] for w in weights] == ["checkpoint"] * 4
    # each rank read only its own tensors: wte, wpe | blocks 0-2 | block 3, ln_f | the tied head
    assert [w["tensors"] for w in weights] == [2, 36, 14, 1]
    sends = {(r["rank"], t["peer"]) for r in ranks for t in r["transfers"] if t["direction"] == "send"}
    assert sends == {(0, 1), (1, 2), (2, 3), (3, 0)}
    for r in ranks:
        assert r["total_s"] >= r["compute_s"] + r["comm_s"] - 1e-6


def test_llama_throughput_plan_runs_its_shards_as_planned_with_batches_in_flight(tmp_path):
    config = tiny_llama()
    model_dir = save_config(config, tmp_path / "llama")
    shard0 = {"embed": 0, "block.0": 1, "block.3": 0, "lm_head": 2}  # 0 -> 1 -> 0 -> 2: rank 0 holds two stages
    shard1 = {"embed": 2, "block.2": 1, "final_norm": 0}  # lm_head on rank 0, embed on rank 2
    plan = decoder_plan(tmp_path / "plan.yaml", model_dir, [shard0, shard1], shard_sizes=[2, 1], objective="throughput")
    batches = in_flight_batches(load_plan(plan))
    assert batches >= 2
    prompts = [[3 + i, 7, 11 + i, 2 * i + 1][: 2 + i % 3] for i in range(3 * batches)]
    report = _ok(
        launch_plan(plan, prompt_ids=prompts, max_new_tokens=8, workdir=str(tmp_path / "w"), timeout_s=TIMEOUT_S)
    )
    assert [(s["batch"], s["shard"], len(s["requests"])) for s in report["streams"]] == [
        (w, s, 2 - s) for w in range(batches) for s in (0, 1)
    ]
    assert report["tokens"] == _whole_tokens(config, prompts, 8)
    assert len({tuple(t) for t in report["tokens"]}) > 1
    # one call per stream and step at the shard's size: what the plan's cost counted
    calls = calls_per_step(load_plan(plan), batches)
    assert {(r["device"], t): n for r in report["ranks"] for t, n in r["task_calls"].items()} == {
        k: 8 * len(v) for k, v in calls.items()
    }
    assert report["unit"] == "s/sample" and report["measured_samples_per_s"] == pytest.approx(1 / report["measured_s"])


def test_resnet18_split_across_three_ranks_matches_the_whole_model(tmp_path):
    plan = graph_plan(tmp_path / "plan.yaml", "resnet18", batch=2, num_devices=3)
    result = launch_plan(plan, workdir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, warmup=1)
    report = _ok(result)
    gm, example = rg.build_graph_model({"name": "resnet18", "seed": 0, "dtype": "fp32"})
    with torch.no_grad():
        expected = gm(rg.make_batch(example, 2, seed=0))
    output = torch.load(report["output_path"])
    assert output.shape == (2, 1000) and report["output"]["shape"] == [2, 1000]
    assert torch.allclose(output, expected, rtol=1e-4, atol=1e-5)
    assert len(report["ranks"]) == 3 and all(r["compute_s"] > 0 for r in report["ranks"])
    assert all(
        r["warmup_runs"] == 1 and set(r["task_calls"].values()) == {1} for r in report["ranks"]
    )  # one timed pass


def test_rwnn_split_across_three_ranks_in_two_shards_matches_the_whole_model(tmp_path):
    plan = graph_plan(tmp_path / "plan.yaml", "rwnn-ws-2x6", batch=3, num_devices=3, shards=2)
    report = _ok(launch_plan(plan, workdir=str(tmp_path / "w"), timeout_s=TIMEOUT_S))
    gm, example = rg.build_graph_model({"name": "rwnn-ws-2x6", "seed": 0, "dtype": "fp32"})
    with torch.no_grad():
        expected = gm(rg.make_batch(example, 3, seed=0))
    assert torch.allclose(torch.load(report["output_path"]), expected, rtol=1e-4, atol=1e-5)
    assert all(len(r["transfers"]) > 0 for r in report["ranks"])


def test_a_graph_throughput_plan_streams_batches_and_is_measured_by_its_period(tmp_path):
    """A throughput plan's graph run streams 2 depth + 2 batches (each the same input), every rank ending
    each batch once and holding what it sent for at most depth + 1 of them; the report's
    figure is the period between the ends of the batches that end in the steady state, and the first batch's
    output is the whole model's."""
    plan_path = graph_plan(
        tmp_path / "plan.yaml", "rwnn-ws-2x6", batch=3, num_devices=3, shards=2, objective="throughput"
    )
    plan = load_plan(plan_path)
    report = _ok(launch_plan(plan_path, workdir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, warmup=1))
    batches, depth = report["batches"], report["pipeline_depth"]
    assert depth >= 3 and batches == 2 * depth + 2  # three devices in turn: levels 0-2, the output above
    assert report["plan_batches_in_flight"] == plan.batches_in_flight
    assert report["last_batch_output"] == report["output"]  # every batch the same input, none mixed up
    gm, example = rg.build_graph_model({"name": "rwnn-ws-2x6", "seed": 0, "dtype": "fp32"})
    with torch.no_grad():
        expected = gm(rg.make_batch(example, 3, seed=0))
    assert torch.allclose(torch.load(report["output_path"]), expected, rtol=1e-4, atol=1e-5)
    for rank in report["ranks"]:
        assert [b for b, _ in rank["batch_end_s"]] == list(range(batches))
        # a rank holds what it sent only until its reader's turn: never every batch's values
        assert 1 <= rank["most_batches_held"] <= depth + 1 < batches
        for task, calls in rank["task_calls"].items():  # once a batch, for each shard that puts it here
            assert calls == batches * sum(a.get(task) == rank["device"] for a in plan.shard_assignments)
    steady = batches - depth
    last = [max(r["batch_end_s"][b][1] for r in report["ranks"]) for b in (0, steady - 1)]
    assert report["measured_s"] == pytest.approx((last[1] - last[0]) / (steady - 1) / plan.batch_size)
    # in the steady state every rank does a batch's work each period: no period is much shorter than the
    # busiest rank's work a batch (warm: the run's first batch is no slower than the rest), where the drain's
    # bunched ends, counted, would read shorter
    busiest = max(sum(r["tasks"].values()) for r in report["ranks"]) / batches
    assert report["measured_s"] * plan.batch_size >= 0.8 * busiest
    assert report["measured_what"].startswith("seconds per sample: the steady state's period between batch ends")


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("small")
    model_dir = save_config(tiny_gpt2(n_layer=2), tmp / "gpt2")
    return decoder_plan(tmp / "plan.yaml", model_dir, [{"embed": 0, "block.1": 1}])


def test_a_rank_that_raises_stops_every_rank_with_its_message(small_plan, tmp_path):
    result = launch_plan(
        small_plan, prompt_ids=[[1, 2]], max_new_tokens=4, workdir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, fail_rank=1
    )
    ended = time.time()
    assert not result.ok and result.returncode != 0
    assert result.error.startswith(
        "rank 1 (localhost/cpu-core:1): InjectedFailure: rank 1 (localhost/cpu-core:1) fails on purpose"
    )
    failed_at = (tmp_path / "w" / "error.rank1.txt").stat().st_mtime
    assert ended - failed_at < TIMEOUT_S / 2  # stopped by the failure, not by the run's timeout
    assert result.report is None


def test_mpiexec_with_another_rank_count_is_refused_before_the_run(small_plan, tmp_path):
    dry = launch_plan(small_plan, dry_run=True, workdir=str(tmp_path / "w"))
    command = [str(Path(sys.executable).parent / "mpiexec"), "-n", "3", *dry.command[5:]]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode != 0
    assert (
        "the rank table has 2 ranks (one per device the plan uses) but mpiexec started 3; start it with -n 2"
        in proc.stderr
    )
    assert "RankCountError" in (tmp_path / "w" / "error.rank0.txt").read_text()


def test_the_timeout_bounds_the_whole_run(small_plan, tmp_path):
    result = launch_plan(small_plan, prompt_ids=[[1, 2]], max_new_tokens=4, workdir=str(tmp_path / "w"), timeout_s=1.0)
    assert not result.ok
    assert "exceeded its timeout of 1 s" in result.error


QUIET_WAIT = """
import resource, sys, time
from llm_planner.runtime.comm import Comm
comm = Comm(spin=False)  # as on a host with more ranks than cores
comm.barrier()
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
start = cpu()
if comm.rank == 1:
    time.sleep(2.0)  # rank 0 waits for it in the barrier, then in the gather
comm.barrier()
comm.gather(comm.rank)
if comm.rank == 0:
    print(f"cpu_s={cpu() - start:.3f}", flush=True)
"""


def test_a_rank_waiting_in_a_barrier_or_gather_leaves_its_core_to_the_others(tmp_path):
    """MPI's Barrier spins (a whole core for the 2 s); the runtime's polls, then sleeps, when ranks share cores."""
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_WAIT)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mpiexec"), "-n", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    cpu_s = float(proc.stdout.split("cpu_s=")[1].split()[0])
    assert cpu_s < 0.5, f"rank 0 used {cpu_s} s of CPU waiting 2 s for rank 1"


def _rank_pids(workdir: Path, ranks: int, timeout_s: float = 60.0) -> list[int]:
    """The ranks' pids from their pid files, once every rank has written one."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        files = [workdir / f"rank{r}.pid" for r in range(ranks)]
        if all(f.is_file() and f.read_text().strip() for f in files):
            return [int(f.read_text().split()[0]) for f in files]
        time.sleep(0.1)
    raise AssertionError(f"the ranks did not start within {timeout_s} s")


def test_a_rank_that_dies_is_named_and_no_process_is_left(small_plan, tmp_path):
    import json
    import signal
    import threading

    workdir = tmp_path / "w"
    pids: list[int] = []

    def kill_rank_1() -> None:
        pids.extend(_rank_pids(workdir, 2))
        time.sleep(3.0)  # building and warming up: the run is under way
        os.kill(pids[1], signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    result = launch_plan(
        small_plan, prompt_ids=[[1, 2]], max_new_tokens=40, workdir=str(workdir), timeout_s=TIMEOUT_S, warmup=10_000
    )
    killer.join()
    assert not result.ok
    assert result.error.startswith("rank 1 (localhost/cpu-core:1) on localhost died: Killed (signal 9)"), result.error
    deadline = time.time() + 10.0
    while any(map(alive, pids)) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, pids)), "a rank outlived the run"
    report = json.loads(Path(result.report_path).read_text())
    assert (report["status"], report["failed_rank"], report["failed_device"]) == ("failed", 1, "localhost/cpu-core:1")


def test_ctrl_c_on_launch_stops_mpiexec_and_every_rank_within_10_s(small_plan, tmp_path):
    import json
    import signal

    workdir, report = tmp_path / "w", tmp_path / "run.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llm_planner.cli.main",
            "launch",
            str(small_plan),
            "--workdir",
            str(workdir),
            "--report",
            str(report),
            "--max-new-tokens",
            "40",
            "--warmup",
            "10000",
            "--prompt-ids",
            "1,2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )
    pids = _rank_pids(workdir, 2)
    time.sleep(2.0)
    mpiexec = [
        int(p)
        for p in subprocess.run(["pgrep", "-f", f"mpiexec.*{workdir}"], capture_output=True, text=True).stdout.split()
    ]
    assert mpiexec and all(map(alive, pids))
    start = time.time()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    while any(map(alive, pids + mpiexec)) and time.time() - start < 30.0:
        time.sleep(0.1)
    assert not any(map(alive, pids + mpiexec)), f"still running: {[p for p in pids + mpiexec if alive(p)]}"
    assert json.loads(report.read_text())["status"] == "interrupted"
