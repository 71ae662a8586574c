"""Strict reading of plan files' fields (the document itself is parsed by llm_planner.core.fileio, which
refuses bytes that are not UTF-8, a key given twice in one mapping, and documents too large or too deep).

Field by field, reading refuses a value of the wrong type (a string where a number
belongs, a list where a mapping does, a null, a boolean for a number, a
fractional shard size), an infinite or NaN number, a missing field or an
unknown one. Every error is `error(message)`, the caller's class, with a
message that names the file and the field's path (`schedule[3].start_s`).

This module knows nothing of the Plan classes (llm_planner.core.plan builds them).
"""

from __future__ import annotations

import math
import sys
from typing import Any

MISSING = object()


class Fields:
    """Typed reads of one mapping; errors name the file and the field's path."""

    def __init__(self, data: Any, source: str, where: str, error: type[Exception]):
        self.source, self.where, self.error = source, where, error
        if not isinstance(data, dict):
            raise self.fail("", f"expected a mapping, got {_kind(data)}")
        bad = [k for k in data if not isinstance(k, str)]
        if bad:
            raise self.fail("", f"keys must be strings, got {bad[0]!r}")
        self.data: dict[str, Any] = data

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where and key else (self.where or key)

    def fail(self, key: str, message: str) -> Exception:
        where = self.path(key)
        return self.error(f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}")

    def only(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.fail(key, f"unknown field (expected one of {', '.join(allowed)})")

    def get(self, key: str, default: Any = MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if default is MISSING:
            raise self.fail(key, "missing required field")
        return default

    def string(self, key: str, default: Any = MISSING, *, nullable: bool = False) -> str | None:
        value = self.get(key, default)
        if (value is None and nullable) or (value is default and default is not MISSING):
            return value
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string{' or null' if nullable else ''}, got {_kind(value)}")
        return value

    def integer(self, key: str, default: Any = MISSING, *, minimum: int | None = None) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, *, minimum: float | None = None) -> float:
        """A finite int or float (not a boolean, not a string)."""
        return finite_number(self.get(key), self, key, minimum=minimum)

    def mapping(self, key: str, default: Any = MISSING) -> "Fields":
        return Fields(self.get(key, default), self.source, self.path(key), self.error)

    def sequence(self, key: str) -> list[Any]:
        value = self.get(key)
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {_kind(value)}")
        return value

    def item(self, key: str, n: int, value: Any) -> "Fields":
        """The mapping at position n of list `key`."""
        return Fields(value, self.source, f"{self.path(key)}[{n}]", self.error)


def finite_number(value: Any, fields: Fields, key: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = (
            " (a number in quotes, or YAML read it as text: write 1e-3 as 1.0e-3)"
            if isinstance(value, str) and _parses(value)
            else ""
        )
        raise fields.fail(key, f"expected a number, got {_kind(value)}{hint}")
    if isinstance(value, int) and abs(value) > sys.float_info.max:
        raise fields.fail(key, "an integer beyond the range of a float")
    if not math.isfinite(value):
        raise fields.fail(key, f"must be a finite number, got {value}")
    if minimum is not None and value < minimum:
        raise fields.fail(key, f"must be >= {minimum:g}, got {value}")
    return float(value)


def check_finite_tree(value: Any, fields: Fields, key: str, budget: list[int] | None = None) -> None:
    """Every number anywhere in a free-form record (solver.details) is finite; at most 10,000 nodes."""
    budget = budget if budget is not None else [10_000]
    budget[0] -= 1
    if budget[0] < 0:
        raise fields.fail(key, "too large a record (more than 10,000 values)")
    if isinstance(value, float) and not math.isfinite(value):
        raise fields.fail(key, f"must be a finite number, got {value}")
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, child in children:
        check_finite_tree(child, fields, f"{key}.{name}" if isinstance(value, dict) else f"{key}[{name}]", budget)


def _parses(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bool, int, float, str)):
        return f"{type(value).__name__} {value!r}"
    return {"dict": "a mapping", "list": "a list"}.get(type(value).__name__, type(value).__name__)
