"""Ctrl-C during an exact MILP solve: the incumbent is written with its bound and the status
`interrupted` (exit 130), or, with no plan found yet, nothing is written (exit 130)."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import sigint_default
from plan_files import verify_outcome, write_inputs

from llm_planner.cli.main import main
from llm_planner.mip.backends import BackendResult

STOPPED = BackendResult(
    status="interrupted", values=None, objective=math.nan, dual_bound=-math.inf, nodes=3, backend="highs", time_s=0.5
)


def plan_args(folder, out):
    return [
        "plan",
        "--graph",
        str(folder / "g.json"),
        "--cluster",
        str(folder / "c.yaml"),
        "--solver",
        "milp",
        "--no-baselines",
        "-o",
        str(out),
    ]


@pytest.fixture
def stopped_solver(monkeypatch):
    """The backend returns as if Ctrl-C came before it had a plan of its own; bounds too weak to prove the warm
    start."""
    from llm_planner.placement.bounds import combined
    from llm_planner.placement.milp import milp

    monkeypatch.setattr(milp, "solve_model", lambda *a, **k: STOPPED)
    monkeypatch.setattr(combined, "lower_bound", lambda problem: 0.0)
    return milp


def test_no_plan_yet_exits_130_and_writes_nothing(tmp_path, capsys, monkeypatch, stopped_solver):
    write_inputs(tmp_path)
    monkeypatch.setattr(stopped_solver, "_warm_start_plan", lambda problem: None)
    out = tmp_path / "plan.yaml"
    assert main(plan_args(tmp_path, out)) == 130
    assert not out.exists()
    err = " ".join(capsys.readouterr().err.split())
    assert "before the MILP found any plan: no plan written" in err


def test_the_warm_start_is_kept_when_the_solver_had_nothing_better(tmp_path, stopped_solver):
    write_inputs(tmp_path)
    out = tmp_path / "plan.yaml"
    assert main(plan_args(tmp_path, out)) == 130
    data = yaml.safe_load(out.read_text())
    assert data["solver"]["status"] == "interrupted" and data["solver"]["name"] == "milp"
    assert verify_outcome(out) == (0, [])


@pytest.mark.milp
def test_sigint_during_a_long_milp_writes_the_incumbent_within_2_s(tmp_path, repo):
    # rwnn-ws-4x8 on cpu-two-gpus takes the MILP about 20 s to prove (docs/benchmarks.md)
    out = tmp_path / "plan.yaml"
    cmd = [
        sys.executable,
        "-m",
        "llm_planner.cli.main",
        "-v",
        "plan",
        "--cluster",
        str(repo / "cluster_specs/cpu-two-gpus.yaml"),
        "--model",
        "rwnn-ws-4x8",
        "--solver",
        "milp",
        "--time-limit",
        "120",
        "--threads",
        "1",
        "--no-baselines",
        "-o",
        str(out),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    for line in proc.stderr:  # the model is built and handed to the backend
        if "milp: " in line and "variables" in line:
            break
    time.sleep(2.0)
    assert proc.poll() is None, "the MILP finished before the signal: pick a harder instance"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)  # a guard against a hang: the solve alone runs far longer
    assert proc.returncode == 130, stderr
    data = yaml.safe_load(out.read_text())
    assert data["solver"]["status"] == "interrupted" and 0 < data["lower_bound_s"] <= data["objective_s"]
    assert "interrupted" in stdout and "Traceback" not in stderr
    assert verify_outcome(out) == (0, [])
