"""Benchmark: served plans measured against the serving model calibrated on this machine.

On cluster_specs/localhost-serve.yaml (three one-core CPU devices) with the small GPT-2 beside it
(cluster_specs/localhost-serve-gpt2: 8 layers, 256 wide, fp32, seeded weights), every request a
32-token prompt and 32 output tokens, closed loop:

1. calibration runs (kept apart from the judged ones): one single-stage replica at concurrency 1
   and 8, a tensor-parallel pair at 4; then
       llm-planner calibrate --serving --cluster cluster_specs/localhost-serve.yaml --dtype fp32 \
           --allow-cpu --max-batched-tokens 64 RUN.json ... -o RESULTS/calibrated.yaml
2. judged runs, each a plan scored on the calibrated spec (so `launch`'s prediction is the
   calibrated model's), launched with `llm-planner launch PLAN --report run.json`: one
   single-stage replica (C 2, 4), a two-stage pipeline with two micro-batches (C 4, 8), a
   tensor-parallel pair feeding one device (C 4, 8; three ranks), two single-stage replicas behind
   the front end (C 2, 4 each).

Each run serves 8 requests per slot of its concurrency (at least 16), `--repeats`
times (default 3): in rounds, each round serving every run of the phase once in turn, so a slow
stretch of this shared machine falls on every run alike rather than on one. Each measured figure
of a run's row is the median of its repeats', with the repeats' spread ((largest - smallest) /
median tokens/s); calibration fits each run's repeat of median tokens/s. Prints and writes
(RESULTS: benchmarks/results/serve/) the table of measured against predicted tokens/s, mean TPOT
and mean TTFT (over every request, and steady: once the opening burst has drained, which the
prediction is judged against) with predicted / measured, which judged runs are within 15% on
tokens/s and TPOT, and which within 30% on the steady TTFT; RESULTS/runs/<run>/ keeps each plan
and each repeat's run report and log (rep1/, ...; no machine paths), and meta.json the commit and
the load average. A run whose processes (ranks, and the front end of two replicas) exceed the
machine's cores is run and shown but not judged ("oversubscribed"): its ranks take turns on a core,
where the spec gives each its own.

    .venv/bin/python benchmarks/bench_serve.py            # 3 x 11 launches, each a few seconds of serving
    .venv/bin/python benchmarks/bench_serve.py --quick    # a smoke run: few requests, 8 output tokens
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import provenance  # benchmarks/provenance.py, beside this script
import serve_cases as cases

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "llm_planner.cli.main"]
FULL = {"prompt_len": 32, "output_len": 32, "requests_per_slot": 8, "min_requests": 16}
QUICK = {"prompt_len": 16, "output_len": 8, "requests_per_slot": 2, "min_requests": 2}


def _cli(args: list[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write(f"$ llm-planner {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run(
            [*CLI, *args], stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    if proc.returncode != 0:
        raise SystemExit(f"llm-planner {args[0]} failed (exit {proc.returncode}); see {log}")


def _scrub_file(path: Path, scratch: Path | None = None) -> None:
    """No machine paths in a kept file."""
    text = path.read_text()
    if scratch is not None:
        text = text.replace(f"{scratch}/", "<scratch>/")
    path.write_text(text.replace(f"{REPO}/", ""))


def plan(run: cases.Run, cluster: str, out: Path, scale: dict) -> Path:
    """`run`'s plan scored on `cluster`, kept as out/runs/<run>/plan.yaml (its machine paths
    scrubbed once every repeat has served it)."""
    kept = out / "runs" / run.name
    kept.mkdir(parents=True, exist_ok=True)
    return cases.build_plan(
        run, cluster, kept / "plan.yaml", prompt_len=scale["prompt_len"], output_len=scale["output_len"]
    )


def launch(run: cases.Run, plan_path: Path, rep: int, scale: dict, scratch: Path) -> dict:
    """Serve `run`'s plan once, keeping its report and log under out/runs/<run>/rep<rep>/; the report."""
    kept = plan_path.parent / f"rep{rep}"
    kept.mkdir(parents=True, exist_ok=True)
    requests = max(scale["min_requests"], scale["requests_per_slot"] * run.concurrency * run.layout.copies)
    args = ["launch", str(plan_path), "--max-requests", str(requests), "--report", str(kept / "run.json")]
    _cli([*args, "--workdir", str(scratch / f"{run.name}-{rep}")], kept / "log.txt")
    for path in kept.iterdir():
        _scrub_file(path, scratch)
    return json.loads((kept / "run.json").read_text())


def serve_all(runs, cluster: str, out: Path, scale: dict, repeats: int, scratch: Path) -> dict[str, list[dict]]:
    """Each run's reports over `repeats` rounds, every round serving each run once in turn (so a slow
    stretch of the machine falls on every run alike)."""
    plans = {run.name: plan(run, cluster, out, scale) for run in runs}
    reports: dict[str, list[dict]] = {run.name: [] for run in runs}
    for rep in range(1, repeats + 1):
        for run in runs:
            reports[run.name].append(launch(run, plans[run.name], rep, scale, scratch))
            rate = reports[run.name][-1]["total"]["measured"]["tokens_per_s"]
            print(f"round {rep}, {run.name}: {rate:.1f} tokens/s", flush=True)
    for path in plans.values():
        _scrub_file(path)
    return reports


def calibrate(reports: list[Path], out: Path) -> str:
    """`calibrate --serving` on the calibration runs' reports; the calibrated spec's path (relative)."""
    target = out / "calibrated.yaml"
    args = ["calibrate", "--serving", "--cluster", cases.CLUSTER, "--dtype", cases.DTYPE, "--allow-cpu"]
    args += ["--max-batched-tokens", str(cases.TOKEN_BUDGET), *map(str, reports), "-o", str(target)]
    _cli(args, out / "calibrate.txt")
    for path in (out / "calibrate.txt", target):  # no machine paths; before any plan hashes the spec
        path.write_text(path.read_text().replace(f"{REPO}/", ""))
    return str(target.relative_to(REPO)) if target.is_relative_to(REPO) else str(target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests, short outputs")
    parser.add_argument("--repeats", type=int, default=3, help="rounds: each run served this many times")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "serve"))
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: at least 1, got {args.repeats}")
    scale = QUICK if args.quick else FULL
    facts = {**provenance.start(sys.argv), **scale, "repeats": args.repeats}
    out = Path(args.out).resolve()
    shutil.rmtree(out / "runs", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibrate.txt").unlink(missing_ok=True)  # the fit's output, written afresh
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        load = provenance.load_average()
        served = serve_all(cases.CALIBRATION, cases.CLUSTER, out, scale, args.repeats, Path(scratch))
        rows += [cases.row(run, served[run.name], load) for run in cases.CALIBRATION]
        medians = [_median_path(out, run, served[run.name]) for run in cases.CALIBRATION]
        calibrated = calibrate(medians, out)
        judged = cases.judged_runs(len(os.sched_getaffinity(0)))
        load = provenance.load_average()
        served = serve_all(judged, calibrated, out, scale, args.repeats, Path(scratch))
        rows += [cases.row(run, served[run.name], load) for run in judged]
    provenance.write_results(out, cases.COLUMNS, rows, facts)
    text = cases.table(rows)
    (out / "table.md").write_text(text)
    print(text)
    return 0


def _median_path(out: Path, run: cases.Run, reports: list[dict]) -> Path:
    """The kept report of `run`'s median repeat."""
    return out / "runs" / run.name / f"rep{reports.index(cases.median_report(reports)) + 1}" / "run.json"


if __name__ == "__main__":
    sys.exit(main())
