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

Each run serves REQUESTS_PER_SLOT x its concurrency requests (at least MIN_REQUESTS). Prints and
writes (RESULTS: benchmarks/results/serve/) the table of measured against predicted tokens/s,
mean TPOT and mean TTFT with predicted / measured, and which judged runs are within 15% on
tokens/s and TPOT; RESULTS/runs/<run>/ keeps each plan and run report (no machine paths), and
meta.json the commit and the load average. A run whose processes (ranks, and the front end of two
replicas) exceed the machine's cores is run and shown but not judged ("oversubscribed"): its ranks
take turns on a core, where the spec gives each its own.

    .venv/bin/python benchmarks/bench_serve.py            # eleven launches, each a few seconds of serving
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
FULL = {"prompt_len": 32, "output_len": 32, "requests_per_slot": 4, "min_requests": 8}
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


def _scrub(directory: Path, scratch: Path) -> None:
    """No machine paths in the kept files."""
    for path in directory.iterdir():
        text = path.read_text()
        path.write_text(text.replace(f"{scratch}/", "<scratch>/").replace(f"{REPO}/", ""))


def launch(run: cases.Run, cluster: str, out: Path, scale: dict, scratch: Path) -> dict:
    """Plan `run` on `cluster`, serve it, keep plan and report under out/runs/<run>/; the report."""
    kept = out / "runs" / run.name
    kept.mkdir(parents=True, exist_ok=True)
    plan = cases.build_plan(
        run, cluster, kept / "plan.yaml", prompt_len=scale["prompt_len"], output_len=scale["output_len"]
    )
    requests = max(scale["min_requests"], scale["requests_per_slot"] * run.concurrency * run.layout.copies)
    args = ["launch", str(plan), "--max-requests", str(requests), "--report", str(kept / "run.json")]
    _cli([*args, "--workdir", str(scratch / run.name)], kept / "log.txt")
    _scrub(kept, scratch)
    return json.loads((kept / "run.json").read_text())


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
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "serve"))
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    facts = {**provenance.start(sys.argv), **scale}
    out = Path(args.out).resolve()
    shutil.rmtree(out / "runs", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        reports = []
        for run in cases.CALIBRATION:
            load = provenance.load_average()
            rows.append(cases.row(run, launch(run, cases.CLUSTER, out, scale, Path(scratch)), load))
            reports.append(out / "runs" / run.name / "run.json")
            print(f"calibration {run.name}: {rows[-1]['tokens_per_s_measured']:.1f} tokens/s", flush=True)
        calibrated = calibrate(reports, out)
        for run in cases.judged_runs(len(os.sched_getaffinity(0))):
            load = provenance.load_average()
            rows.append(cases.row(run, launch(run, calibrated, out, scale, Path(scratch)), load))
            r = rows[-1]
            print(f"{run.name}: tokens/s x{r['tokens_per_s_ratio']:.2f}, TPOT x{r['tpot_s_ratio']:.2f}", flush=True)
    provenance.write_results(out, cases.COLUMNS, rows, facts)
    text = cases.table(rows)
    (out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
