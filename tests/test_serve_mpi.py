"""Serving plans under mpiexec: every request's greedy tokens equal the whole model's, whatever the
layout (one stage; two stages with two micro-batches; a tensor-parallel pair feeding one device;
two replicas behind the front end; a mixture of experts split over a pair and over two stages);
the run report's fields; a failing rank stops the run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from runtime_fixtures import save_config, tiny_gpt2, tiny_llama, tiny_mixtral
from serve_fixtures import check_tokens, dev, serving_plan

from llm_planner.launch.serve_launch import RAW_NAME, ServeOptions, launch_serving
from llm_planner.runtime.serve_requests import LoadSpec, RequestStream

pytestmark = pytest.mark.mpi
TIMEOUT_S = 150.0

MEASURED = {"tokens_per_s", "tpot_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "ttft_s", "ttft_p50_s", "ttft_p99_s"}
REPLICA_KEYS = {
    "replica",
    "layout",
    "concurrency",
    "micro_batches",
    "max_batched_tokens",
    "cuda_graphs",
    "requests_completed",
    "output_tokens",
    "duration_s",
    "measured",
    "predicted",
}


def _serve(tmp_path: Path, make, replicas: list[dict], requests: int, budget: int = 8, **options):
    config = make()
    model = save_config(config, tmp_path / "m")
    plan = serving_plan(tmp_path / "plan.yaml", model, replicas, max_batched_tokens=budget)
    result, report = launch_serving(
        plan,
        ServeOptions(
            workdir=str(tmp_path / "w"),
            report_path=str(tmp_path / "run.json"),
            timeout_s=TIMEOUT_S,
            max_requests=requests,
            **options,
        ),
    )
    assert result.ok, f"{result.error}\n{result.stderr_tail}"
    return config, plan, report, json.loads((tmp_path / "w" / RAW_NAME).read_text())


def _check_report(report, plan: Path, replicas: int, rate: float | None = None) -> None:
    assert report["format"] == "llm_planner.serving_run" and report["version"] == 1
    assert report["plan"] == str(plan)
    assert report["workload"] == {"prompt_len": 6, "output_len": 5, "seed": 0, "request_rate": rate}
    assert len(report["replicas"]) == replicas
    for r in report["replicas"]:
        assert set(r) == REPLICA_KEYS
        assert set(r["measured"]) == MEASURED | {"decode_step_s", "ttft_steady_s", "steady_requests"}
        assert set(r["predicted"]) == {"concurrency", "tokens_per_s", "tpot_s", "ttft_s", "decode_step_s"}
        assert r["output_tokens"] == 5 * r["requests_completed"]
        assert r["cuda_graphs"] and all(g == "the stage runs on cpu, not CUDA" for g in r["cuda_graphs"])
        assert all(r["measured"][k] > 0 for k in MEASURED)
        steady = r["measured"]["ttft_steady_s"]  # None when the opening burst outlasts the admissions
        assert (steady is None) == (r["measured"]["steady_requests"] == 0) and (steady is None or steady > 0)
    assert set(report["total"]) == {"requests_completed", "output_tokens", "duration_s", "measured", "predicted"}


def test_one_stage(tmp_path):
    replicas = [{"degrees": [1], "layers": [4], "concurrency": 3, "micro_batches": 1, "devices": [[dev(0)]]}]
    config, plan, report, raw = _serve(tmp_path, tiny_gpt2, replicas, 5)
    check_tokens(config, report, raw, 5)
    _check_report(report, plan, 1)


def test_two_stages_with_two_micro_batches(tmp_path):
    replicas = [
        {"degrees": [1, 1], "layers": [2, 2], "concurrency": 4, "micro_batches": 2, "devices": [[dev(0)], [dev(1)]]}
    ]
    config, _, report, raw = _serve(tmp_path, tiny_gpt2, replicas, 6, budget=4)
    check_tokens(config, report, raw, 6)
    iterations = raw["replicas"][0]["iterations"]
    assert max(n for *_, n in iterations) <= 2  # a micro-batch holds at most half the slots
    assert max(tokens for _, _, _, tokens, _ in iterations) <= 4  # the token budget
    assert iterations[0][3:] == [4, 1]  # the first prompt's first chunk: no token to sample yet


def test_a_tensor_parallel_pair_feeding_one_device(tmp_path):
    replicas = [
        {
            "degrees": [2, 1],
            "layers": [3, 2],
            "concurrency": 3,
            "micro_batches": 2,
            "devices": [[dev(0), dev(1)], [dev(2)]],
        }
    ]
    config, _, report, raw = _serve(tmp_path, tiny_llama, replicas, 5)
    check_tokens(config, report, raw, 5)
    collectives = [r["collectives"] for r in raw["ranks"] if "collectives" in r]
    assert len(collectives) == 2 and collectives[0]["all_reduce"]["count"] > 0
    shared = any(r.get("wait") == "sleep" for r in raw["ranks"])  # three ranks on a 2-core machine share cores
    assert ("warnings" in report) == shared
    assert not shared or "ranks shared cores" in report["warnings"][0]


def test_a_mixture_of_experts_on_a_tensor_parallel_pair(tmp_path):
    """The tiny Mixtral (cluster_specs/localhost-serve-mixtral: 4 experts, top-2) on a pair whose members
    hold half of every expert's width (one all-reduce per layer's MLP): every request's tokens are
    transformers' MixtralForCausalLM's on its prompt alone."""
    pair = {"degrees": [2], "layers": [4], "concurrency": 3, "micro_batches": 1, "devices": [[dev(0), dev(1)]]}
    config, _, report, raw = _serve(tmp_path, tiny_mixtral, [pair], 5)
    check_tokens(config, report, raw, 5)
    collectives = [r["collectives"] for r in raw["ranks"] if "collectives" in r]
    assert len(collectives) == 2 and collectives[0]["all_reduce"]["count"] > 0


@pytest.mark.parametrize("concurrency, requests", [(4, 6), (3, 5)])
def test_a_mixture_of_experts_with_data_parallel_attention(tmp_path, concurrency, requests):
    """The tiny Mixtral on a dpa2 pair: each member schedules its own sequences (its share of the replica's
    slots and every other request), attention whole, two of the four experts whole, the tokens gathered and
    scattered around the experts of each layer; every request's tokens are MixtralForCausalLM's on its prompt
    alone, with an odd request count and concurrency leaving one member idle for some iterations."""
    pair = {
        "degrees": [2],
        "layers": [4],
        "concurrency": concurrency,
        "micro_batches": 1,
        "attention": "dp",
        "devices": [[dev(0), dev(1)]],
    }
    config, plan, report, raw = _serve(tmp_path, tiny_mixtral, [pair], requests)
    check_tokens(config, report, raw, requests)
    _check_report(report, plan, 1)
    collectives = [r["collectives"] for r in raw["ranks"] if "collectives" in r]
    assert len(collectives) == 2
    assert all(c["reduce_scatter"]["count"] > 0 and "all_reduce" not in c for c in collectives)


@pytest.mark.slow  # four ranks: about 45 s on two cores shared with other work
def test_a_mixture_of_experts_on_two_stages_beside_a_pair(tmp_path):
    """Replica 0 the pair above, replica 1 two single-rank stages of whole experts, two micro-batches."""
    pair = {"degrees": [2], "layers": [4], "concurrency": 3, "micro_batches": 1, "devices": [[dev(0), dev(1)]]}
    stages = {"degrees": [1, 1], "layers": [2, 2], "concurrency": 2, "micro_batches": 2}
    config, _, report, raw = _serve(tmp_path, tiny_mixtral, [pair, {**stages, "devices": [[dev(2)], [dev(3)]]}], 8)
    check_tokens(config, report, raw, 8)
    assert all(r["requests_completed"] > 0 for r in report["replicas"])


def test_two_replicas_behind_the_front_end_in_open_loop(tmp_path):
    one = {"degrees": [1], "layers": [4], "concurrency": 2, "micro_batches": 1}
    replicas = [{**one, "devices": [[dev(0)]]}, {**one, "devices": [[dev(1)]]}]
    config, plan, report, raw = _serve(tmp_path, tiny_gpt2, replicas, 6, request_rate=40.0)
    check_tokens(config, report, raw, 6)
    _check_report(report, plan, 2, rate=40.0)
    assert [r["requests_completed"] for r in report["replicas"]] == [3, 3]  # equal shares
    stream = RequestStream(LoadSpec(shapes=((6, 5, 1.0),), vocab_size=128, seed=0, request_rate=40.0))
    for r in (r for rep in raw["replicas"] for r in rep["requests"]):
        assert r["arrival_s"] == stream.arrival_s(r["index"]) <= r["admitted_s"]  # admitted once arrived


def test_a_failing_rank_stops_every_rank_and_is_named(tmp_path):
    model = save_config(tiny_gpt2(), tmp_path / "m")
    one = {"degrees": [1], "layers": [4], "concurrency": 2, "micro_batches": 1}
    plan = serving_plan(tmp_path / "plan.yaml", model, [{**one, "devices": [[dev(0)]]}, {**one, "devices": [[dev(1)]]}])
    result, report = launch_serving(
        plan, ServeOptions(workdir=str(tmp_path / "w"), timeout_s=TIMEOUT_S, max_requests=4, fail_rank=1)
    )
    assert not result.ok and report is None
    assert "rank 1 (replica 1 stage 0 of 1) on host localhost failed" in result.error, result.error
    assert "fails on purpose" in result.error
    failure = json.loads(Path(result.report_path).read_text())
    assert failure["status"] == "failed" and failure["error"] == result.error
    assert [failure[f"failed_{k}"] for k in ("rank", "replica", "stage")] == [1, 1, 0]
    # what was served: nothing by replica 1, whose scheduler (rank 1) failed as the run started
    assert [r["replica"] for r in failure["served"]["replicas"]] == [0, 1]
    assert failure["served"]["replicas"][1]["requests_completed"] == 0


def test_a_rank_that_stops_answering_is_named_within_the_stall_timeout(tmp_path):
    """A rank frozen mid-run (SIGSTOP: as a hung process or a host cut off looks from the launcher)
    sends no more heartbeats and its replica gets nothing back: the launcher stops the run after
    --stall-timeout, long before --timeout, and names the rank with its replica and stage."""
    model = save_config(tiny_gpt2(), tmp_path / "m")
    two = {"degrees": [1, 1], "layers": [2, 2], "concurrency": 2, "micro_batches": 1}
    plan = serving_plan(tmp_path / "plan.yaml", model, [{**two, "devices": [[dev(0)], [dev(1)]]}])
    workdir = tmp_path / "w"
    freezer = threading.Thread(target=_freeze_when_beating, args=(workdir, 1), daemon=True)
    freezer.start()
    start = time.monotonic()
    result, report = launch_serving(
        plan,
        ServeOptions(workdir=str(workdir), timeout_s=TIMEOUT_S, max_requests=10**6, stall_timeout_s=4.0),
    )
    assert not result.ok and report is None
    assert time.monotonic() - start < TIMEOUT_S / 2
    assert "--stall-timeout 4 s" in result.error, result.error
    assert "rank 1 (replica 0 stage 1 of 2)" in result.error or "rank 0 (replica 0 stage 0 of 2)" in result.error
    failure = json.loads(Path(result.report_path).read_text())
    assert failure["status"] == "failed" and failure["failed_replica"] == 0


def _freeze_when_beating(workdir: Path, rank: int) -> None:
    """SIGSTOP `rank` once its heartbeats reach the launcher's mpiexec.out."""
    out = workdir / "mpiexec.out"
    for _ in range(600):
        if out.is_file() and f"llm_planner.heartbeat rank={rank} progress=" in out.read_text(errors="replace"):
            pid = int((workdir / f"rank{rank}.pid").read_text().split()[0])
            os.kill(pid, signal.SIGSTOP)
            return
        time.sleep(0.2)
