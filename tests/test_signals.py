"""Every process `plan` starts stops when it stops, whatever the signal: SIGTERM and SIGHUP act as SIGINT,
and children whose parent was killed outright (SIGKILL) end by themselves within 10 s (llm_planner.core.procs).
The `launch` counterparts, which start mpiexec, are in test_runtime_mpi.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SPECS, alive, sigint_default

from llm_planner.core import procs


def children(pid: int) -> list[int]:
    """The children of `pid` (Linux: /proc's list)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_gone(pids: list[int], timeout_s: float) -> float:
    """Seconds until every pid has ended; fails the test past timeout_s naming those still running."""
    start = time.monotonic()
    while any(map(alive, pids)):
        assert time.monotonic() - start < timeout_s, f"still running after {timeout_s} s: {list(filter(alive, pids))}"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_raise_keyboard_interrupt_and_are_restored(sig):
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt):
        with procs.stop_signals_as_interrupt():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler runs at the next bytecode
    assert procs.last_stop_signal() == signal.Signals(sig).name
    assert signal.getsignal(sig) is before


def test_a_stop_signal_calls_the_sigint_handler_in_place(monkeypatch):
    """The MILP's SIGINT handler (cancel the solve, keep the incumbent) serves SIGTERM too."""
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with procs.stop_signals_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [signal.SIGINT]


ORPHAN = """
import os, sys, time
from llm_planner.core import procs
parent = os.getpid()
if os.fork() == 0:
    procs.die_with_parent(parent, kernel={kernel})
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


@pytest.mark.parametrize("kernel", [True, False], ids=["parent-death-signal", "liveness-check"])
def test_a_child_ends_when_its_parent_is_killed(kernel):
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN.format(kernel=kernel)], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    assert alive(child)
    proc.kill()
    proc.wait()
    wait_gone([child], 30.0)  # it would sleep 60 s on its own: ended by the watch, the guard is no speed check


def plan_command(out: Path) -> list[str]:
    # MILP-SPLIT's workers start about 1 s in and work for about 10 s (2 cores)
    return [
        sys.executable,
        "-m",
        "llm_planner.cli.main",
        "plan",
        "--cluster",
        str(SPECS / "four-gpus.yaml"),
        "--model",
        "rwnn-ws-3x32",
        "--solver",
        "milp-split",
        "--workers",
        "2",
        "--no-baselines",
        "-o",
        str(out),
    ]


def start_plan_with_workers(out: Path) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(
        plan_command(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default
    )
    deadline = time.monotonic() + 30.0
    while len(children(proc.pid)) < 2:
        assert proc.poll() is None, f"plan ended before its workers started: {proc.communicate()}"
        assert time.monotonic() < deadline, "MILP-SPLIT started no workers within 30 s"
        time.sleep(0.05)
    time.sleep(0.5)  # the workers are solving subproblems
    workers = children(proc.pid)
    assert proc.poll() is None and all(map(alive, workers))
    return proc, workers


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the workers from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_plan_stops_every_milp_split_worker(tmp_path, sig):
    proc, workers = start_plan_with_workers(tmp_path / "plan.yaml")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)  # a guard against a hang, not a speed check
    assert proc.returncode == 130, err
    wait_gone(workers, 30.0)  # stopped by the planner (a guard against workers left running)
    assert f"interrupted ({signal.Signals(sig).name})" in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "plan.yaml").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the workers from /proc")
def test_milp_split_workers_end_when_plan_is_killed(tmp_path):
    proc, workers = start_plan_with_workers(tmp_path / "plan.yaml")
    proc.kill()
    proc.communicate(timeout=120)
    wait_gone(workers, 30.0)  # a guard against workers left running, not a speed check


def test_a_stopped_pool_leaves_nothing_for_the_exit_hook_to_wake():
    """stop_executor ends the pool's manager thread and takes it out of concurrent.futures' exit
    hook: shutdown drops the executor's own reference to the thread, so it is read before; a hook
    left to wake a manager that is closing its pipe wrote to a closed descriptor at exit."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import process as futures_process

    from llm_planner.placement.split.pool import stop_executor

    executor = ProcessPoolExecutor(max_workers=2)
    assert executor.submit(pow, 2, 10).result() == 1024
    manager = executor._executor_manager_thread
    assert manager in futures_process._threads_wakeups
    stop_executor(executor)
    assert manager not in futures_process._threads_wakeups and not manager.is_alive()
