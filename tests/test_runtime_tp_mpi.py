"""Tensor-parallel groups under mpiexec: members of a group hold 1/k of their tasks and
all-reduce as the plan's cost model says; greedy tokens equal one-process `generate`."""

from __future__ import annotations

import pytest
from runtime_fixtures import decoder_plan, save_config, tiny_gpt2, tiny_llama

from llm_planner.core.plan import load_plan
from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.launch.plan_launch import launch_plan
from llm_planner.runtime import gpt
from llm_planner.runtime.plan_schedule import in_flight_batches, streams_of

pytestmark = pytest.mark.mpi
TIMEOUT_S = 150.0
G01 = "localhost/cpu-core:0-1"
PROMPTS = [[5, 6, 7, 9, 10], [1, 2]]  # uneven lengths: left padding and a 2D mask


def _whole_tokens(config, prompts, steps, seed=0):
    config = gpt.prepare_config(config)
    return gpt.generate_whole(
        gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=None, seed=seed)), config, prompts, steps
    )


def _run(plan, prompts, steps, tmp_path):
    result = launch_plan(
        plan, prompt_ids=prompts, max_new_tokens=steps, workdir=str(tmp_path / "w"), timeout_s=TIMEOUT_S
    )
    assert result.ok, f"{result.error}\n{result.stderr_tail}"
    return result.report


def _planned_collectives(plan_path, steps: int, prompts) -> tuple[dict, dict]:
    """Per group: the all-reduces and all-gathers its members make per run, and their bytes, from the plan's
    task fields (a decode graph: per sample and position; the first step runs the padded prompt's positions,
    the head always the last one only)."""
    plan = load_plan(plan_path)
    tasks = {t.name: t for t in build_model_graph(ModelSpec.from_dict(dict(plan.inputs.model))).tasks}
    counts: dict[str, dict[str, int]] = {}
    sizes: dict[str, dict[str, float]] = {}
    for stream in streams_of(plan, in_flight_batches(plan)):
        batch, prompt = len(stream.requests), max(len(prompts[r]) for r in stream.requests)
        for task, device in plan.shard_assignments[stream.shard].items():
            if "-" in device.split(":")[-1]:
                t = tasks[task]
                entry = counts.setdefault(device, {"all_reduce": 0, "all_gather": 0})
                entry["all_reduce"] += steps * t.tp_allreduces
                entry["all_gather"] += steps * t.tp_allgathers
                moved = sizes.setdefault(device, {"all_reduce": 0.0, "all_gather": 0.0})
                moved["all_reduce"] += batch * (prompt + steps - 1) * t.tp_allreduce_bytes_per_sample
                moved["all_gather"] += batch * steps * t.tp_allgather_bytes_per_sample
    return counts, sizes


def _measured_collectives(report, what: str = "count") -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in report["ranks"]:
        if "collectives" in r:
            counts = {kind: c[what] for kind, c in r["collectives"].items()}
            assert out.setdefault(r["plan_device"], counts) == counts  # every member makes the same calls
    return {d: {"all_reduce": c.get("all_reduce", 0), "all_gather": c.get("all_gather", 0)} for d, c in out.items()}


@pytest.mark.parametrize("make, layers", [(tiny_gpt2, 4), (tiny_llama, 5)])
def test_the_whole_model_on_a_group_of_two_ranks(make, layers, tmp_path):
    config = make()
    plan = decoder_plan(
        tmp_path / "plan.yaml", save_config(config, tmp_path / "m"), [{"embed": G01}], shard_sizes=[2], max_tp=2
    )
    report = _run(plan, PROMPTS, 8, tmp_path)
    assert report["tokens"] == _whole_tokens(config, PROMPTS, 8)
    ranks = report["ranks"]
    assert [(r["device"], r["plan_device"]) for r in ranks] == [
        ("localhost/cpu-core:0", G01),
        ("localhost/cpu-core:1", G01),
    ]
    planned = {
        G01: {"all_reduce": 8 * (1 + 2 * layers), "all_gather": 8}
    }  # per step: embed 1, each block 2; the head's argmax
    counts, sizes = _planned_collectives(plan, 8, PROMPTS)
    assert _measured_collectives(report) == counts == planned
    assert _measured_collectives(report, "bytes") == sizes  # fp32 plan and ranks
    assert all(r["weights"]["tensors"] > 0 for r in ranks)


def test_llama_group_beside_pipeline_stages_on_four_ranks(tmp_path):
    config = tiny_llama()  # 5 blocks, 4 heads, 2 KV heads
    layout = {
        "embed": 2,
        "block.0": G01,
        "block.3": 3,
        "final_norm": G01,
    }  # 2 | group: blocks 0-2 | 3: blocks 3-4 | group: norm, head
    plan = decoder_plan(
        tmp_path / "plan.yaml", save_config(config, tmp_path / "m"), [layout], shard_sizes=[2], max_tp=2
    )
    report = _run(plan, PROMPTS, 8, tmp_path)
    assert report["tokens"] == _whole_tokens(config, PROMPTS, 8)
    counts, sizes = _planned_collectives(plan, 8, PROMPTS)
    assert _measured_collectives(report) == counts == {G01: {"all_reduce": 8 * 2 * 3, "all_gather": 8}}
    assert _measured_collectives(report, "bytes") == sizes
    sends = {(r["rank"], t["peer"]) for r in report["ranks"] for t in r["transfers"] if t["direction"] == "send"}
    assert sends == {
        (2, 0),
        (2, 1),
        (0, 3),
        (3, 0),
        (3, 1),
        (0, 2),
    }  # into a group: to each member; out of it: the leader


def test_data_parallel_replicas_on_two_ranks(tmp_path):
    config = tiny_gpt2()
    plan = decoder_plan(
        tmp_path / "plan.yaml", save_config(config, tmp_path / "m"), [{"embed": 0}, {"embed": 1}], shard_sizes=[2, 2]
    )
    prompts = PROMPTS + [[9, 8, 7], [4]]
    report = _run(plan, prompts, 8, tmp_path)
    assert report["tokens"] == _whole_tokens(config, prompts, 8)
    assert [s["requests"] for s in report["streams"]] == [[0, 1], [2, 3]]
    assert all(
        not r["transfers"] or {t["peer"] for t in r["transfers"]} == {r["rank"]} for r in report["ranks"]
    )  # replicas never talk
