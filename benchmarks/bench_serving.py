"""Serving plans against engineer-best and megatron: tokens/s under a TPOT target.

    .venv/bin/python benchmarks/bench_serving.py [--rows NAME ...] [--time-limit S] [--out DIR]

Each row plans `--objective serving` for one model on one example cluster at one TPOT target
(prompt and output lengths per row) and reports, for the plan and for the two baselines a user
would otherwise write, the output tokens/s, the ratio to engineer-best, the replicas (copies x
layout @ concurrency / micro-batches), the largest TPOT, the largest share of a device's usable
memory in use, and for the plan its upper bound, gap and solve time. Every plan is written to
the results folder and verified (`verify`) before its row is kept.

The Helix rows need Helix's 24-machine cluster imported: set LLM_PLANNER_HELIX to a checkout of
its repository (docs/helix.md); they are skipped otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

from llm_planner.serving.api import plan_serving  # noqa: E402
from llm_planner.serving.context import ServingOptions  # noqa: E402
from llm_planner.serving.plan_file import ServingPlanFile, save_serving_plan  # noqa: E402
from llm_planner.serving.verify import verify_serving_plan  # noqa: E402
from llm_planner.serving.workload import RequestShape, ServingWorkload  # noqa: E402

SPECS = REPO / "cluster_specs"
HELIX_PROMPT, HELIX_OUTPUT = 763, 232  # Azure Conversation means, Helix's offline workload (docs/helix.md)
# (name, cluster, model, prompt, output, TPOT target in s, profile)
ROWS = [
    *[
        (f"gpt3-175b/gpt3-six-servers/{int(t * 1e3)}ms", "gpt3-six-servers", "gpt3-175b", 512, 128, t, None)
        for t in (0.05, 0.1)
    ],
    *[
        (f"llama3-70b/dgx-a100-l4/{int(t * 1e3)}ms", "dgx-a100-l4", "llama3-70b", 512, 256, t, None)
        for t in (0.05, 0.1)
    ],
    *[(f"llama3-70b/h100-a10g/{int(t * 1e3)}ms", "h100-a10g", "llama3-70b", 512, 256, t, None) for t in (0.05, 0.1)],
    *[(f"llama3-8b/four-gpus/{int(t * 1e3)}ms", "four-gpus", "llama3-8b", 512, 256, t, None) for t in (0.05, 0.1)],
    *[
        (f"llama3-8b/cpu-two-gpus/{int(t * 1e3)}ms", "cpu-two-gpus", "llama3-8b", 512, 256, t, None)
        for t in (0.05, 0.1)
    ],
    *[
        (f"llama2-13b/rtx4090-workstation/{int(t * 1e3)}ms", "rtx4090-workstation", "llama2-13b", 512, 256, t, None)
        for t in (0.05, 0.1)
    ],
    *[
        (f"llama2-70b/a100-l4-t4-cloud/{int(t * 1e3)}ms", "a100-l4-t4-cloud", "llama2-70b", 512, 256, t, None)
        for t in (0.2, 1.0)
    ],
    *[
        (f"llama2-70b/helix-cluster24/{t:g}s", "helix:cluster24", "llama2-70b", HELIX_PROMPT, HELIX_OUTPUT, t, "helix")
        for t in (0.5, 1.0)
    ],
]
COLUMNS = (
    "row",
    "planner",
    "tokens_per_s",
    "vs_engineer_best",
    "replicas",
    "tpot_ms",
    "max_mem_share",
    "bound_tokens_per_s",
    "gap",
    "solve_s",
    "total_s",
)


def helix_inputs(out: Path) -> tuple[str, str] | None:
    """Helix's 24-machine cluster and its LLaMA-2 70B profile, imported (None without a checkout)."""
    root = os.environ.get("LLM_PLANNER_HELIX")
    if not root:
        return None
    from llm_planner.cli.main import main as cli

    base = Path(root) / "artifact_evaluation" / "single_cluster" / "config"
    spec, profile = out / "helix-cluster24.yaml", out / "helix-llama2-70b-profile.yaml"
    rc = cli(
        [
            "import",
            "helix",
            "--cluster",
            str(base / "cluster24.ini"),
            "--profiles",
            str(Path(root) / "simulator" / "model_manager" / "llama2_70b"),
            "-o",
            str(spec),
            "--profile-out",
            str(profile),
        ]
    )
    return (str(spec), str(profile)) if rc == 0 else None


