"""benchmarks/bench_serve.py without MPI: every run's plan is one `launch` accepts, on the ranks its
layout names, with the model's prediction; the table and its 15% summary from canned run reports;
and README command 1's serving step plans a plan that `launch` accepts."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from llm_planner.cli.main import main
from llm_planner.launch.serve_launch import ServeOptions, prepare_serving
from llm_planner.serving.plan_file import load_serving_plan

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import serve_cases as cases  # noqa: E402 (benchmarks/serve_cases.py)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("run", [*cases.CALIBRATION, *cases.judged_runs(3)], ids=lambda r: r.name)
def test_every_run_plans_what_launch_serves(run, tmp_path):
    plan = cases.build_plan(run, cases.CLUSTER, tmp_path / "plan.yaml", prompt_len=32, output_len=32)
    prepared = prepare_serving(plan, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))
    assert len(prepared.table.ranks) == run.layout.ranks <= 3  # a 2-core machine: at most one rank over
    replicas = prepared.spec.replicas
    records = load_serving_plan(plan).data["serving"]["replicas"]
    assert len(replicas) == len(records) == run.layout.copies
    for spec, score, record in zip(replicas, prepared.scores, records):
        assert [len(s.ranks) for s in spec.stages] == list(run.layout.degrees)
        assert spec.concurrency == run.concurrency and spec.micro_batches == run.layout.micro_batches
        assert sum(s.layers for s in spec.stages) == 8
        assert record["tpot_s"] == pytest.approx(score.ev.tpot_s)  # launch predicts what the plan says


def _replica(
    requests: int, measured: tuple[float, float, float], predicted: tuple[float, float, float], steady=(None, 0)
) -> dict:
    keys = ("tokens_per_s", "tpot_s", "ttft_s")
    return {
        "layout": "localhost/cpu-core: 1 stage x 1 CPU in 1 server",
        "requests_completed": requests,
        "measured": dict(zip(keys, measured)) | dict(zip(("ttft_steady_s", "steady_requests"), steady)),
        "predicted": dict(zip(keys, predicted)),
    }


def test_the_table_from_canned_reports():
    two = {
        "replicas": [
            _replica(3, (100.0, 0.020, 0.050), (110.0, 0.021, 0.040)),
            _replica(1, (80.0, 0.040, 0.1), (110.0, 0.021, 0.040)),
        ],
        "total": {"measured": {"tokens_per_s": 180.0}, "predicted": {"tokens_per_s": 220.0}},
    }
    one = {
        "replicas": [_replica(4, (100.0, 0.020, 0.050), (110.0, 0.022, 0.050), steady=(0.040, 2))],
        "total": {"measured": {"tokens_per_s": 100.0}, "predicted": {"tokens_per_s": 110.0}},
    }
    runs = {r.name: r for r in cases.judged_runs(3)}
    far = cases.row(runs["two-replicas-c2"], [two], 1.5)
    near = cases.row(runs["single-c2"], [one], None)
    assert far["tokens_per_s_ratio"] == pytest.approx(220 / 180)
    assert far["tpot_s_measured"] == pytest.approx((3 * 0.020 + 0.040) / 4)  # weighted by requests
    assert far["tpot_s_ratio"] == pytest.approx(0.021 / 0.025)
    assert far["layout"].endswith(" x2") and far["ranks"] == 2 and not far["within"]
    assert near["within"] and near["tpot_s_ratio"] == pytest.approx(1.1)
    assert near["ttft_steady_s_ratio"] == pytest.approx(0.050 / 0.040) and near["ttft_within"]  # 1.25: within 30%
    assert far["ttft_steady_s_measured"] is None and not far["ttft_within"]  # no steady requests: not judged within
    text = cases.table([cases.row(cases.CALIBRATION[0], [one], 0.2), far, near])
    assert text.count("\n| ") == 3  # one line per row below the header and its rule
    assert "| two-replicas-c2 | judged | 2 | 2 | 1 | 180.0 | 220.0 | 1.22 | 25.00 | 21.00 | 0.84 | 62.5 | - |" in text
    assert (
        "| single-c2 | judged | 1 | 2 | 1 | 100.0 | 110.0 | 1.10 | 20.00 | 22.00 | 1.10 | 50.0 | 40.0 | 50.0 | 1.25 |"
        in text
    )
    assert text.count("| 0% |") == 3 and far["repeats"] == 1 and far["spread"] == 0.0
    assert text.rstrip().endswith(
        "1 of 2 judged runs within 15% on tokens/s and mean TPOT (single-c2); outside: two-replicas-c2. "
        "1 of 2 within 30% on the steady TTFT (single-c2)."
    )


def _readme_serving_steps() -> tuple[list[str], list[str]]:
    """README command 1's last `llm-planner plan` and its `llm-planner launch`, as argv."""
    text = (REPO / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("python3 -m venv") and "launch" in line)
    steps = [shlex.split(part) for part in line.split(" && ")]
    cli = [s[1:] for s in steps if s[0].endswith("/llm-planner")]
    return [s for s in cli if s[0] == "plan"][-1], next(s for s in cli if s[0] == "launch")


