"""Mixture-of-experts serving plans against the layouts their engines document.

    .venv/bin/python benchmarks/bench_moe.py [--rows NAME ...] [--time-limit S] [--out DIR]

Each row plans `--objective serving` for one MoE model: Mixtral-8x7B in fp16 on
`cluster_specs/dgx-a100-l4.yaml` (2 DGX A100 40GB + 4 single-L4 servers; prompt 512, output 128),
and DeepSeek-V3 with its checkpoint's fp8 weights, bf16 activations and an fp8 KV cache on
`cluster_specs/h200-2x8.yaml` (2 servers of 8 H200; prompt and output 1,000), each at 50 and
100 ms TPOT. Engineer-best takes every layout an engineer would write for vLLM or SGLang per class
of identical servers, data-parallel attention with the experts split over a server included (SGLang's
DeepSeek guide: `--enable-dp-attention`); megatron is tensor parallelism over each server (the
guides' plain `--tp 8`). The table is benchmarks/bench_serving.py's (same columns, every plan
verified), written to benchmarks/results/moe.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench_serving  # noqa: E402 (benchmarks/bench_serving.py, beside this script)

from llm_planner.core.precision import build_precision  # noqa: E402

DEEPSEEK_FP8 = build_precision("bf16", "fp8", "fp8")
ROWS = [
    *[
        (f"mixtral-8x7b/dgx-a100-l4/{int(t * 1e3)}ms", "dgx-a100-l4", "mixtral-8x7b", 512, 128, t, None)
        for t in (0.05, 0.1)
    ],
    *[
        (f"deepseek-v3/h200-2x8/{int(t * 1e3)}ms/fp8", "h200-2x8", "deepseek-v3", 1000, 1000, t, None, DEEPSEEK_FP8)
        for t in (0.05, 0.1)
    ],
]

if __name__ == "__main__":
    sys.exit(bench_serving.main(ROWS, "moe", __doc__.split("\n\n")[0]))
