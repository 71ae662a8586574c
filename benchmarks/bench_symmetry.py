"""Benchmark: symmetry breaking among identical devices and servers, under every criterion.

    .venv/bin/python benchmarks/bench_symmetry.py                 # the GPT-2 row, about a minute
    .venv/bin/python benchmarks/bench_symmetry.py --rows all      # and the GPT-3 175B rows
                                                                  # (30-60 s limits: about 25 minutes)

Each row is `llm-planner compare-symmetry` (the exact MILP and MILP-SPLIT, every
criterion of `--symmetry`) on one instance, with one batch shard so that the
exact MILP's size stays in reach. Writes OUT/<row>/ (compare-symmetry's
symmetry.csv, symmetry.png and printed table), OUT/table.md (one table per row:
objective, bound, gap, solve time, status and branch-and-bound nodes per criterion)
and OUT/meta.json; default OUT: benchmarks/results/symmetry.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import provenance  # benchmarks/provenance.py, beside this script

REPO = Path(__file__).resolve().parents[1]
ROWS = {
    # a smaller GPT where the exact MILP proves optimality under every criterion
    "gpt2-four-gpus-throughput-b8": [
        "--cluster",
        "cluster_specs/four-gpus.yaml",
        "--model",
        "gpt2",
        "--objective",
        "throughput",
        "--batch",
        "8",
        "--time-limit",
        "120",
    ],
    "gpt3-latency-b8": [
        "--cluster",
        "cluster_specs/gpt3-six-servers.yaml",
        "--model",
        "gpt3-175b",
        "--batch",
        "8",
        "--time-limit",
        "30",
    ],
    "gpt3-latency-b32": [
        "--cluster",
        "cluster_specs/gpt3-six-servers.yaml",
        "--model",
        "gpt3-175b",
        "--batch",
        "32",
        "--time-limit",
        "30",
    ],
    "gpt3-throughput-b8": [
        "--cluster",
        "cluster_specs/gpt3-six-servers.yaml",
        "--model",
        "gpt3-175b",
        "--objective",
        "throughput",
        "--batch",
        "8",
        "--time-limit",
        "60",
    ],
}


def _fmt_s(value: str) -> str:
    from llm_planner.fmt import fmt_s

    number = float(value)
    return "-" if math.isnan(number) else fmt_s(number)


def run_row(name: str, out: Path) -> str:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "llm_planner.cli",
        "compare-symmetry",
        *ROWS[name],
        "--max-shards",
        "1",
        "--out-dir",
        str(folder),
    ]
    printed = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    (folder / "table.txt").write_text(printed.stdout.replace(f"{REPO}/", ""))  # no machine paths in the kept files
    with open(folder / "symmetry.csv") as f:
        rows = list(csv.DictReader(f))
    lines = [
        f"`{name}`: `compare-symmetry {' '.join(ROWS[name])} --max-shards 1`",
        "",
        "| solver | criterion | objective | bound | gap | solve time | status | nodes |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        gap = "-" if math.isnan(float(r["gap"])) else f"{100 * float(r['gap']):.2f}%"
        lines.append(
            f"| {r['solver']} | {r['criterion']} | {_fmt_s(r['objective_s'])} | {_fmt_s(r['lower_bound_s'])} | {gap} | "
            f"{_fmt_s(r['time_s'])} | {r['status']} | {r['nodes'] or '-'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", default="gpt2-four-gpus-throughput-b8", help=f"comma-separated, or 'all': {', '.join(ROWS)}"
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "symmetry"))
    args = parser.parse_args()
    facts = provenance.start(sys.argv)
    names = list(ROWS) if args.rows == "all" else args.rows.split(",")
    out = Path(args.out)
    tables = []
    for name in names:
        tables.append(run_row(name, out))
        print(tables[-1] + "\n", flush=True)
    (out / "table.md").write_text("\n\n".join(tables) + "\n")
    provenance.record(out, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