def test_readme_serving_step_plans_what_launch_serves(tmp_path):
    plan_argv, launch_argv = _readme_serving_steps()
    assert "cluster_specs/localhost-2cpu.yaml" in plan_argv and "serving" in plan_argv
    out = tmp_path / "serve-plan.yaml"
    plan_argv[plan_argv.index("-o") + 1] = str(out)
    assert main(plan_argv) == 0
    assert launch_argv[1] == "serve-plan.yaml" and "--report" in launch_argv
    prepared = prepare_serving(out, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))
    assert len(prepared.table.ranks) == 2  # one rank per core of a 2-core machine
    assert main(["verify", str(out)]) == 0


def test_runs_with_more_processes_than_cores_are_shown_not_judged():
    """On two cores the three-rank pipeline and the two replicas behind the front end oversubscribe
    them: measured and shown, never counted among the judged runs."""
    roles = {r.name: r.role for r in cases.judged_runs(2)}
    assert roles["tp2-tp1-c4"] == roles["two-replicas-c2"] == "oversubscribed"
    assert roles["single-c2"] == roles["pipeline-c8"] == "judged"
    assert set(cases.judged_runs(3)[i].role for i in range(8)) == {"judged"}
    one = {
        "replicas": [_replica(4, (100.0, 0.020, 0.050), (110.0, 0.022, 0.050), steady=(0.040, 2))],
        "total": {"measured": {"tokens_per_s": 100.0}, "predicted": {"tokens_per_s": 110.0}},
    }
    rows = [cases.row(r, [one], None) for r in cases.judged_runs(2) if r.name in ("single-c2", "tp2-tp1-c4")]
    assert cases.summary(rows) == (
        "1 of 1 judged runs within 15% on tokens/s and mean TPOT (single-c2). "
        "1 of 1 within 30% on the steady TTFT (single-c2). "
        "Not judged, more processes than the machine's cores: tp2-tp1-c4."
    )


def test_a_run_is_judged_on_its_median_repeat():
    """Three repeats of one run: each figure is the median of the repeats', the spread says how far
    apart their tokens/s were, and the calibration reads the repeat of median tokens/s."""

    def report(rate: float, tpot_s: float) -> dict:
        return {
            "replicas": [_replica(4, (rate, tpot_s, 0.05), (100.0, 0.01, 0.05))],
            "total": {"measured": {"tokens_per_s": rate}, "predicted": {"tokens_per_s": 100.0}},
        }

    reports = [report(120.0, 0.010), report(80.0, 0.011), report(100.0, 0.012)]
    assert cases.median_report(reports) is reports[2]  # the one calibrate reads
    r = cases.row(cases.CALIBRATION[0], reports, None)
    assert r["tokens_per_s_measured"] == 100.0 and r["repeats"] == 3 and r["spread"] == pytest.approx(0.4)
    assert r["tpot_s_measured"] == 0.011  # each figure its own median, not the median-rate repeat's
    assert cases.median_report(reports[:2]) is reports[1]  # an even count: the lower middle
