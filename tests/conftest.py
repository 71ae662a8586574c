"""Shared test set-up: offline Hugging Face, paths to the repo's data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests run the same examples every time (a failure in CI reproduces anywhere, and a run's time
# does not depend on which examples it drew) and keep no example database. HYPOTHESIS_PROFILE=explore
# draws new examples each run, for looking for bugs rather than checking.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "cluster_specs"
# the published dnn-partitioning workload files (docs/workloads.md): a checkout named by LLM_PLANNER_WORKLOADS,
# else the copy beside the repository; tests that need them skip when neither is there
WORKLOADS = Path(os.environ.get("LLM_PLANNER_WORKLOADS") or REPO.parent / "shared" / "workloads" / "dnn-partitioning")


@pytest.fixture
def repo() -> Path:
    return REPO


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1][0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def sigint_default() -> None:
    """preexec_fn for a child the test will send SIGINT: a process started in the background
    (`cmd &` in a script, as CI may run the suite) inherits SIGINT ignored, and Python then
    never raises KeyboardInterrupt; the child gets the default disposition back."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
