"""What every graph builder shares, below them and below graph.models (which picks a builder):
the decoder phases and granularities, the bytes of each element type, and the device types a
task may name (llm_planner.core.spec reads cluster files with the same names)."""

from __future__ import annotations

PHASES = ("decode", "prefill")
GRANULARITIES = ("block", "sublayer")
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # what launch runs
DEVICE_TYPES = ("cpu", "gpu", "accelerator")
