"""Benchmark: what `launch` measures against what `plan` predicted, with profiled costs.

For each case, RUNS times in a row, the whole pipeline a user runs, with the CLI:

    llm-planner profile --cluster C MODEL --mpi --batch-sizes ... --repetitions 10 -o profile.yaml
    llm-planner plan    --cluster C MODEL --profile profile.yaml [objective, batch] -o plan.yaml
    llm-planner launch  plan.yaml --measure [--max-new-tokens 16] --report run.json

Cases, on cluster_specs/localhost-2cpu.yaml (two one-core CPU devices: one rank per
core of a 2-core machine). GPT-2 124M, seeded weights, fp32, one decode step at
--seq-len 16 (the run generates 16 tokens after an 8-token prompt, contexts 9 to 24,
and compares the mean of its 15 decode steps):

- gpt2-latency-tp: a latency plan on a tensor-parallel group of the two cores (the
  `megatron` layout: every task on the group), batch 1;
- gpt2-latency: the latency plan MILP-SPLIT makes with groups offered, batch 1
  (whatever layout the profile makes fastest);
- gpt2-throughput-b4: the throughput plan at batch 4 (MILP-SPLIT), run in steady
  state (batches in flight, llm_planner.runtime.plan_schedule), seconds per sample.

ResNet-18, seeded weights, fp32, the torch.fx graph:

- resnet18-throughput-b8: the throughput plan at batch 8 in one shard (MILP-SPLIT with
  `--max-shards 1`: a pipeline over the two cores), its batches streamed through the
  stages (llm_planner.runtime.graph_run), seconds per sample over the steady state's
  period between batch ends.

Beside each run's predicted and measured figure, the decoder block as the plan costs it (the
profile's fit at the plan's sub-batch: "@group<k>" on a group, else the single device's) and as
the run executed it (mean seconds per call over the decode steps, over the ranks that run blocks),
or for the CNN the busiest device's work a batch (the plan's `max_load_s`, and the largest rank
compute a batch over the batches streamed: what the period would be with the stages overlapping
perfectly),
and the 1-minute load average before the profile and before the launch: on a shared machine other
processes' work lands in either, so read a run's error with its load beside it. `--max-load L`
waits (at most `--max-wait` seconds) before each run until the load average is below L.

Writes RESULTS/<case>/run<i>/ (profile, plan, run report, measurement, with no
machine paths) and RESULTS/summary.json; prints the markdown table that
docs/benchmarks.md quotes (every run listed).

    .venv/bin/python benchmarks/bench_launch.py                # every case, 3 runs each, about 15 minutes
    .venv/bin/python benchmarks/bench_launch.py --cases gpt2-latency-tp --runs 1
    .venv/bin/python benchmarks/bench_launch.py --max-load 0.5 --runs 5   # at quiet moments of a shared machine
    .venv/bin/python benchmarks/bench_launch.py --retable      # the table again from the kept runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import provenance  # benchmarks/provenance.py, beside this script

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "llm_planner.cli.main"]
GPT2 = ["--model", "gpt2", "--phase", "decode", "--seq-len", "16", "--dtype", "fp32"]
RESNET18 = ["--model", "resnet18", "--dtype", "fp32"]
DECODE = ["--max-new-tokens", "16"]
CASES = {
    "gpt2-latency-tp": {
        "model": GPT2,
        "batch_sizes": "1,2",
        "plan": ["--objective", "latency", "--solver", "megatron"],
        "launch": DECODE,
    },
    "gpt2-latency": {
        "model": GPT2,
        "batch_sizes": "1,2",
        "plan": ["--objective", "latency", "--solver", "milp-split"],
        "launch": DECODE,
    },
    "gpt2-throughput-b4": {
        "model": GPT2,
        "batch_sizes": "1,2,4",
        "plan": ["--objective", "throughput", "--batch", "4", "--solver", "milp-split"],
        "launch": DECODE,
    },
    "resnet18-throughput-b8": {
        "model": RESNET18,
        "batch_sizes": "4,8",
        "plan": ["--objective", "throughput", "--batch", "8", "--max-shards", "1", "--solver", "milp-split"],
        "launch": [],
    },
}


def _cli(args: list[str], log: Path) -> None:
    with open(log, "a") as out:
        proc = subprocess.run(
            [*CLI, *args], stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed (exit {proc.returncode}); see {log}")


def _scrub(directory: Path, scratch: Path) -> None:
    """No machine paths in the kept files."""
    for path in directory.iterdir():
        text = path.read_text()
        path.write_text(text.replace(f"{scratch}/", "<scratch>/").replace(f"{REPO}/", ""))


def _load() -> float | None:
    return provenance.load_average()


def wait_for_quiet(max_load: float | None, max_wait_s: float) -> float | None:
    """Wait until the 1-minute load average is below `max_load` (at most `max_wait_s`); returns the load."""
    deadline = time.monotonic() + max_wait_s
    while max_load is not None and (_load() or 0.0) >= max_load and time.monotonic() < deadline:
        time.sleep(10)
    return _load()


def run_case(name: str, cluster: str, out: Path, scratch: Path) -> dict:
    case, log = CASES[name], out / "log.txt"
    out.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    common = ["--cluster", cluster, *case["model"]]
    load_profile = _load()
    _cli(
        [
            "profile",
            *common,
            "--mpi",
            "--batch-sizes",
            case["batch_sizes"],
            "--repetitions",
            "10",
            "--workdir",
            str(scratch / "profile"),
            "-o",
            str(out / "profile.yaml"),
        ],
        log,
    )
    _cli(["plan", *common, *case["plan"], "--profile", str(out / "profile.yaml"), "-o", str(out / "plan.yaml")], log)
    load = _load()
    _cli(
        [
            "launch",
            str(out / "plan.yaml"),
            "--measure",
            *case["launch"],
            "--report",
            str(out / "run.json"),
            "--workdir",
            str(scratch / "launch"),
        ],
        log,
    )
    shutil.copy(scratch / "launch" / "measure.json", out / "measure.json")
    _scrub(out, scratch)
    return {**_row(name, out, load), "load_before_profile": load_profile, "load_after_launch": _load()}


def block_seconds(plan: dict, profile: dict, run: dict) -> tuple[float | None, float | None]:
    """(the block's time as the plan costs it, as the run executed it) in seconds per call: the profile's fit
    at the first shard's size on the device of block.0 ("@group<k>" on a group of k), and the mean decode-step
    time per call of every block on the ranks that ran blocks (the prompt's prefill left out)."""
    shard = plan["shards"][0]
    device = shard["assignment"]["block.0"]
    degree = len(device) if isinstance(device, list) else 1
    suffix = f"/block@group{degree}" if degree > 1 else "/block"
    kind = next(iter(profile["device_kinds"]))
    timing = next((t for k, t in profile["device_kinds"][kind].items() if k.endswith(suffix)), None)
    profiled = None if timing is None else timing["fixed_s"] + timing["per_sample_s"] * shard["size"]
    seconds = calls = 0.0
    for rank in run["ranks"]:
        for task, total in rank["tasks"].items():
            if task.startswith("block."):
                seconds += total - rank.get("prefill_tasks", {}).get(task, 0.0)
                calls += rank["task_calls"][task] - rank.get("prefill_task_calls", {}).get(task, 0)
    return profiled, (seconds / calls if calls else None)


def work_seconds(plan: dict, run: dict) -> tuple[float, float]:
    """A graph run's busiest device's work a batch: as the plan costs it (`max_load_s`) and as the run did
    it (the largest rank compute over the batches it streamed)."""
    return plan["max_load_s"], max(r["compute_s"] for r in run["ranks"]) / run.get("batches", 1)


def _row(name: str, out: Path, load: float | None) -> dict:
    import yaml

    plan = yaml.safe_load((out / "plan.yaml").read_text())
    run = json.loads((out / "run.json").read_text())
    if run["workload"] == "graph":
        block_profiled, block_measured = work_seconds(plan, run)
    else:
        block_profiled, block_measured = block_seconds(plan, yaml.safe_load((out / "profile.yaml").read_text()), run)
    groups = sorted(
        {d if isinstance(d, str) else "+".join(d) for s in plan["shards"] for d in s["assignment"].values()}
    )
    return {
        "case": name,
        "predicted_s": run["predicted_s"],
        "measured_s": run["measured_s"],
        "unit": run["unit"],
        "error": run["measured_s"] / run["predicted_s"] - 1,
        "what": run["measured_what"],
        "batches": run.get("batches", 1),
        "workload": run["workload"],
        "shards": plan["shards"] and [s["size"] for s in plan["shards"]],
        "devices": groups,
        "solver": plan["solver"]["name"],
        "load_before_launch": load,
        "block_profiled_s": block_profiled,
        "block_measured_s": block_measured,
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def table(rows: list[dict]) -> str:
    lines = [
        "| case | run | plan (solver: shards, devices) | predicted | measured | error "
        "| block or work a batch: profiled | measured | load: profile, launch |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for _i, r in enumerate(rows):
        scale, unit = (1e3, "ms") if r["unit"] == "s" else (1e3, "ms/sample")
        streamed = "streamed" if r.get("workload") == "graph" else "in flight"
        layout = f"{r['solver']}: shards {r['shards']}, {', '.join(r['devices'])}" + (
            f"; {r['batches']} batches {streamed}" if r["batches"] > 1 else ""
        )
        lines.append(
            f"| {r['case']} | {r['run']} | {layout} | {r['predicted_s'] * scale:.2f} {unit} | "
            f"{r['measured_s'] * scale:.2f} {unit} | {100 * r['error']:+.1f}% | "
            f"{_ms(r.get('block_profiled_s'))} | {_ms(r.get('block_measured_s'))} | "
            f"{r.get('load_before_profile')}, {r.get('load_before_launch')} |"
        )
    return "\n".join(lines)


def retable(out: Path) -> int:
    """The table again from the runs kept under `out` (each row's measured figures re-read from its files;
    its loads and times as the run recorded them)."""
    old = json.loads((out / "summary.json").read_text())
    write_results(
        out, [{**r, **_row(r["case"], out / r["case"] / f"run{r['run']}", r["load_before_launch"])} for r in old]
    )
    return 0


def write_results(out: Path, rows: list[dict]) -> None:
    """summary.json and table.md under `out`, and the table printed."""
    (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    print(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cluster", default="cluster_specs/localhost-2cpu.yaml")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "launch"))
    parser.add_argument("--max-load", type=float, default=None, help="wait before each run for a lower load average")
    parser.add_argument("--max-wait", type=float, default=600.0, help="seconds --max-load waits at most per run")
    parser.add_argument(
        "--retable", action="store_true", help="rewrite summary.json and table.md from the kept runs, running nothing"
    )
    args = parser.parse_args()
    if args.retable:
        return retable(Path(args.out))
    facts = provenance.start(sys.argv)
    rows = []
    for name in args.cases.split(","):
        for run in range(1, args.runs + 1):
            wait_for_quiet(args.max_load, args.max_wait)
            with tempfile.TemporaryDirectory() as scratch:
                start = time.perf_counter()
                row = run_case(name, args.cluster, Path(args.out) / name / f"run{run}", Path(scratch))
                rows.append({**row, "run": run, "pipeline_s": time.perf_counter() - start})
                print(f"{name} run {run}: {100 * row['error']:+.1f}%", flush=True)
    provenance.record(args.out, facts)
    write_results(Path(args.out), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
