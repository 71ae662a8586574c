"""Serving plans for fleets of identical servers: 6 to 512 servers, tokens/s, gap and solve time.

    .venv/bin/python benchmarks/bench_fleet.py [--servers 6 24 96 512] [--time-limit S] [--out DIR]

Each fleet has the three server types of `cluster_specs/gpt3-six-servers.yaml` (8x H100, 8x A100
80GB, 8x V100 32GB, one CPU each) plus an L40S server type (8x L40S 48GB on PCIe 4.0, data
sheet figures), in proportion (as near as whole servers allow): 512 servers hold 4,096 GPUs.
The specs are written to the results folder. Each row plans `--objective serving` at a 100 ms
TPOT target (Llama-3 70B: prompt 512, output 256; GPT-3 175B: prompt 512, output 128), checks
the plan with `verify`, and reports the plan's and engineer-best's tokens/s, the bound and gap,
the solve time (the whole `plan_serving` call: baselines, search within --time-limit, bound)
and the time `verify` takes.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

from llm_planner.serving.api import plan_serving  # noqa: E402
from llm_planner.serving.context import ServingOptions  # noqa: E402
from llm_planner.serving.plan_file import ServingPlanFile, save_serving_plan  # noqa: E402
from llm_planner.serving.verify import verify_serving_plan  # noqa: E402
from llm_planner.serving.workload import RequestShape, ServingWorkload  # noqa: E402

# NVIDIA L40S data sheet (2023): FP16 tensor 362 TFLOP/s dense, FP32 91.6; 48 GB GDDR6, 864 GB/s;
# PCIe 4.0 x16 (32 GB/s per direction, about 80% achieved), no NVLink.
L40S = {
    "name": "l40s-48g",
    "type": "gpu",
    "peak_flops": {"fp32": "91.6 TFLOP/s", "fp16": "362 TFLOP/s", "bf16": "362 TFLOP/s"},
    "mem_bytes": "48 GB",
    "mem_bw_bytes_per_s": "864 GB/s",
    "compute_efficiency": 0.6,
    "mem_efficiency": 0.8,
    "overhead_s": "10 us",
}
L40S_SERVER = {
    "name": "l40s-server",
    "hostname": "l40s-{i}",
    "devices": {"xeon-8480": 1, "l40s-48g": 8},
    "links": [
        {"between": ["l40s-48g", "l40s-48g"], "bw_bytes_per_s": "25.6 GB/s", "latency_s": "10 us"},
        {"between": ["xeon-8480", "l40s-48g"], "bw_bytes_per_s": "25.6 GB/s", "latency_s": "10 us"},
    ],
}
MODELS = (("llama3-70b", 512, 256), ("gpt3-175b", 512, 128))
TPOT_S = 0.1
COLUMNS = (
    "servers",
    "gpus",
    "model",
    "tokens_per_s",
    "engineer_best",
    "vs_engineer_best",
    "bound_tokens_per_s",
    "gap",
    "solve_s",
    "verify_s",
    "layouts",
    "replicas",
)


def fleet_spec(servers: int) -> dict:
    """The four server types with `servers` servers in all, in proportion (largest remainders)."""
    data = copy.deepcopy(yaml.safe_load((REPO / "cluster_specs" / "gpt3-six-servers.yaml").read_text()))
    data["name"], data["description"] = f"fleet-{servers}", f"{servers} servers of four types, 8 GPUs each"
    data["device_kinds"].append(copy.deepcopy(L40S))
    data["nodes"].append(copy.deepcopy(L40S_SERVER))
    base, extra = divmod(servers, len(data["nodes"]))
    for i, node in enumerate(data["nodes"]):
        node["count"] = base + (i < extra)
    return data


def run_row(spec: Path, servers: int, model: str, prompt: int, output: int, out: Path, time_limit: float) -> dict:
    workload = ServingWorkload(requests=(RequestShape(prompt_len=prompt, output_len=output),), tpot_slo_s=TPOT_S)
    path = out / "plans" / f"{model}_fleet-{servers}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    data = plan_serving(
        cluster_path=str(spec),
        model=model,
        workload=workload,
        dtype="fp16",
        options=ServingOptions(time_limit_s=time_limit),
        output_path=str(path),
    )
    solve_s = time.monotonic() - started
    save_serving_plan(data, path)
    started = time.monotonic()
    problems = verify_serving_plan(ServingPlanFile(data=data, path=path))
    verify_s = time.monotonic() - started
    if problems:
        raise SystemExit(f"{path}: the plan does not verify: {problems[:3]}")
    sv, ref = data["serving"], data["baselines"]["engineer-best"]["tokens_per_s"]
    return {
        "servers": servers,
        "gpus": 8 * servers,
        "model": model,
        "tokens_per_s": round(sv["tokens_per_s"], 1),
        "engineer_best": round(ref, 1),
        "vs_engineer_best": round(sv["tokens_per_s"] / ref, 3) if ref else "",
        "bound_tokens_per_s": round(sv["upper_bound_tokens_per_s"], 1),
        "gap": f"{sv['gap']:.1%}",
        "solve_s": round(solve_s, 1),
        "verify_s": round(verify_s, 1),
        "layouts": f"{sv['layouts_evaluated']}/{sv['layouts_candidate']}"
        + (f" ({sv['layouts_left']} left)" if sv["layouts_left"] else ""),
        "replicas": "; ".join(f"{r['count']} x {r['pattern']}" for r in sv["replicas"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, nargs="*", default=[6, 24, 96, 512])
    parser.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds of layout search per plan (default: 60)"
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fleet"))
    args = parser.parse_args()
    out = Path(args.out)
    (out / "specs").mkdir(parents=True, exist_ok=True)
    facts = provenance.start(sys.argv)
    rows = []
    for servers in args.servers:
        spec = out / "specs" / f"fleet-{servers}.yaml"
        spec.write_text(yaml.safe_dump(fleet_spec(servers), sort_keys=False))
        for model, prompt, output in MODELS:
            row = run_row(spec, servers, model, prompt, output, out, args.time_limit)
            print("  ".join(f"{row[c]}" for c in COLUMNS), flush=True)
            rows.append(row)
    provenance.write_results(out, COLUMNS, rows, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
