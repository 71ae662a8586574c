"""What a benchmark's results were measured with: written beside them as meta.json.

    record(out_dir, argv)  ->  out_dir/meta.json:
        {"command": "...", "commit": "<HEAD>", "clean": true, "date_utc": "...", "cpus": 2, "load_before": 0.4}

`clean` is false when llm_planner/ or benchmarks/ (results aside) had uncommitted changes: those
results were not measured at `commit`, and benchmarks/make_docs.py says so.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def start(argv: list[str]) -> dict:
    """The facts to record, taken before the benchmark runs (commit, tree, load); argv: sys.argv."""
    script = Path(argv[0]).resolve()
    shown = [".venv/bin/python", str(script.relative_to(REPO)) if script.is_relative_to(REPO) else argv[0], *argv[1:]]
    return {
        "command": shlex.join(shown),
        "commit": _git("rev-parse", "HEAD"),
        "clean": _git("status", "--porcelain", "--", "llm_planner", "benchmarks", ":!benchmarks/results") == "",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_before": load_average(),
    }


def markdown_table(head, rows) -> str:
    """A Markdown table of every benchmark's table.md: the header, its rule, one line per row (str of each cell)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(out_dir: str | Path, columns, rows) -> None:
    """Write results.csv: a header of `columns`, then one line per row (a dict keyed by them)."""
    with open(Path(out_dir) / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_results(out_dir: str | Path, columns, rows: list[dict], facts: dict) -> None:
    """results.csv, table.md (the same rows as a markdown table) and meta.json of one run."""
    write_csv(out_dir, columns, rows)
    (Path(out_dir) / "table.md").write_text(markdown_table(columns, ([r[c] for c in columns] for r in rows)))
    record(out_dir, facts)


def publish(out_dir: str | Path, columns, table: list[list[str]], facts: dict) -> None:
    """Print `table` (rows of cells in `columns` order) as Markdown and write it as write_results does."""
    print(markdown_table(columns, table))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_results(out_dir, columns, [dict(zip(columns, row)) for row in table], facts)


def record(out_dir: str | Path, facts: dict) -> None:
    """Write meta.json: the facts `start` took, and when the run ended."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    facts = {**facts, "ended_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    (out / "meta.json").write_text(json.dumps(facts, indent=1) + "\n")
