"""A device kind and link of round numbers for the kernel model's tests by hand."""

from __future__ import annotations

from llm_planner.core.spec import DeviceKindSpec, LinkSpec

# Round numbers: 100 TFLOP/s and 1 TB/s at efficiency 1, no overheads but a collective's, whose
# bytes move at half the link's bandwidth.
KIND = DeviceKindSpec(
    name="g",
    type="gpu",
    peak_flops=(("fp16", 100e12),),
    mem_bytes=80e9,
    mem_bw_bytes_per_s=1e12,
    compute_efficiency=1.0,
    mem_efficiency=1.0,
    collective_overhead_s=20e-6,
    collective_efficiency=0.5,
)
LINK = LinkSpec(bw_bytes_per_s=100e9, latency_s=1e-6)
