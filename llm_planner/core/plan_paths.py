"""Input paths in plan files, so that a plan works from any working directory.

A plan records the files it was made from (the cluster spec, a graph file, a measured profile, a
model's config.json or the directory holding one). `plan` is given them relative to its working
directory; the file stores each relative to the plan file's own folder (`relative_to_plan` says when
an absolute one stays absolute), and every reader (`verify`, `show`, `launch`, `measure`, `calibrate`)
resolves them against that folder; a stored absolute path is read as it is. Nothing here touches the
files: their recorded sha256 is checked where they are read (llm_planner.placement.inputs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def relative_to_plan(input_path: str | None, plan_path: str | Path) -> str | None:
    """`input_path` (absolute, or relative to the working directory) as the plan file at `plan_path`
    stores it, for every kind of plan (placement, serving): the rule that keeps a plan valid when its
    folder moves together with its inputs.

    A path given relative is stored relative to the plan's folder. A path given absolute is stored
    relative too when it lies in the plan's folder or a sibling tree (under the folder that holds the
    plan's folder: `out/plan.yaml` beside `specs/c.yaml`), so the two move together; anywhere else
    (`/opt/models/...` for a plan in a work folder) it stays absolute, so the plan still finds it when
    the plan alone moves, and no plan stores a climb to the filesystem's root (`../../../../opt/...`)."""
    if input_path is None:
        return None
    folder = plan_folder(plan_path)
    target = os.path.abspath(input_path)
    if os.path.isabs(input_path) and not _under(target, os.path.dirname(folder)):
        return input_path
    return os.path.relpath(target, folder)


def _under(path: str, folder: str) -> bool:
    """Whether `path` lies in `folder` or below it; never for the filesystem's root as `folder`."""
    if os.path.dirname(folder) == folder:
        return False
    return os.path.commonpath([path, folder]) == folder


def resolve_from_plan(stored: str | None, plan_path: str | Path) -> str | None:
    """A path as the plan file at `plan_path` stores it, as a path that works from any working directory:
    joined to the plan's folder, unless absolute."""
    if stored is None or os.path.isabs(stored):
        return stored
    return os.path.normpath(os.path.join(plan_folder(plan_path), stored))


def model_paths(model: dict[str, Any], convert: Callable[[str], str | None], folder: str | Path) -> dict[str, Any]:
    """The recorded model (ModelSpec fields, or {"graph": path}) with its paths passed through `convert`: a
    graph file, and a model name that names a config.json or a directory holding one, as
    llm_planner.graph.hf_config.named_config reads it with `folder` as the working directory (a name
    that is neither, like a preset's, is left alone)."""
    out = dict(model)
    if isinstance(out.get("graph"), str):
        out["graph"] = convert(out["graph"])
    name = out.get("name")
    if isinstance(name, str) and name and (name.endswith(".json") or _is_dir(Path(folder, name))):
        out["name"] = convert(name)
    return out


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a name too long for a path, or not one at all: no directory
        return False


def plan_folder(plan_path: str | Path) -> str:
    """The folder of the plan file, links followed (a plan read through a link to it resolves its inputs
    where the file is); its relative input paths start there."""
    return os.path.dirname(os.path.realpath(plan_path))
