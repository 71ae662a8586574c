"""Numbers in readable units for tables and messages."""

from __future__ import annotations


def fmt_s(seconds: float) -> str:
    """Seconds in a readable unit."""
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return str(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds * 1e9:.4g} ns"


def fmt_time(seconds: float, file_units: bool = False) -> str:
    """Seconds in a readable unit; or, for a workload file's times, which state no unit, the plain number."""
    return f"{seconds:.4g}" if file_units else fmt_s(seconds)


def has_file_units(graph) -> bool:
    """Whether the graph's times are a workload file's, in the file's own (unstated) unit."""
    return "workload_format" in graph.meta_dict()


def fmt_bytes(num: float) -> str:
    if num == float("inf"):
        return "unlimited"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num >= scale:
            return f"{num / scale:.3g} {unit}"
    return f"{num:.0f} B"
