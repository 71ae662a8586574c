"""DeepEP's low-latency dispatch and combine: the serving model's time against DeepEP's published one.

    .venv/bin/python benchmarks/bench_all2all.py [--out DIR]

Each row of benchmarks/data/deepep_low_latency.yaml (DeepEP's own table: H800 servers of 8, one
400 Gb/s card per GPU, 128 tokens a rank, hidden 7168, top-8, fp8 dispatch, bf16 combine, EP 8
to 256) timed by `llm_planner.cost.dp_attention.deepep_call_s`, the formula the layer kernel of a
group with data-parallel attention charges under `--all2all deepep_low_latency` (docs/serving.md,
"Mixture of experts"): the call's fixed time plus, under uniform routing, the bytes of the pairs
leaving a rank over NVLink inside its server and over its card between servers. The fixed time
`DEEPEP_LL_CALL_S` was fitted on these rows (calibration: the median of measured minus the bytes'
time over the twelve), which the summary line recomputes. Results: benchmarks/results/all2all/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import provenance  # noqa: E402 (benchmarks/provenance.py)

from llm_planner.core.spec_links import LinkSpec  # noqa: E402
from llm_planner.cost.dp_attention import DEEPEP_LL_CALL_S, FP8_SCALE_BYTES, deepep_call_s  # noqa: E402

DATA = REPO / "benchmarks" / "data" / "deepep_low_latency.yaml"
COLUMNS = ("ep", "call", "measured_us", "model_us", "ratio")


def rows(ref: dict) -> list[dict]:
    """Every published call with the model's time for it."""
    h, top_k, tokens, n = ref["hidden_size"], ref["top_k"], ref["tokens_per_rank"], ref["gpus_per_server"]
    nvlink, rdma = LinkSpec(bw_bytes_per_s=ref["nvlink_bytes_per_s"]), LinkSpec(bw_bytes_per_s=ref["rdma_bytes_per_s"])
    out = []
    for row in ref["rows"]:
        k = row["ep"]
        span = (n, rdma) if k > n else None
        for call, pair_bytes in (("dispatch", h * (1 + FP8_SCALE_BYTES)), ("combine", 2 * h)):
            model = deepep_call_s(pair_bytes, top_k, k, tokens, nvlink, span) * 1e6
            measured = row[f"{call}_us"]
            out.append(
                {"ep": k, "call": call, "measured_us": measured, "model_us": round(model, 1), "ratio": model / measured}
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "all2all"))
    args = parser.parse_args()
    facts = provenance.start(sys.argv)
    ref = yaml.safe_load(DATA.read_text())
    table = rows(ref)
    fixed = DEEPEP_LL_CALL_S * 1e6
    fitted = statistics.median(r["measured_us"] - (r["model_us"] - fixed) for r in table)
    ratios = [r["ratio"] for r in table]
    for r in table:
        r["ratio"] = f"{r['ratio']:.2f}"
    print(provenance.markdown_table(COLUMNS, ([r[c] for c in COLUMNS] for r in table)))
    summary = (
        f"fixed time per call: {fixed:.0f} us in the model, {fitted:.1f} us fitted on these rows; "
        f"ratio model / measured {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}"
    )
    print(summary)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    provenance.write_results(args.out, COLUMNS, table, facts)
    with open(Path(args.out) / "table.md", "a") as f:
        f.write(f"\n{summary}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
