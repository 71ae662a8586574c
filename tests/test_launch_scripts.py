"""The scripts of launch/ (a plain mpiexec and a Slurm batch script), tried on localhost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_fixtures import REPO, decoder_plan, save_config, tiny_gpt2

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("scripts")
    return decoder_plan(
        tmp / "plan.yaml", save_config(tiny_gpt2(n_layer=2), tmp / "gpt2"), [{"embed": 0, "block.1": 1}]
    )


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", **extra}


def test_mpirun_script_runs_the_plan(plan, tmp_path):
    proc = subprocess.run(
        ["bash", str(REPO / "launch" / "mpirun.sh"), str(plan), str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "w" / "run.json").read_text())
    assert report["status"] == "ok" and len(report["tokens"]) == 1
    assert (tmp_path / "w" / "hostfile").read_text() == "localhost:2\n"


def _fake_slurm(tmp_path: Path, nodes: str) -> dict[str, str]:
    """scontrol on PATH that lists `nodes` as the job's hosts; Hydra forks the ranks here instead of using srun."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\nprintf '{nodes}\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    return _env(
        PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_JOB_NODELIST=nodes, MPIEXEC_LAUNCHER="fork"
    )


def test_slurm_script_runs_the_plan_on_the_allocated_hosts(plan, tmp_path):
    proc = subprocess.run(
        ["bash", str(REPO / "launch" / "slurm.sbatch"), str(plan)],
        capture_output=True,
        text=True,
        timeout=180,
        env=_fake_slurm(tmp_path, "localhost"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "-launcher fork" in proc.stdout
    assert json.loads((tmp_path / "launch" / "plan.7" / "run.json").read_text())["status"] == "ok"


def test_slurm_script_refuses_hosts_the_job_was_not_given(plan, tmp_path):
    proc = subprocess.run(
        ["bash", str(REPO / "launch" / "slurm.sbatch"), str(plan)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_fake_slurm(tmp_path, "node-a"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert (
        "runs on host(s) localhost of its cluster spec, which this job was not given (allocated: node-a)" in proc.stderr
    )


def test_slurm_script_evaluates_nothing_from_the_environment(plan, tmp_path):
    env = _fake_slurm(tmp_path, "localhost")
    env["MPIEXEC_LAUNCHER"] = "fork $(touch pwned-subst); touch pwned"
    proc = subprocess.run(
        ["bash", str(REPO / "launch" / "slurm.sbatch"), str(plan)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "MPIEXEC_LAUNCHER: expected the name of one of Hydra's launchers" in proc.stderr
    assert not list(tmp_path.glob("pwned*"))
