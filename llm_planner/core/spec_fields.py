"""Field readers of the cluster spec loader (llm_planner.core.spec): each value is checked where it
is read, and every error names the file, the path of the field and what is wrong."""

from __future__ import annotations

import math
import re
import string
from typing import Any, Callable

from llm_planner.core import units
from llm_planner.core.fmt import quote
from llm_planner.core.names import hostname_problem


class SpecError(ValueError):
    """A cluster spec that cannot be used; the message names file, field and problem."""


class Reader:
    """Reads one mapping of the YAML document, tracking the field path for errors."""

    def __init__(self, source: str, path: str, data: Any):
        self.source, self.path = source, path
        if not isinstance(data, dict):
            self.fail(
                "expected a mapping, got " + ("nothing (an empty document)" if data is None else type(data).__name__)
            )
        self.data = data
        self.used: set[str] = set()

    def fail(self, what: str, key: str | None = None) -> None:
        where = f"{self.path}.{key}" if key and self.path else (key or self.path or "<top>")
        raise SpecError(f"{self.source}: {where}: {what}")

    def child(self, key: str, data: Any) -> "Reader":
        return Reader(self.source, f"{self.path}.{key}" if self.path else key, data)

    def get(self, key: str, parse: Callable[[Any], Any] | None = None, default: Any = ..., positive: bool = False):
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                self.fail("missing required field", key)
            return default
        value = self.data[key]
        if parse is not None:
            try:
                value = parse(value)
            except (units.UnitError, TypeError, ValueError) as exc:
                self.fail(str(exc), key)
        if positive and not (isinstance(value, (int, float)) and value > 0 and not math.isnan(value)):
            self.fail(f"must be positive, got {self.data[key]!r}", key)
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            self.fail(f"unknown key(s) {', '.join(map(repr, unknown))}")


def as_bool(value: Any) -> bool:
    """A YAML boolean (true or false); a string such as "yes" or a number is refused."""
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


# Cluster, device kind and node names: a device's name is "<node>-<copy>/<kind>:<index>", written
# three times per task in a plan (ir.MAX_TASK_NAME_CHARS has the reason for the limits).
MAX_NAME_CHARS = 64


# Device kind and node names: they make device names ("<node>/<kind>:<index>", where '/' and ':'
# separate the parts) and reach rank tables, hostfiles and command lines (docs/cluster-spec.md).
SAFE_NAME_CHARS = "letters, digits, '-', '_' and '.'"
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def as_name(value: Any) -> str:
    """A non-empty string of at most MAX_NAME_CHARS printable characters (the cluster's name)."""
    name = as_str(value)
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"{quote(name)} is longer than {MAX_NAME_CHARS} characters, the limit (docs/inputs.md)")
    if not name.isprintable():
        raise ValueError(
            f"{quote(name)} holds a character that is not printable (a control character such as a newline or a tab)"
        )
    return name


def as_safe_name(value: Any) -> str:
    """A device kind's or a node's name: as_name, of SAFE_NAME_CHARS only."""
    name = as_name(value)
    if not _SAFE_NAME.fullmatch(name):
        raise ValueError(f"{quote(name)} holds a character other than {SAFE_NAME_CHARS}")
    return name


def as_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return _utf8(value)


def as_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return _utf8(value)


def _utf8(text: str) -> str:
    """`text` if it can be written as UTF-8 (a lone surrogate such as "\\udc80" cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{quote(text)} holds {quote(text[exc.start])} at character {exc.start}, "
            "a lone surrogate that UTF-8 cannot encode"
        ) from None
    return text


def as_hostname(value: Any) -> str:
    """A hostname, where "{i}" (or "{i:02d}", any integer format) stands for the copy index; the
    name for copy 0 must be a host name or an address (hostname_problem); spec.py checks every copy."""
    value = as_str(value)
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        if any(f != "i" for f in fields):
            raise ValueError
        value.format(i=0)
    except (ValueError, KeyError, IndexError):  # a nested field in a format spec, "{i:{w}}", is a KeyError
        raise ValueError(
            f"{quote(value)}: the only placeholder a hostname may hold is {{i}} (the copy index; "
            "write {{ and }} for literal braces)"
        ) from None
    problem = hostname_problem(value.format(i=0))
    if problem is not None:
        raise ValueError(problem + (f" (copy 0 of {quote(value)})" if "{" in value else ""))
    return value


# A fixed time of a device or link (overhead per task or step, a link's latency): far past any real
# one, and small enough that the solvers' arithmetic on times stays exact (1e18 s broke the MILP).
MAX_FIXED_SECONDS = 60.0


def nonneg_seconds(value: Any) -> float:
    seconds = units.parse_seconds(value)
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"must be >= 0, got {value!r}")
    if seconds > MAX_FIXED_SECONDS:
        raise ValueError(
            f"must be at most {MAX_FIXED_SECONDS:g} s (a plausible device or link; docs/inputs.md), got {value!r}"
        )
    return seconds


# The plausible range of a device's figures (docs/inputs.md): far past the largest machines built,
# and small enough that every search over memory (KV-cache slots, concurrency) and time stays finite.
# A spec's number outside it is a typo or an attempt to make a planner loop, and is refused at load.
MAX_MEM_BYTES = 16 * 2.0**50  # 16 PiB on one device
MAX_FLOPS = 1e19  # 10 EFLOP/s on one device
MAX_BANDWIDTH = 1e16  # 10 PB/s: a device's memory or a link
MIN_RATE = 1.0  # 1 FLOP/s, 1 byte/s: the least compute or bandwidth a device or link may have


def _in_range(parse, low: tuple[float, str], high: tuple[float, str]):
    """`parse`, then a positive value checked to lie in [low, high], each (number, as written in
    messages): the plausible range of the field; zero and below are left to "must be positive"."""

    def read(value: Any) -> float:
        number = parse(value)
        if 0 < number < low[0]:
            raise ValueError(f"must be at least {low[1]}, got {value!r}")
        if number > high[0]:
            raise ValueError(f"must be at most {high[1]} (a plausible device; docs/inputs.md), got {value!r}")
        return number

    return read


bandwidth = _in_range(units.parse_bandwidth, (MIN_RATE, "1 byte/s"), (MAX_BANDWIDTH, "10 PB/s"))
flops = _in_range(units.parse_flops, (MIN_RATE, "1 FLOP/s"), (MAX_FLOPS, "10 EFLOP/s"))
mem_bytes = _in_range(units.parse_bytes, (1.0, "1 byte"), (MAX_MEM_BYTES, "16 PiB"))
