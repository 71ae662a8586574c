"""`launch` stops mpiexec and every rank whatever stops it: SIGTERM and SIGHUP as Ctrl-C (a message, an
"interrupted" report, exit 130), and SIGKILL, which it cannot catch, through the kernel's parent-death
signal to mpiexec (llm_planner.core.procs). Ctrl-C itself: test_runtime_mpi.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import alive, sigint_default
from runtime_fixtures import decoder_plan, save_config, tiny_gpt2
from test_signals import children, wait_gone

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"),
]


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("small")
    model_dir = save_config(tiny_gpt2(n_layer=2), tmp / "gpt2")
    return decoder_plan(tmp / "plan.yaml", model_dir, [{"embed": 0, "block.1": 1}])


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def start_launch(plan: Path, tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """`launch` of a run that lasts minutes (10,000 warm-up passes), once both ranks run: it and its processes."""
    workdir = tmp_path / "w"
    command = [sys.executable, "-m", "llm_planner.cli.main", "launch", str(plan), "--workdir", str(workdir)]
    command += ["--report", str(tmp_path / "run.json"), "--max-new-tokens", "40", "--warmup", "10000"]
    proc = subprocess.Popen(
        [*command, "--prompt-ids", "1,2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )
    deadline = time.monotonic() + 60.0
    while not all((workdir / f"rank{r}.pid").is_file() for r in range(2)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks did not start within 60 s"
        time.sleep(0.1)
    time.sleep(1.0)  # building and warming up
    tree = descendants(proc.pid)  # mpiexec, its proxy and the two ranks
    ranks = [int((workdir / f"rank{r}.pid").read_text().split()[0]) for r in range(2)]
    assert set(ranks) <= set(tree) and len(tree) >= 4 and all(map(alive, tree)), tree
    return proc, tree


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_launch_stops_mpiexec_and_every_rank(small_plan, tmp_path, sig):
    proc, tree = start_launch(small_plan, tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    name = signal.Signals(sig).name
    assert proc.returncode == 130, err
    wait_gone(tree, 30.0)  # a guard against processes left running, not a speed check
    message = " ".join(err.split())
    assert f"interrupted ({name}): mpiexec and every rank were stopped" in message and "Traceback" not in err
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["status"] == "interrupted" and name in report["error"]


def test_mpiexec_and_every_rank_end_within_10_s_of_launch_being_killed(small_plan, tmp_path):
    proc, tree = start_launch(small_plan, tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    wait_gone(tree, 10.0)


def test_a_rank_whose_mpi_proxy_is_killed_ends_within_10_s(small_plan, tmp_path):
    """mpiexec's proxy on a host dies (killed, its host's session torn down): the ranks it started follow it."""
    proc, tree = start_launch(small_plan, tmp_path)
    ranks = [int((tmp_path / "w" / f"rank{r}.pid").read_text().split()[0]) for r in range(2)]
    proxies = [p for p in tree if p not in ranks and set(children(p)) & set(ranks)]
    assert proxies, tree
    for proxy in proxies:
        os.kill(proxy, signal.SIGKILL)
    wait_gone(ranks, 10.0)
    proc.communicate(timeout=60)  # mpiexec notices its proxy's end, and launch reports a failure
    assert proc.returncode != 0
