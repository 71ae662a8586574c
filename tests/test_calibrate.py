"""Calibration: the fit recovers the factors that made a synthetic run report, and says what it cannot fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from measure_fixtures import chain_graph, graph_plan, graph_report, true_cluster, write_inputs

from llm_planner.cli import main as cli
from llm_planner.core.catalog import DEFAULT_EFFICIENCY
from llm_planner.core.plan import load_plan
from llm_planner.core.spec import load_cluster
from llm_planner.measure.calibrate import CalibrateError, calibrate, calibrate_files, load_run
from llm_planner.measure.observe import MeasureError
from llm_planner.measure.spec_edit import EditError, dump_with_fields, set_fields

N = 12  # tasks of the chain graph
CPU_MEM_EFFICIENCY = DEFAULT_EFFICIENCY["cpu"][1]  # cpu-a's in the spec and in the truth: neither states it
TRUE_KINDS = {
    "cpu-a": {"overhead_s": 50e-6, "compute_efficiency": 0.35, "mem_efficiency": CPU_MEM_EFFICIENCY},
    "gpu-b": {"overhead_s": 12e-6, "compute_efficiency": 0.45, "mem_efficiency": 0.7},
}
TRUE_LINKS = {
    "links.intra_node_default": {"latency_s": 15e-6, "bw_bytes_per_s": 10e9},
    "links.intra_node.0": {"latency_s": 5e-6, "bw_bytes_per_s": 50e9},
}


def _runs(tmp_path, *, noise=0.0, layouts=None):
    """Two runs: shard sizes 2 and (3, 5), tasks cycled over the CPU and both GPUs in both directions."""
    cluster, graph = write_inputs(tmp_path)
    layouts = layouts or [
        ([[(i // 2) % 3 for i in range(N)]], [2]),
        ([[(i // 2 + 1) % 3 for i in range(N)], [(2 - i // 3) % 3 for i in range(N)]], [3, 5]),
    ]
    plans, reports = [], []
    for n, (layout, sizes) in enumerate(layouts):
        plan = graph_plan(tmp_path, cluster, graph, layout, sizes, f"plan{n}.yaml")
        report = tmp_path / f"run{n}.json"
        report.write_text(json.dumps(graph_report(load_plan(plan), chain_graph(), true_cluster(), noise=noise, seed=n)))
        plans.append(str(plan))
        reports.append(str(report))
    return cluster, plans, reports


def _fits(result):
    return {f.name: f for f in (*result.kinds, *result.links)}


def test_noise_free_reports_give_back_the_true_factors_of_every_kind_and_link(tmp_path):
    cluster, plans, reports = _runs(tmp_path)
    fits = _fits(calibrate(load_cluster(cluster), [load_run(p, r) for p, r in zip(plans, reports)]))
    for name, truth in {**TRUE_KINDS, **TRUE_LINKS}.items():
        fit = fits[name]
        assert set(fit.fitted) == set(truth), (name, fit.kept)
        for field, value in truth.items():
            assert fit.values[field] == pytest.approx(value, rel=1e-4), (name, field)
        assert fit.rel_rms_after < 1e-4 < fit.rel_rms_before
    assert fits["cpu-a"].before["compute_efficiency"] == 0.8  # the spec's value, which the fit corrected


def test_noisy_reports_give_the_factors_within_a_few_percent(tmp_path):
    cluster, plans, reports = _runs(tmp_path, noise=0.03)
    fits = _fits(calibrate(load_cluster(cluster), [load_run(p, r) for p, r in zip(plans, reports)]))
    for name, truth in TRUE_KINDS.items():
        for field, value in truth.items():
            assert fits[name].values[field] == pytest.approx(value, rel=0.15), (name, field)
        assert fits[name].values["compute_efficiency"] == pytest.approx(truth["compute_efficiency"], rel=0.05)
    assert fits["links.intra_node_default"].values["bw_bytes_per_s"] == pytest.approx(10e9, rel=0.1)


def test_what_the_runs_cannot_tell_keeps_the_specs_value_with_a_reason(tmp_path):
    # every conv on the GPUs: the CPU runs only memory-bound tasks, so its compute efficiency is unknown
    layout = [[0 if n % 3 else 1 + (i // 3) % 2 for i, n in enumerate(range(N))]]
    cluster, plans, reports = _runs(tmp_path, layouts=[(layout, [2]), (layout, [4])])
    fits = _fits(calibrate(load_cluster(cluster), [load_run(p, r) for p, r in zip(plans, reports)]))
    cpu = fits["cpu-a"]
    assert "compute_efficiency" not in cpu.fitted and cpu.values["compute_efficiency"] == 0.8
    assert "no observation" in cpu.kept["compute_efficiency"]
    assert cpu.values["overhead_s"] == pytest.approx(50e-6, rel=1e-4)
    assert cpu.values["mem_efficiency"] == pytest.approx(CPU_MEM_EFFICIENCY, rel=1e-4)
    spare = fits["spare"]
    assert spare.fitted == () and spare.samples == 0 and spare.values == spare.before
    assert set(spare.kept.values()) == {"no timed task"}


def test_a_fit_needs_more_observations_than_factors(tmp_path):
    cluster, plans, reports = _runs(tmp_path)
    fits = _fits(calibrate(load_cluster(cluster), [load_run(plans[0], reports[0])]))  # one GPU->GPU pair only
    nvlink = fits["links.intra_node.0"]
    assert nvlink.samples == 1 and nvlink.fitted == () and nvlink.values == nvlink.before
    assert set(nvlink.kept.values()) == {"1 observation(s) cannot fit more than 0 factor(s)"}
    default = fits["links.intra_node_default"]  # CPU -> GPU and GPU -> CPU: 2 observations, 1 factor
    assert default.samples == 2 and len(default.fitted) == 1
    assert "2 observation(s) cannot fit more than 1 factor(s)" in default.kept.values()


def test_the_cli_writes_the_corrected_spec_keeping_comments_and_other_fields(tmp_path, capsys):
    cluster, plans, reports = _runs(tmp_path)
    out = tmp_path / "calibrated.yaml"
    argv = ["calibrate", "--cluster", str(cluster), "--output", str(out)]
    for p, r in zip(plans, reports):
        argv += ["--plan", p, "--report", r]
    assert cli.main(argv) == 0
    assert "corrected spec written" in capsys.readouterr().out
    text = out.read_text()
    assert "# A test cluster: comments like this one must survive calibration." in text
    assert "- name: cpu-a   # the host" in text
    assert text.startswith("# Calibrated by `llm-planner calibrate`")
    calibrated, original = load_cluster(out), load_cluster(cluster)
    assert calibrated.kind("gpu-b").compute_efficiency == pytest.approx(0.45, rel=1e-3)
    assert calibrated.kind("cpu-a").mem_efficiency == pytest.approx(
        CPU_MEM_EFFICIENCY, rel=1e-3
    )  # added: the spec left it at its default
    assert calibrated.kind("cpu-a").overhead_s == pytest.approx(50e-6, rel=1e-3)
    assert calibrated.intra_node[0].bw_bytes_per_s == pytest.approx(50e9, rel=1e-3)
    assert calibrated.intra_node_default.latency_s == pytest.approx(15e-6, rel=1e-3)
    assert calibrated.kind("spare") == original.kind("spare")
    assert calibrated.nodes == tuple(n for n in original.nodes)
    assert [k.peak_flops for k in calibrated.device_kinds] == [k.peak_flops for k in original.device_kinds]
    # the same fit from one plan given for both reports is refused only when the pairing is ambiguous
    with pytest.raises(CalibrateError, match="one plan for all reports or one plan per report"):
        calibrate_files(cluster, plans + plans[:1], reports, tmp_path / "x.yaml")


def test_bad_reports_are_refused_naming_the_file_and_field(tmp_path, capsys):
    cluster, plans, reports = _runs(tmp_path)
    data = json.loads(Path(reports[0]).read_text())
    task = next(iter(data["ranks"][1]["task_calls"]))
    data["ranks"][1]["task_calls"][task] = 7
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(
        MeasureError, match=rf"bad.json: ranks\[1\].task_calls.{task}: 7 forward call\(s\), but the plan"
    ):
        load_run(plans[0], bad)
    data["ranks"][1]["tasks"][task] = "fast"
    bad.write_text(json.dumps(data))
    with pytest.raises(MeasureError, match=rf"bad.json: ranks\[1\].tasks.{task}: expected a number >= 0, got 'fast'"):
        load_run(plans[0], bad)
    bad.write_text(json.dumps({"workload": "graph"}))
    code = cli.main(
        [
            "calibrate",
            "--cluster",
            str(cluster),
            "--plan",
            plans[0],
            "--report",
            str(bad),
            "-o",
            str(tmp_path / "o.yaml"),
        ]
    )
    assert code == 2
    assert "bad.json: ranks: missing required field" in " ".join(capsys.readouterr().err.split())
    other = tmp_path / "other.yaml"
    other.write_text(cluster.read_text().replace("{cpu-a: 1, gpu-b: 2, spare: 1}", "{cpu-a: 1, gpu-b: 1}"))
    with pytest.raises(CalibrateError, match="is not in cluster"):
        calibrate(load_cluster(other), [load_run(plans[0], reports[0])])


def test_set_fields_replaces_and_adds_keys_in_block_and_flow_mappings_and_checks_itself():
    text = "# top\na:\n  - name: x   # keep me\n    b: 1\n    c: {d: 2, e: 3}\n  - name: y\n    b: 2\nz: {w: 1}\n"
    out = set_fields(
        text, {("a", 0, "b"): 5, ("a", 0, "new"): "4 us", ("a", 1, "new"): 0.5, ("z", "v"): 2, ("a", 0, "c", "d"): 9}
    )
    assert out == (
        "# top\na:\n  - name: x   # keep me\n    b: 5\n    c: {d: 9, e: 3}\n    new: 4 us\n"
        "  - name: y\n    b: 2\n    new: 0.5\nz: {w: 1, v: 2}\n"
    )
    with pytest.raises(EditError):
        set_fields(text, {("a", 0, "b", "deeper"): 1})
    assert "new: 1" in dump_with_fields(text, {("a", 1, "new"): 1})


def test_measure_and_calibrate_import_without_torch_or_mpi():
    import subprocess
    import sys

    code = (
        "import sys\nimport llm_planner.measure.compare, llm_planner.measure.calibrate\n"
        "import llm_planner.measure.observe, llm_planner.measure.spec_edit\n"
        "import llm_planner.measure.serving_results, llm_planner.measure.serving_fit\n"
        "bad = [m for m in ('torch', 'mpi4py', 'transformers') if m in sys.modules]\nassert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("solver", ["single-device", "megatron"])
def test_calibrations_prediction_is_the_planners_task_time(solver, repo):
    """For GPT-2 (whose embed streams no weights: its table is indexed) placed alone and on
    tensor-parallel groups, calibration's model with the spec's factors predicts each timed call
    as the planner's problem times it."""
    from llm_planner.graph.models import ModelSpec
    from llm_planner.measure.calibrate import RunData, predicted_task_s
    from llm_planner.measure.observe import RunObservations, TaskObservation
    from llm_planner.placement.inputs import problem_from_inputs
    from llm_planner.placement.options import SolveOptions
    from llm_planner.placement.solve import solve

    path = repo / "cluster_specs/four-gpus.yaml"
    problem = problem_from_inputs(
        cluster_path=str(path), model=ModelSpec(name="gpt2"), batch_size=2, max_shards=1, max_tp=4
    )
    plan = solve(problem, SolveOptions(solver=solver))
    calls = ((2, 3), (1, 2))  # 3 calls of 2 samples, 2 of 1
    obs = RunObservations(
        source="synthetic",
        workload="decoder",
        phase="decode",
        passes=1,
        dtype="fp16",
        tasks=tuple(TaskObservation(device=d, task=t, calls=calls, measured_s=1.0) for t, d in plan.assignment.items()),
        unmeasured=(),
        transfers=(),
        end_to_end_s=1.0,
        end_to_end_what="step",
    )
    predicted = predicted_task_s(load_cluster(path), RunData(plan=plan, problem=problem, obs=obs))
    names = problem.device_names
    index = {t.name: i for i, t in enumerate(problem.graph.tasks)}
    groups = 0
    for (device, task), seconds in predicted.items():
        k = names.index(device)
        groups += problem.devices[k].degree > 1
        planner = sum(n * problem.task_time(index[task], k, b) for b, n in calls)
        assert seconds == pytest.approx(planner, rel=1e-12), (device, task)
    assert len(predicted) == len(plan.assignment)
    assert (groups > 0) == (solver == "megatron")
