"""The fields of a device kind as the cluster spec reads them (llm_planner.core.spec), and as the
GPU catalog (llm_planner.core.catalog) reads its entries: one parser per field, so a catalog entry
is exactly what a spec would have written. Every error names the file, the field and what is wrong."""

from __future__ import annotations

import math
from typing import Any, Callable

from llm_planner.core import units
from llm_planner.core.constants import DEVICE_TYPES, DTYPE_BYTES
from llm_planner.core.spec_fields import Reader, as_bool, as_str, bandwidth, flops, mem_bytes, nonneg_seconds

# Names a peak_flops mapping may use: the element types a model can be planned in, and fp64
# (on data sheets, never used). Anything else is a typo that would surface much later.
PRECISIONS = (*DTYPE_BYTES, "fp64")


def _type(c: Reader, key: str) -> str:
    kind_type = c.get(key, as_str)
    if kind_type not in DEVICE_TYPES:
        c.fail(f"must be one of {', '.join(DEVICE_TYPES)}, got {kind_type!r}", key)
    return kind_type


def _peak_flops(c: Reader, key: str) -> tuple[tuple[str, float], ...]:
    raw = c.get(key)
    if not isinstance(raw, dict) or not raw:
        c.fail("expected a mapping of dtype to FLOP/s, e.g. {fp16: 312 TFLOP/s}", key)
    reader = c.child(key, raw)
    for dtype in raw:
        if dtype not in PRECISIONS:
            reader.fail(f"unknown precision {dtype!r} (known: {', '.join(PRECISIONS)})", str(dtype))
    return tuple((str(dtype), reader.get(dtype, flops, positive=True)) for dtype in raw)


def _mem_bytes(c: Reader, key: str) -> float:
    if c.data.get(key) == "unlimited":
        c.used.add(key)
        return math.inf
    return c.get(key, mem_bytes, positive=True)


# The plausible range of a device's ratios (docs/inputs.md): an efficiency or usable share under a
# thousandth, or a slowdown past a hundredfold, is a typo, and priced every time by a factor of 1e300.
MIN_FRACTION = 1e-3
MAX_SLOWDOWN = 100.0


def _fraction(c: Reader, key: str) -> float:
    value = c.get(key, units.parse_fraction, positive=True)
    if not MIN_FRACTION <= value <= 1:
        c.fail(f"must be in [{MIN_FRACTION:g}, 1] (a plausible device; docs/inputs.md), got {value:g}", key)
    return value


def _bandwidth(c: Reader, key: str) -> float:
    return c.get(key, bandwidth, positive=True)


def _seconds(c: Reader, key: str) -> float:
    return c.get(key, nonneg_seconds)


def _factor(c: Reader, key: str) -> float:
    value = c.get(key, units.parse_fraction, positive=True)
    if not 1 <= value <= MAX_SLOWDOWN:
        c.fail(f"must be from 1 to {MAX_SLOWDOWN:g} (a slowdown; docs/inputs.md), got {value:g}", key)
    return value


def _bool(c: Reader, key: str) -> bool:
    return c.get(key, as_bool)


# Every field of a device kind besides its name and catalog, with its reader, in the order a spec
# lists them (docs/cluster-spec.md has each one's meaning, unit and default).
KIND_FIELDS: dict[str, Callable[[Reader, str], Any]] = {
    "type": _type,
    "peak_flops": _peak_flops,
    "mem_bytes": _mem_bytes,
    "mem_bw_bytes_per_s": _bandwidth,
    "compute_efficiency": _fraction,
    "mem_efficiency": _fraction,
    "overhead_s": _seconds,
    "collective_overhead_s": _seconds,
    "collective_efficiency": _fraction,
    "usable_mem_fraction": _fraction,
    "step_overhead_s": _seconds,
    "sequence_overhead_s": _seconds,
    "tensor_parallel": _bool,
    "dequant_factor": _factor,
    "kv_dequant_factor": _factor,
    "w8a8_overhead_s": _seconds,
    "decode_key_s": _seconds,
}
# The fields a kind must have, stated or from its catalog entry.
REQUIRED_KIND_FIELDS = ("type", "peak_flops", "mem_bytes", "mem_bw_bytes_per_s")


def read_kind_fields(c: Reader) -> dict[str, Any]:
    """The kind fields the mapping `c` states, parsed (the rest are left out: a catalog entry or a
    default fills them); keys that are no kind field are left for `c.done()` to refuse."""
    return {key: read(c, key) for key, read in KIND_FIELDS.items() if key in c.data}
