"""The launcher's watch over which of this host's ranks ended first (llm_planner.launch.death_order)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from llm_planner.launch.death_order import DeathOrder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux's")


def _sleepers(workdir, n):
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(n)]
    for rank, proc in enumerate(procs):
        (workdir / f"rank{rank}.pid").write_text(f"{proc.pid} host\n")
    return procs


def _until(check, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while not check() and time.time() < deadline:
        time.sleep(0.02)


def test_the_rank_killed_first_is_named_though_the_others_die_right_after(tmp_path):
    procs = _sleepers(tmp_path, 3)
    deaths = DeathOrder(tmp_path, range(3))
    try:
        _until(deaths.watching_all)
        time.sleep(0.2)  # the pidfds are open and polled
        procs[1].kill()
        procs[1].wait()
        time.sleep(0.3)
        for proc in (procs[0], procs[2]):
            proc.kill()
            proc.wait()
        _until(lambda: deaths.wakes() >= 2)
        assert deaths.first() == 1
    finally:
        deaths.close()


def test_a_rank_that_ended_before_it_was_watched_leaves_the_order_unknown(tmp_path):
    procs = _sleepers(tmp_path, 2)
    for proc in procs:
        proc.kill()
        proc.wait()
    deaths = DeathOrder(tmp_path, range(2))
    try:
        _until(deaths.watching_all)
        assert deaths.first() is None
    finally:
        deaths.close()


def test_ranks_without_pid_files_leave_nothing_named_and_close_returns(tmp_path):
    deaths = DeathOrder(tmp_path, range(2))
    time.sleep(0.1)
    start = time.time()
    deaths.close()
    assert deaths.first() is None and time.time() - start < 1.0
