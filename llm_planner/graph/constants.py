"""What every graph builder shares, below them and below graph.models (which picks a builder):
the decoder phases and granularities, and the bytes of each element type."""

from __future__ import annotations

PHASES = ("decode", "prefill")
GRANULARITIES = ("block", "sublayer")
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