def _replicas(replicas: list[dict]) -> str:
    return "; ".join(f"{r['count']} x {r['pattern']} @ {r['concurrency']}/{r['micro_batches']}" for r in replicas)


def run_row(row, out: Path, time_limit: float, helix) -> list[dict]:
    """Plan, verify and tabulate one row: (name, cluster, model, prompt, output, TPOT target, profile)
    and, optionally, the precision (default fp16: benchmarks/bench_precision.py gives others)."""
    name, cluster, model, prompt, output, tpot, profile = row[:7]
    precision = row[7] if len(row) > 7 else "fp16"
    if cluster.startswith("helix:"):
        if helix is None:
            print(f"{name}: skipped (set LLM_PLANNER_HELIX to a Helix checkout)")
            return []
        cluster_path, profile = helix
    else:
        cluster_path = os.path.relpath(SPECS / f"{cluster}.yaml")  # stored relative to the plan, as it was given
    workload = ServingWorkload(requests=(RequestShape(prompt_len=prompt, output_len=output),), tpot_slo_s=tpot)
    path = out / "plans" / (name.replace("/", "_") + ".yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    data = plan_serving(
        cluster_path=cluster_path,
        model=model,
        workload=workload,
        dtype=precision,
        options=ServingOptions(time_limit_s=time_limit),
        output_path=str(path),
        profile_path=profile,
    )
    total_s = time.monotonic() - started
    save_serving_plan(data, path)
    problems = verify_serving_plan(ServingPlanFile(data=data, path=path))
    if problems:
        raise SystemExit(f"{name}: the plan does not verify: {problems[:3]}")
    sv, ref = data["serving"], data["baselines"]["engineer-best"]["tokens_per_s"]
    rows = []
    for planner, fleet in (
        ("engineer-best", data["baselines"]["engineer-best"]),
        ("megatron", data["baselines"]["megatron"]),
        ("serving plan", {"tokens_per_s": sv["tokens_per_s"], "replicas": sv["replicas"]}),
    ):
        reps = fleet["replicas"]
        share = (
            max(
                (r.get("max_mem_fraction") or max(m / u for m, u in zip(r["mem_bytes"], r["usable_bytes"])))
                for r in reps
            )
            if reps
            else float("nan")
        )
        mine = planner == "serving plan"
        rows.append(
            {
                "row": name,
                "planner": planner,
                "tokens_per_s": round(fleet["tokens_per_s"], 1),
                "vs_engineer_best": round(fleet["tokens_per_s"] / ref, 3) if ref else "",
                "replicas": _replicas(reps),
                "tpot_ms": round(max((r["tpot_s"] for r in reps), default=0) * 1e3, 2),
                "max_mem_share": round(share, 3),
                "bound_tokens_per_s": round(sv["upper_bound_tokens_per_s"], 1) if mine else "",
                "gap": f"{sv['gap']:.1%}" if mine else "",
                "solve_s": round(sv["solve_time_s"], 1) if mine else "",
                "total_s": round(total_s, 1) if mine else "",
            }
        )
    return rows


def main(rows_to_run=None, results: str = "serving", description: str | None = None) -> int:
    """Run `rows_to_run` (default ROWS) into benchmarks/results/<results> (or --out)."""
    parser = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", help="only these rows (model/cluster/target)")
    parser.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds of layout search per plan (default: 60)"
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / results))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    facts = provenance.start(sys.argv)
    helix = helix_inputs(out)
    rows = []
    for row in ROWS if rows_to_run is None else rows_to_run:
        if args.rows and row[0] not in args.rows:
            continue
        got = run_row(row, out, args.time_limit, helix)
        for r in got:
            print(
                f"{r['row']:45s} {r['planner']:14s} {r['tokens_per_s']:>10} {r['vs_engineer_best']!s:>6} "
                f"{r['tpot_ms']:>7} ms {r['gap']:>6} {r['solve_s']!s:>6}  {r['replicas']}",
                flush=True,
            )
        rows += got
    provenance.write_results(out, COLUMNS, rows, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
