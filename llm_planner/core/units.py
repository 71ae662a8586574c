"""Human units in YAML ("80 GiB", "25 GB/s", "2 us", "312 TFLOP/s"), parsed once.

Decimal prefixes (k, M, G, T, P) are powers of 1000, binary prefixes (Ki, Mi,
Gi, Ti) powers of 1024. Bits ("Gb/s", "Gbit/s") are divided by 8 in a bandwidth; a size is in bytes
only ("80 Gb" of memory is refused: a slip for "80 GB" far more often than a size in bits). A plain
number is taken in the field's base unit (bytes, bytes/s, seconds, FLOP/s). Digits are ASCII.
"""

from __future__ import annotations

import math
import re

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/]*)\s*$", re.ASCII)

# unit family -> accepted base-unit spellings -> multiplier to the base unit
_BASES = {
    "bytes": {"B": 1.0, "byte": 1.0, "bytes": 1.0},
    "bytes_per_s": {"B/s": 1.0, "Bps": 1.0, "b/s": 0.125, "bit/s": 0.125, "bps": 0.125},
    "flops": {"FLOP/s": 1.0, "FLOPS": 1.0, "flops": 1.0, "FLOPs": 1.0, "OP/s": 1.0, "OPS": 1.0},
}


class UnitError(ValueError):
    """A value that cannot be read in the unit its field expects."""


def _split_any(value: object) -> tuple[float, str]:
    if isinstance(value, bool):
        raise UnitError(f"expected a number, got {value!r}")
    if isinstance(value, int) and abs(value) > 2**1023:
        raise UnitError(f"an integer of {len(str(abs(value)))} digits is beyond the range of a float")
    if isinstance(value, (int, float)):
        return float(value), ""
    if not isinstance(value, str):
        raise UnitError(f"expected a number or a string with a unit, got {value!r}")
    match = _PATTERN.match(value)
    if not match:
        raise UnitError(f"cannot read {value!r} as a number with a unit")
    return float(match.group(1)), match.group(2)


def _split(value: object) -> tuple[float, str]:
    number, unit = _split_any(value)
    if not math.isfinite(number):
        raise UnitError(f"{value!r} is not a finite number")
    return number, unit


def _scaled(value: object, family: str) -> float:
    number, unit = _split(value)
    if not unit:
        return number
    for base, base_mult in _BASES[family].items():
        if unit.endswith(base):
            prefix = unit[: -len(base)]
            mult = _BINARY.get(prefix, _DECIMAL.get(prefix))
            if mult is not None:
                return _finite(number * mult * base_mult, value)
    hint = " (a size is in bytes: B, kB, MB, GB, GiB, ...)" if family == "bytes" else ""
    raise UnitError(f"unknown unit {unit!r} in {value!r}{hint}")


def _finite(number: float, value: object) -> float:
    if not math.isfinite(number):
        raise UnitError(f"{value!r} is beyond the range of a float")
    return number


def parse_bytes(value: object) -> float:
    """'80 GiB' -> 85899345920.0; a plain number is bytes."""
    return _scaled(value, "bytes")


def parse_bandwidth(value: object) -> float:
    """'25 GB/s' -> 25e9 bytes/s; '100 Gb/s' -> 12.5e9 bytes/s."""
    return _scaled(value, "bytes_per_s")


def parse_flops(value: object) -> float:
    """'312 TFLOP/s' -> 3.12e14 FLOP/s."""
    return _scaled(value, "flops")


def parse_seconds(value: object) -> float:
    """'2 us' -> 2e-6 s; a plain number is seconds."""
    number, unit = _split(value)
    if not unit:
        return number
    if unit not in _TIME:
        raise UnitError(f"unknown time unit {unit!r} in {value!r} (use s, ms, us or ns)")
    return _finite(number * _TIME[unit], value)


def parse_duration(value: object, low_s: float, high_s: float) -> float:
    """A time a user typed ('50 ms', '0.05 s') from `low_s` to `high_s` seconds. A bare number in
    text is refused, the fix shown ('50': 50 s or 50 ms?); a Python number is seconds."""
    number, unit = _split(value)
    if isinstance(value, str) and not unit:
        raise UnitError(f"{value.strip()!r} has no unit: write '{value.strip()} ms' or '{value.strip()} s'")
    seconds = parse_seconds(value)
    if not low_s <= seconds <= high_s:
        raise UnitError(f"{value!r} is outside {time_text(low_s)} to {time_text(high_s)}")
    return seconds


def time_text(seconds: float) -> str:
    """A time in the largest unit that keeps it at or above 1 ('1 ms', '10 s'), as parse_seconds reads it."""
    for unit in ("s", "ms", "us"):
        if abs(seconds) >= _TIME[unit]:
            return f"{seconds / _TIME[unit]:g} {unit}"
    return f"{seconds / _TIME['ns']:g} ns"


def parse_fraction(value: object) -> float:
    """A plain number in (0, 1], e.g. an efficiency factor."""
    number, unit = _split(value)
    if unit:
        raise UnitError(f"expected a plain number, got {value!r}")
    return number


def is_finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0
