"""Reading JSON and YAML files with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def read_document(path: str | Path, error: type[Exception]) -> Any:
    """Parse a .json file as JSON and anything else as YAML; `error(message)` names the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(f"{path}: not valid JSON: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None
