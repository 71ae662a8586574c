"""Precision as a plan input: Llama-3 70B at 50 ms in fp16, fp8 and int4-AWQ weights on two mixed fleets.

    .venv/bin/python benchmarks/bench_precision.py [--rows NAME ...] [--time-limit S] [--out DIR]

Each row plans `--objective serving` (prompt 512, output 256 tokens, TPOT target 50 ms) on
`cluster_specs/dgx-a100-l4.yaml` (2 DGX A100 40GB + 4 single-L4 servers) or
`cluster_specs/l40s-h100.yaml` (16 servers of 8 L40S + 4 of 8 H100) in one precision: fp16
throughout; fp8 weights with an fp8 KV cache (W8A8 where the GPU has fp8 tensor cores, weight-only
W8A16 on the A100s: docs/serving.md, "Precision"); int4-AWQ weights (groups of 128) with an fp8 KV
cache. Engineer-best and megatron are scored in the same precision, so each row compares layouts,
and rows of one fleet compare formats (which change quality: the planner never picks one
silently). The table is benchmarks/bench_serving.py's (same columns, every plan verified), written
to benchmarks/results/precision.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench_serving  # noqa: E402 (benchmarks/bench_serving.py, beside this script)

from llm_planner.core.precision import build_precision  # noqa: E402

FORMATS = (
    ("fp16", build_precision("fp16", None, None)),
    ("fp8-w-kv", build_precision("fp16", "fp8", "fp8")),
    ("int4-awq-fp8-kv", build_precision("fp16", "int4-awq", "fp8")),
)
ROWS = [
    (f"llama3-70b/{fleet}/50ms/{label}", fleet, "llama3-70b", 512, 256, 0.05, None, precision)
    for fleet in ("dgx-a100-l4", "l40s-h100")
    for label, precision in FORMATS
]

if __name__ == "__main__":
    sys.exit(bench_serving.main(ROWS, "precision", __doc__.split("\n\n")[0]))
