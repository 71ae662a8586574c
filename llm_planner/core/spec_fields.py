"""Field readers of the cluster spec loader (llm_planner.core.spec): each value is checked where it
is read, and every error names the file, the path of the field and what is wrong."""

from __future__ import annotations

import math
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
            self.fail(f"expected a mapping, got {type(data).__name__}")
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


def as_name(value: Any) -> str:
    """A non-empty string of at most MAX_NAME_CHARS characters."""
    name = as_str(value)
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"{quote(name)} is longer than {MAX_NAME_CHARS} characters, the limit (docs/inputs.md)")
    return name


def as_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def as_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


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


def nonneg_seconds(value: Any) -> float:
    seconds = units.parse_seconds(value)
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"must be >= 0, got {value!r}")
    return seconds
