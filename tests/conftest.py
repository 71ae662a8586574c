"""Shared test set-up: offline Hugging Face, paths to the repo's data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "cluster_specs"
WORKLOADS = REPO.parent / "shared" / "workloads" / "dnn-partitioning"


@pytest.fixture
def repo() -> Path:
    return REPO
