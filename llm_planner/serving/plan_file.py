"""Serving plan files: what `plan --objective serving` writes and `show`, `verify` and
`export` read. The format is in docs/plan-format.md ("Serving plans").

Input paths (cluster, profile) are stored relative to the plan file's folder, so a plan works
from any working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llm_planner.core.atomic import write_atomic
from llm_planner.core.fileio import read_document

SERVING_FORMAT = "llm_planner.serving_plan"
SERVING_VERSION = 3


class ServingPlanError(ValueError):
    """A serving plan file that cannot be read; the message names the file and field."""


@dataclass(frozen=True, kw_only=True)
class ServingPlanFile:
    """The plan as plain data (the YAML mapping) and where it lives."""

    data: dict[str, Any]
    path: Path | None = None

    @property
    def serving(self) -> dict[str, Any]:
        return self.data["serving"]

    @property
    def replicas(self) -> list[dict[str, Any]]:
        return self.data["serving"]["replicas"]

    def input_path(self, key: str) -> str | None:
        """An input file's path, resolved against the plan file's folder."""
        value = self.data["inputs"].get(key)
        if value is None:
            return None
        if self.path is None or os.path.isabs(value):
            return value
        return str((self.path.parent / value).resolve())


def relative_to_plan(input_path: str | None, plan_path: str | Path) -> str | None:
    if input_path is None:
        return None
    target = Path(input_path).resolve()
    base = Path(plan_path).resolve().parent
    return os.path.relpath(target, base)


def save_serving_plan(data: dict[str, Any], path: str | Path) -> None:
    write_atomic(path, yaml.safe_dump(data, sort_keys=False, width=160), ServingPlanError)


def is_serving_plan(path: str | Path) -> bool:
    """Whether the file says it is a serving plan (cheap: reads the first lines)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    return SERVING_FORMAT in head.split("\n", 3)[0] or f"format: {SERVING_FORMAT}" in head


_TOP = ("format", "version", "objective", "inputs", "model", "workload", "options", "serving", "baselines")
_SERVING = (
    "tokens_per_s",
    "upper_bound_tokens_per_s",
    "device_prices",
    "gap",
    "status",
    "tpot_s",
    "ttft_s",
    "concurrency",
    "solve_time_s",
    "layouts_evaluated",
    "layouts_candidate",
    "layouts_left",
    "replicas",
)
# Where the planning time went (llm_planner.serving.api): a record, not a figure verify checks;
# plans written before it have none.
_SERVING_OPTIONAL = ("timings_s",)


def load_serving_plan(path: str | Path) -> ServingPlanFile:
    data = read_document(path, ServingPlanError, finite=True)
    where = str(path)
    if not isinstance(data, dict):
        raise ServingPlanError(f"{where}: expected a mapping")
    _keys(where, "", data, _TOP)
    if data["format"] != SERVING_FORMAT or data["version"] != SERVING_VERSION:
        raise ServingPlanError(f"{where}: format: expected {SERVING_FORMAT} version {SERVING_VERSION}")
    if not isinstance(data["serving"], dict):
        raise ServingPlanError(f"{where}: serving: expected a mapping")
    _keys(where, "serving", data["serving"], _SERVING, optional=_SERVING_OPTIONAL)
    _timings(where, data["serving"].get("timings_s"))
    if not isinstance(data["serving"]["replicas"], list):
        raise ServingPlanError(f"{where}: serving.replicas: expected a list")
    for i, rep in enumerate(data["serving"]["replicas"]):
        if not isinstance(rep, dict):
            raise ServingPlanError(f"{where}: serving.replicas[{i}]: expected a mapping")
        _keys(where, f"serving.replicas[{i}]", rep, _REPLICA)
    return ServingPlanFile(data=data, path=Path(path))


_REPLICA = (
    "pattern",
    "count",
    "segments",
    "layers",
    "concurrency",
    "micro_batches",
    "tokens_per_s",
    "tpot_s",
    "ttft_s",
    "round_trip_s",
    "stage_s",
    "mem_bytes",
    "usable_bytes",
    "devices",
)


def _keys(where: str, path: str, data: dict, expected: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    missing = [k for k in expected if k not in data]
    unknown = [k for k in data if k not in expected + optional]
    prefix = f"{path}: " if path else ""
    if missing:
        raise ServingPlanError(f"{where}: {prefix}missing field(s) {', '.join(missing)}")
    if unknown:
        raise ServingPlanError(f"{where}: {prefix}unknown field(s) {', '.join(map(str, unknown))}")


def _timings(where: str, timings: Any) -> None:
    """serving.timings_s, when present: seconds (non-negative numbers) by part name."""
    if timings is None:
        return
    if not isinstance(timings, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
        for k, v in timings.items()
    ):
        raise ServingPlanError(f"{where}: serving.timings_s: expected a mapping of part names to seconds (>= 0)")
