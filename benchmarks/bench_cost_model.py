"""The roofline against a measured profile, task by task: does each task's byte and FLOP count
hold up, once the spec's efficiency factors are set aside?

For every task key of a profile (`llm-planner profile ... -o profile.yaml`) on every device
kind it measured: the roofline's time (llm_planner.cost.roofline, from the cluster spec) and the
measured median, at each batch size profiled, and their ratio measured / predicted. A task
whose bytes or FLOPs are counted wrong stands out from the others' ratio (the embedding read
as a whole table used to be 50x off); a ratio shared by every task is the spec's
efficiency or overhead, which `llm-planner calibrate` fits.

    .venv/bin/python benchmarks/bench_cost_model.py            # profiles GPT-2 first (PROFILE_ARGS), about a minute
    .venv/bin/python benchmarks/bench_cost_model.py --profile PROFILE.yaml --cluster SPEC.yaml

Writes OUT/table.md (and OUT/profile.yaml when it profiled), OUT/meta.json; default OUT:
benchmarks/results/cost-model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import provenance  # benchmarks/provenance.py, beside this script

from llm_planner.core.fmt import fmt_s
from llm_planner.core.spec import load_cluster
from llm_planner.cost import roofline as cost
from llm_planner.cost.measured import task_key
from llm_planner.cost.profile import load_profile
from llm_planner.graph.models import ModelSpec, build_model_graph

REPO = Path(__file__).resolve().parents[1]


def rows(profile_path: str, cluster_path: str) -> list[tuple[str, str, int, float, float]]:
    """(device kind, task, batch, predicted s, measured s) for every measurement of the profile."""
    profile, cluster = load_profile(profile_path), load_cluster(cluster_path)
    graph = build_model_graph(ModelSpec.from_dict(profile.model))
    out = []
    for kind_name, timings in profile.tasks.items():
        kind = cluster.kind(kind_name)
        for task in graph.tasks:
            timing = timings.get(task_key(graph, task) or "")
            if timing is None or timing.task != task.name:
                continue
            for b, measured in zip(timing.batch_sizes, timing.median_s):
                out.append(
                    (
                        kind_name,
                        task.name,
                        b,
                        cost.estimate_task_time_s(task, kind, graph.meta_dict()["dtype"], b),
                        measured,
                    )
                )
    return out


PROFILE_ARGS = [
    "--model",
    "gpt2",
    "--seq-len",
    "256",
    "--dtype",
    "fp32",
    "--batch-sizes",
    "1,4",
    "--granularity",
    "sublayer",
    "--max-blocks",
    "2",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", help="a profile to compare (default: take one of GPT-2 with PROFILE_ARGS)")
    parser.add_argument(
        "--cluster",
        default=str(REPO / "cluster_specs" / "localhost-2cpu.yaml"),
        help="the cluster spec whose roofline to compare (default: localhost-2cpu)",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "cost-model"))
    args = parser.parse_args()
    facts = provenance.start(sys.argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = args.profile
    if profile is None:
        profile = str(out / "profile.yaml")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "llm_planner.cli.main",
                "profile",
                "--cluster",
                args.cluster,
                *PROFILE_ARGS,
                "-o",
                profile,
            ],
            check=True,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )
    lines = [
        "| device kind | task | batch | roofline | measured | measured / roofline |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for kind, task, b, predicted, measured in rows(profile, args.cluster):
        lines.append(f"| {kind} | {task} | {b} | {fmt_s(predicted)} | {fmt_s(measured)} | {measured / predicted:.2f} |")
    print("\n".join(lines))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    provenance.record(out, facts)


if __name__ == "__main__":
    main()
