"""The launcher's watch over which rank of a run on this host died first (llm_planner.launch.death_order)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from llm_planner.launch.death_order import DeathOrder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux's")


def _sleepers(workdir, n, pid_files=None):
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(n)]
    for rank, proc in enumerate(procs):
        if pid_files is None or rank in pid_files:
            (workdir / f"rank{rank}.pid").write_text(f"{proc.pid} host\n")
    return procs


def _until(check, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while not check() and time.time() < deadline:
        time.sleep(0.02)


def _kill(*procs):
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def watch(tmp_path):
    made = []

    def start(ranks):
        made.append(DeathOrder(tmp_path, ranks))
        return made[-1]

    yield start
    for order in made:
        order.close()


def test_the_rank_killed_first_is_named_though_the_others_die_right_after(tmp_path, watch):
    procs = _sleepers(tmp_path, 3)
    deaths = watch(range(3))
    _until(deaths.watching_all)
    time.sleep(0.2)  # the pidfds are open and polled
    _kill(procs[1])
    time.sleep(0.3)
    _kill(procs[0], procs[2])
    _until(deaths.seen)
    assert deaths.first() == 1


def test_ranks_that_ended_their_run_cleanly_are_no_death(tmp_path, watch):
    """A rank writes rank<N>.done as it ends cleanly: its end does not count, the crash after it does."""
    procs = _sleepers(tmp_path, 3)
    deaths = watch(range(3))
    _until(deaths.watching_all)
    time.sleep(0.2)
    for rank in (0, 2):
        (tmp_path / f"rank{rank}.done").write_text("")
    _kill(procs[0], procs[2])
    time.sleep(0.3)
    assert not deaths.seen()
    _kill(procs[1])
    _until(deaths.seen)
    assert deaths.first() == 1


def test_a_death_before_every_rank_is_watched_names_nobody(tmp_path, watch):
    """Rank 1 never wrote its pid file (it may be the one that died): rank 0's end names nobody."""
    procs = _sleepers(tmp_path, 2, pid_files={0})
    deaths = watch(range(2))
    time.sleep(0.3)
    _kill(procs[0])
    _until(deaths.seen)
    assert deaths.first() is None
    _kill(procs[1])


def test_a_rank_that_ended_before_it_was_watched_leaves_the_order_unknown(tmp_path, watch):
    procs = _sleepers(tmp_path, 2)
    _kill(*procs)
    deaths = watch(range(2))
    _until(deaths.watching_all)
    assert deaths.seen() and deaths.first() is None


def test_ranks_without_pid_files_leave_nothing_named_and_close_returns(tmp_path):
    deaths = DeathOrder(tmp_path, range(2))
    time.sleep(0.1)
    start = time.time()
    deaths.close()
    assert deaths.first() is None and time.time() - start < 1.0
