"""Predicted against measured: synthetic reports with known errors, decoders' phases, bad reports, one real run."""

from __future__ import annotations

import copy
import json
import time

import numpy as np
import pytest
from measure_fixtures import chain_graph, graph_plan, graph_report, true_cluster, write_inputs
from rich.console import Console

from llm_planner.cli import main as cli
from llm_planner.core.plan import load_plan, save_plan
from llm_planner.core.spec import load_cluster
from llm_planner.cost import roofline as cost
from llm_planner.graph.models import ModelSpec
from llm_planner.measure.compare import MeasureError, measure_files, measurement_tables, write_measurement
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.schedule import make_plan

N = 12
LAYOUT = [[(i // 2 + 1) % 3 for i in range(N)], [(2 - i // 3) % 3 for i in range(N)]]
ROWS = len(
    {(LAYOUT[s][i], i) for s in (0, 1) for i in range(N)}
)  # (device, task) pairs: a task on one device in both shards is one row


@pytest.fixture
def chain(tmp_path):
    cluster, graph = write_inputs(tmp_path)
    return cluster, graph_plan(tmp_path, cluster, graph, LAYOUT, [3, 5], "plan.yaml")


def _report(tmp_path, plan_path, truth, name="run.json"):
    path = tmp_path / name
    path.write_text(json.dumps(graph_report(load_plan(plan_path), chain_graph(), truth)))
    return path


def test_a_run_that_follows_the_plans_own_cost_model_measures_no_error(tmp_path, chain):
    cluster, plan = chain
    m = measure_files(plan, _report(tmp_path, plan, load_cluster(cluster)))
    assert ROWS < 2 * N and len(m.tasks) == ROWS and m.untimed == ()
    assert [r.calls for r in m.tasks].count(2) == sum(1 for i in range(N) if LAYOUT[0][i] == LAYOUT[1][i])
    for row in (*m.tasks, *m.devices, *m.links):
        assert row.rel_error == pytest.approx(0.0, abs=1e-9), row
    assert m.measured_s == pytest.approx(m.predicted_s, rel=1e-9)
    assert m.task_errors.count == ROWS and m.task_errors.max_abs < 1e-9
    assert {(r.src, r.dst) for r in m.links} == {
        (a, b)
        for a in ("box/gpu-b:0", "box/gpu-b:1", "box/cpu-a:0")
        for b in ("box/gpu-b:0", "box/gpu-b:1", "box/cpu-a:0")
        if a != b
    }


def test_errors_are_measured_over_predicted_per_call_and_summarised(tmp_path, chain):
    cluster, plan_path = chain
    truth, spec = true_cluster(), load_cluster(cluster)
    report = _report(tmp_path, plan_path, truth)
    m = measure_files(plan_path, report)
    plan, tasks = load_plan(plan_path), {t.name: t for t in chain_graph().tasks}
    kinds = {d.name: d.kind for d in spec.devices()}
    expected = {}
    for size, assignment in zip(plan.shard_sizes, plan.shard_assignments):
        for task, device in assignment.items():
            t_true = cost.estimate_task_time_s(tasks[task], truth.kind(kinds[device]), "fp16", size)
            t_spec = cost.estimate_task_time_s(tasks[task], spec.kind(kinds[device]), "fp16", size)
            old = expected.get((device, task), (0.0, 0.0))
            expected[(device, task)] = (old[0] + t_true, old[1] + t_spec)
    errors = [t / p - 1 for t, p in expected.values()]
    assert {(r.device, r.task): r.rel_error for r in m.tasks} == pytest.approx(
        {k: t / p - 1 for k, (t, p) in expected.items()}
    )
    s = m.task_errors
    assert (s.median_abs, s.p90_abs, s.max_abs) == pytest.approx(
        (np.median(np.abs(errors)), np.percentile(np.abs(errors), 90), max(map(abs, errors)))
    )
    assert s.median > 0.3  # the spec is optimistic: the true hardware is slower
    busy = {d.device: d for d in m.devices}
    for device, row in busy.items():
        assert row.measured_busy_s == pytest.approx(sum(t for (d, _), (t, _) in expected.items() if d == device))
        assert row.predicted_busy_s == pytest.approx(sum(p for (d, _), (_, p) in expected.items() if d == device))
    assert m.measured_s == pytest.approx(json.loads(report.read_text())["wall_s"])
    out = tmp_path / "measure.json"
    write_measurement(m, out)
    data = json.loads(out.read_text())
    assert data["predicted_s"] == plan.objective_s and data["measured_s"] == m.measured_s
    assert data["rel_error"] == pytest.approx(m.measured_s / plan.objective_s - 1)
    assert len(data["tasks"]) == ROWS and data["task_error"]["p90_abs"] == pytest.approx(s.p90_abs)
    console = Console(record=True, width=200)
    for table in measurement_tables(m, max_task_rows=5):
        console.print(table)
    text = console.export_text()
    assert "end to end: latency of one forward pass" in text and f"5 of {ROWS}, largest |error| first" in text
    worst = max(m.tasks, key=lambda r: abs(r.rel_error))
    assert worst.task in text


def _decoder_plan(tmp_path, phase: str):
    from runtime_fixtures import LOCALHOST, save_config, tiny_gpt2

    model_dir = save_config(tiny_gpt2(), tmp_path / "gpt2")
    problem = problem_from_inputs(
        cluster_path=str(LOCALHOST),
        model=ModelSpec(name=str(model_dir), dtype="fp32", seq_len=8, phase=phase),
        batch_size=2,
        max_shards=1,
    )
    layout = [
        0 if problem.graph.tasks[i].name in ("embed", "block.0", "block.1") else 1 for i in range(problem.num_tasks)
    ]
    plan = make_plan(
        problem, [2], [layout], solver="test", status="heuristic", started_at=time.perf_counter(), lower_bound_s=0.0
    )
    path = tmp_path / f"{phase}.yaml"
    save_plan(plan, path)
    return path, plan


def _decoder_report(plan, steps: int = 4) -> dict:
    ranks = []
    for r, device in enumerate(plan.devices_used()):
        names = [t for t, d in plan.assignment.items() if d == device]
        ranks.append(
            {
                "rank": r,
                "device": device,
                "dtype": "float32",
                "tasks": {t: 1e-3 + (steps - 1) * 2e-4 for t in names},
                "task_calls": {t: steps for t in names},
                "prefill_tasks": {t: 1e-3 for t in names},
                "prefill_task_calls": {t: 1 for t in names},
                "transfers": [
                    {"peer": 1 - r, "direction": "recv", "count": steps, "bytes": 256 * steps, "seconds": 1e-4 * steps}
                ],
                "total_s": 0.02,
            }
        )
    ranks[1]["step_end_s"] = [[k, 0.01 + 0.002 * k] for k in range(steps)]
    return {
        "workload": "decoder",
        "objective": "latency",
        "max_new_tokens": steps,
        "measured_s": 0.02,
        "streams": [{"shard": 0, "requests": [0, 1]}],
        "ranks": ranks,
    }


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_decoder_plans_are_compared_with_their_phase_only(tmp_path, phase):
    path, plan = _decoder_plan(tmp_path, phase)
    m = measure_files(path, _decoder_report(plan))
    assert m.workload == "decoder" and m.phase == phase and len(m.tasks) == 7
    if phase == "decode":
        assert [(r.calls, r.measured_s) for r in m.tasks] == [(3, pytest.approx(2e-4))] * 7
        assert m.measured_s == pytest.approx(0.002) and "one decode step" in m.end_to_end_what
        assert [d.measured_busy_s for d in m.devices] == pytest.approx([2e-4 * 3, 2e-4 * 4])
    else:
        assert [(r.calls, r.measured_s) for r in m.tasks] == [(1, pytest.approx(1e-3))] * 7
        assert m.measured_s == pytest.approx(0.01) and "prefill" in m.end_to_end_what
    assert all(r.predicted_s > 0 for r in m.tasks)
    assert [r.predicted_s is None for r in m.links] == [
        False,
        True,
    ]  # 0 -> 1 hidden states; 1 -> 0 next ids: not in the plan
    assert m.predicted_s == plan.objective_s


def test_reports_that_do_not_fit_the_plan_are_refused_naming_the_field(tmp_path):
    path, plan = _decoder_plan(tmp_path, "decode")

    def refused(report, match):
        with pytest.raises(MeasureError, match=match):
            measure_files(path, report)

    good = _decoder_report(plan)
    refused({**good, "max_new_tokens": 1}, "max_new_tokens: 1; a decode-phase plan is compared with decode steps")
    bad = json.loads(json.dumps(good))
    del bad["ranks"][0]["prefill_tasks"]
    refused(bad, r"ranks\[0\].prefill_tasks: missing required field")
    bad = json.loads(json.dumps(good))
    bad["ranks"][1]["step_end_s"] = bad["ranks"][1]["step_end_s"][:2]
    refused(bad, r"step_end_s: expected the end of each of the 4 steps")
    bad = json.loads(json.dumps(good))
    bad["ranks"][0]["device"] = "localhost/cpu-core:3"
    refused(bad, r"ranks\[0\].plan_device: 'localhost/cpu-core:3' is not a device the plan uses")
    bad = json.loads(json.dumps(good))
    bad["ranks"][0]["tasks"]["lm_head"] = 1.0
    refused(bad, r"ranks\[0\].tasks.lm_head: the plan does not put task 'lm_head' on localhost/cpu-core:0")
    bad = json.loads(json.dumps(good))
    bad["ranks"][1]["transfers"][0]["peer"] = 5
    refused(bad, r"ranks\[1\].transfers\[0\].peer: rank 5 is not in the report")
    refused([1, 2], "not a run report")
    report = tmp_path / "broken.json"
    report.write_text("{not json")
    assert cli.main(["measure", str(path), str(report)]) == 2


@pytest.mark.mpi
def test_launch_measure_runs_the_plan_and_writes_the_comparison(tmp_path, capsys):
    from runtime_fixtures import decoder_plan, save_config, tiny_gpt2

    model_dir = save_config(tiny_gpt2(n_layer=2), tmp_path / "gpt2")
    plan = decoder_plan(tmp_path / "plan.yaml", model_dir, [{"embed": 0, "block.1": 1}])
    code = cli.main(
        [
            "launch",
            str(plan),
            "--measure",
            "--max-new-tokens",
            "4",
            "--report",
            str(tmp_path / "run.json"),
            "--workdir",
            str(tmp_path / "w"),
            "--timeout",
            "120",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads((tmp_path / "w" / "measure.json").read_text())
    assert data["predicted_s"] == load_plan(plan).objective_s and data["measured_s"] > 0
    assert {(t["device"], t["task"]) for t in data["tasks"]} == {
        ("localhost/cpu-core:0", "embed"),
        ("localhost/cpu-core:0", "block.0"),
        ("localhost/cpu-core:1", "block.1"),
        ("localhost/cpu-core:1", "final_norm"),
        ("localhost/cpu-core:1", "lm_head"),
    }
    assert all(t["calls"] == 3 and t["measured_s"] > 0 for t in data["tasks"])  # the warm-up runs are not counted
    assert [r["warmup_runs"] for r in json.loads((tmp_path / "run.json").read_text())["ranks"]] == [
        2,
        2,
    ]  # --measure's default
    assert "predicted vs measured" in out and "measurement written to" in out
    assert cli.main(["launch", str(plan), "--measure", "--dry-run"]) == 2


def test_a_rank_listed_twice_is_refused_naming_it(tmp_path, chain):
    """Which of two entries of one rank ran is not known: refused, not one of them silently dropped."""
    cluster, plan = chain
    path = _report(tmp_path, plan, load_cluster(cluster))
    doc = json.loads(path.read_text())
    doc["ranks"].append(copy.deepcopy(doc["ranks"][0]))
    path.write_text(json.dumps(doc))
    with pytest.raises(MeasureError, match=rf"ranks\[{len(doc['ranks']) - 1}\].rank: rank 0 is listed twice"):
        measure_files(plan, path)


def _streamed(doc: dict, batches: int, ends: list[float]) -> dict:
    """A graph run's report as a throughput run of `batches` batches writes it: every call made once a
    batch, and each rank's end of each batch (the latest rank's at `ends`)."""
    doc.update(objective="throughput", batches=batches, pipeline_depth=2)
    for r, rank in enumerate(doc["ranks"]):
        rank["tasks"] = {k: v * batches for k, v in rank["tasks"].items()}
        rank["task_calls"] = {k: v * batches for k, v in rank["task_calls"].items()}
        rank["batch_end_s"] = [[b, t - 0.001 * r] for b, t in enumerate(ends)]
    return doc


def test_a_graph_throughput_run_is_measured_by_the_period_between_its_batch_ends(tmp_path):
    """A throughput run streams batches (llm_planner.runtime.graph_run): its figure is the mean time between
    the ends of the batches that end in the steady state (all but the last `pipeline_depth`), over the batch;
    each task's time is per call over every batch's calls."""
    cluster, graph = write_inputs(tmp_path)
    plan = graph_plan(tmp_path, cluster, graph, LAYOUT, [3, 5], "plan.yaml", objective="throughput")
    path = _report(tmp_path, plan, load_cluster(cluster))
    path.write_text(json.dumps(_streamed(json.loads(path.read_text()), 6, [0.5, 0.7, 0.95, 1.2, 1.3, 1.35])))
    m = measure_files(plan, path)
    assert m.measured_s == pytest.approx((1.2 - 0.5) / 3 / 8)  # batches 0-3 end in the steady state
    assert m.end_to_end_what == (
        "seconds per sample: the steady state's period between batch ends (mean of 3) / 8 samples"
    )
    assert all(row.rel_error == pytest.approx(0.0, abs=1e-9) for row in (*m.tasks, *m.devices))
    doc = json.loads(path.read_text())
    for rank in doc["ranks"]:
        rank["batch_end_s"] = rank["batch_end_s"][:2]
    path.write_text(json.dumps(doc))
    with pytest.raises(MeasureError, match=r"batch_end_s: expected the end of each of the 6 batches, got \[0, 1\]"):
        measure_files(plan, path)
    path.write_text(json.dumps(dict(doc, batches=0)))
    with pytest.raises(MeasureError, match="batches: expected the batches the run ran, an integer >= 1, got 0"):
        measure_files(plan, path)
    path.write_text(json.dumps(dict(doc, pipeline_depth=5)))
    with pytest.raises(MeasureError, match="pipeline_depth: 5 with 6 batches leaves fewer than 2 batch ends"):
        measure_files(plan, path)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda d: d["ranks"][0]["transfers"][0].update(direction="sideways"), "direction: expected send or recv"),
        (lambda d: d.update(objective="throughput"), "objective: the run was of a 'throughput' plan"),
        (lambda d: d.update(wall_s=0), "wall_s: a forward pass takes more than 0 s"),
        (lambda d: d.update(wall_s=1e300), "wall_s: a forward pass takes more than 0 s and at most a day"),
    ],
)
def test_a_report_that_cannot_be_this_plans_run_is_refused(tmp_path, chain, edit, says):
    """Each had been measured as if it were: errors of 0.0% or a nonsense end-to-end figure."""
    cluster, plan = chain
    path = _report(tmp_path, plan, load_cluster(cluster))
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(MeasureError, match=says):
        measure_files(plan, path)
