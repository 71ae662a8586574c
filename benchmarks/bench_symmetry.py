"""Benchmark: symmetry breaking among identical devices and servers, under every criterion.

    .venv/bin/python benchmarks/bench_symmetry.py                 # the GPT-2 row, about a minute
    .venv/bin/python benchmarks/bench_symmetry.py --rows all      # and the GPT-3 175B rows
                                                                  # (30-60 s limits: about 25 minutes)
    .venv/bin/python benchmarks/bench_symmetry.py --rows fleet-gpt-12x4096-throughput-b8 \
        --out benchmarks/results/symmetry-fleet                   # the fleet row (180 s limits: about 15 minutes)

Each row is `llm-planner compare-symmetry` (the exact MILP and MILP-SPLIT, every
criterion of `--symmetry`) on one instance, with one batch shard so that the
exact MILP's size stays in reach. The fleet row (DiviML's case study, an LLM over several
heterogeneous servers) writes its cluster spec and model config into its folder: six servers of
two GPUs, two of each of the H100, A100 and V100 types of `gpt3-six-servers` (their data-sheet
kinds and links, the CPUs not offered), and a GPT of GPT-3 6.7B's width (4,096, 32 heads,
vocabulary 50,257) with 12 blocks. Writes OUT/<row>/ (compare-symmetry's
symmetry.csv, symmetry.png and printed table), OUT/table.md (one table per row:
objective, bound, gap, solve time, status and branch-and-bound nodes per criterion)
and OUT/meta.json; default OUT: benchmarks/results/symmetry.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import provenance  # benchmarks/provenance.py, beside this script
import yaml

REPO = Path(__file__).resolve().parents[1]
FLEET = "fleet-gpt-12x4096-throughput-b8"
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
    FLEET: [
        "--cluster",
        "fleet.yaml",
        "--model",
        "gpt-12x4096",
        "--objective",
        "throughput",
        "--batch",
        "8",
        "--seq-len",
        "128",
        "--max-tp",
        "1",
        "--time-limit",
        "180",
    ],
}


def write_fleet_inputs(folder: Path) -> None:
    """The fleet row's inputs: fleet.yaml (2 servers of 2 GPUs for each GPU type of gpt3-six-servers,
    its kinds and links) and gpt-12x4096/config.json (a GPT-2-style decoder of GPT-3 6.7B's width)."""
    six = yaml.safe_load((REPO / "cluster_specs" / "gpt3-six-servers.yaml").read_text())
    nodes, gpus = [], set()
    for node in six["nodes"]:
        gpu = next(kind for kind in node["devices"] if kind != "xeon-8480")
        gpus.add(gpu)
        links = [link for link in node["links"] if "xeon-8480" not in link["between"]]
        nodes.append({"name": node["name"], "count": 2, "devices": {gpu: 2}, "links": links})
    spec = {
        "name": "gpu-fleet-3x2x2",
        "description": "2x H100, 2x A100, 2x V100 servers of 2 GPUs each (gpt3-six-servers' kinds and links)",
        "device_kinds": [kind for kind in six["device_kinds"] if kind["name"] in gpus],  # catalog kinds name no type
        "nodes": nodes,
        "links": six["links"],
    }
    (folder / "fleet.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    model = folder / "gpt-12x4096"
    model.mkdir(exist_ok=True)
    config = {"model_type": "gpt2", "n_layer": 12, "n_embd": 4096, "n_head": 32, "n_inner": 16384}
    config |= {"n_positions": 2048, "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    (model / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def _fmt_s(value: str) -> str:
    from llm_planner.core.fmt import fmt_s

    number = float(value)
    return "-" if math.isnan(number) else fmt_s(number)


def run_row(name: str, out: Path) -> str:
    folder = (out / name).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    cwd = REPO
    if name == FLEET:
        write_fleet_inputs(folder)
        cwd = folder  # its inputs are in its folder
    argv = [
        sys.executable,
        "-m",
        "llm_planner.cli.main",
        "compare-symmetry",
        *ROWS[name],
        "--max-shards",
        "1",
        "--out-dir",
        str(folder),
    ]
    printed = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    (folder / "table.txt").write_text(printed.stdout.replace(f"{REPO}/", ""))  # no machine paths in the kept files
    with open(folder / "symmetry.csv") as f:
        rows = list(csv.DictReader(f))
    lines = [
        f"`{name}`: `compare-symmetry {' '.join(ROWS[name])} --max-shards 1`",
        "",
        "| solver | criterion | objective | bound | gap | solve time | status | nodes | MILP's status | MILP's bound |",
        "|---|---|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in rows:
        gap = "-" if math.isnan(float(r["gap"])) else f"{100 * float(r['gap']):.2f}%"
        lines.append(
            f"| {r['solver']} | {r['criterion']} | {_fmt_s(r['objective_s'])} | {_fmt_s(r['lower_bound_s'])} | {gap} | "
            f"{_fmt_s(r['time_s'])} | {r['status']} | {r['nodes'] or '-'} | {r.get('solver_status') or '-'} | "
            f"{_fmt_s(r.get('solver_bound_s') or 'nan')} |"
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
