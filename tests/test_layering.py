"""The design's layering: core modules import without torch and without mpi4py."""

from __future__ import annotations

import subprocess
import sys

CORE = [
    "llm_planner.spec",
    "llm_planner.graph.ir",
    "llm_planner.graph.models",
    "llm_planner.cost",
    "llm_planner.solve.problem",
    "llm_planner.solve.schedule",
    "llm_planner.solve.api",
    "llm_planner.plan",
    "llm_planner.pipeline",
    "llm_planner.cli",
]


def test_core_imports_without_torch_or_mpi():
    code = (
        "import sys, importlib\n"
        f"for m in {CORE!r}: importlib.import_module(m)\n"
        "bad = [m for m in ('torch', 'mpi4py', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
