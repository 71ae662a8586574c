"""Serving plan files: what `plan --objective serving` writes and `show`, `verify` and
`export` read. The format is in docs/plan-format.md ("Serving plans").

Input paths (cluster, profile, and a model.name that is a config.json or its folder) are stored
relative to the plan file's folder, so a plan works from any working directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_planner.core.atomic import write_atomic
from llm_planner.core.fileio import dump_yaml, read_bytes, read_document, read_text
from llm_planner.core.plan_paths import model_paths, plan_folder, resolve_from_plan
from llm_planner.graph.hf_config import config_file_of
from llm_planner.serving.plan_fields import SERVING_FORMAT, SERVING_VERSION, read_plan_fields, upgrade

__all__ = ["SERVING_FORMAT", "SERVING_VERSION"]

_NAME = re.escape(SERVING_FORMAT)
_FORMAT_LINE = re.compile(rf"^format:\s*[\"']?{_NAME}[\"']?\s*$" + rf'|"format"\s*:\s*"{_NAME}"', re.MULTILINE)


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

    @property
    def unrestricted(self) -> dict[str, Any] | None:
        """serving.unrestricted: the best plan found without --exportable (None: planned without it,
        or a version 5 plan, which predates the field)."""
        return self.data["serving"].get("unrestricted")

    def input_path(self, key: str) -> str | None:
        """An input file's path, resolved against the plan file's folder."""
        value = self.data["inputs"].get(key)
        if value is None:
            return None
        if self.path is None or os.path.isabs(value):
            return value
        return str((self.path.parent / value).resolve())


def save_serving_plan(data: dict[str, Any], path: str | Path) -> None:
    """The plan as YAML, or as JSON where the path ends in .json (as placement plans are written)."""
    as_json = Path(path).suffix.lower() == ".json"
    text = json.dumps(data, indent=1, allow_nan=False) + "\n" if as_json else dump_yaml(data, width=160)
    write_atomic(path, text, ServingPlanError)


def is_serving_plan(path: str | Path) -> bool:
    """Whether the file says it is a serving plan: a top-level `format: llm_planner.serving_plan` (YAML)
    or `"format": "llm_planner.serving_plan"` (JSON, compact or indented), wherever it stands after the
    comments. Cheap: the text is searched, not parsed. A file that cannot be read (a FIFO, a device, a
    directory: refused before anything blocks) is not one; the plan's reader then says why."""
    try:
        text = read_bytes(path, ServingPlanError).decode("utf-8", errors="replace")
    except ServingPlanError:
        return False
    return _FORMAT_LINE.search(text) is not None


def load_serving_plan(path: str | Path) -> ServingPlanFile:
    """The plan, every field checked for its type and shape (llm_planner.serving.plan_fields); a
    version-5 plan is read as version 6 (plan_fields.upgrade)."""
    data = upgrade(read_document(path, ServingPlanError, finite=True))
    read_plan_fields(data, str(path), ServingPlanError)
    # a model.name that is a config file or its folder is stored relative to the plan's folder
    data["model"] = model_paths(data["model"], lambda stored: resolve_from_plan(stored, path), plan_folder(path))
    return ServingPlanFile(data=data, path=Path(path))


def input_digest(path: str, key: str) -> str:
    """The sha256 a plan records of an input file, from the file's bytes, before anything parses it:
    the cluster's of its text with newlines as "\\n" (as llm_planner.core.spec.load_cluster hashes it),
    the profile's and the model config's of the raw bytes."""
    if key == "cluster":
        return hashlib.sha256(read_text(path, ServingPlanError).encode()).hexdigest()
    return hashlib.sha256(read_bytes(path, ServingPlanError)).hexdigest()


def checked_input(plan: ServingPlanFile, key: str) -> str | None:
    """The path of input `key` (cluster, profile), resolved against the plan's folder, once its bytes
    have the hash the plan records; ServingPlanError otherwise, naming the plan and the field and
    quoting nothing of the file."""
    path = plan.input_path(key)
    if path is None:
        return None
    _check_digest(plan, f"inputs.{key}_sha256", path, key, plan.data["inputs"][f"{key}_sha256"])
    return path


def checked_model(plan: ServingPlanFile) -> str:
    """The model name, once a config.json it names (a file, or a directory holding one) has the hash
    the plan records (inputs.model_sha256; a preset's name names no file and has no hash)."""
    name, digest = plan.data["model"]["name"], plan.data["inputs"]["model_sha256"]
    config = config_file_of(name)
    if config is None:
        if digest is not None:
            raise ServingPlanError(f"{plan.path}: inputs.model_sha256: a hash, but model.name names no config file")
        return name
    if digest is None:
        raise ServingPlanError(
            f"{plan.path}: inputs.model_sha256: missing; model.name names a config file, whose hash a plan records"
        )
    _check_digest(plan, "inputs.model_sha256", str(config), "model", digest)
    return name


def _check_digest(plan: ServingPlanFile, field: str, path: str, key: str, recorded: str) -> None:
    try:
        digest = input_digest(path, key)
    except ServingPlanError as exc:  # missing, not a regular file, too large, not UTF-8: say which plan named it
        raise ServingPlanError(f"{plan.path}: {field.removesuffix('_sha256')}: {exc}") from None
    if digest != recorded:
        raise ServingPlanError(
            f"{plan.path}: {field}: {path} is not the file the plan was made from (its sha256 differs: the file "
            "changed since, or the plan names another file); it was not read further"
        )
