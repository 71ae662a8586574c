"""Serving ranks' heartbeats (llm_planner.runtime.heartbeat) and what the launcher reads from them
(llm_planner.launch.stall_watch): a rank silent for the stall time, or a scheduler with iterations
in flight and none back for it, stops the run and is named; anything else is left to run."""

from __future__ import annotations

import io
import subprocess
import sys
import time

from llm_planner.launch.stall_watch import StallWatch, watch
from llm_planner.runtime.heartbeat import Heartbeat, parse_beats, without_beats
from llm_planner.runtime.table import RankEntry, RankTable, RunSpec


def _table(n: int = 2) -> RankTable:
    ranks = tuple(
        RankEntry(
            rank=i, device=f"s{i}/gpu:0", node=f"s{i}", hostname=f"h{i}", device_type="gpu", gpu_index=0, tasks={}
        )
        for i in range(n)
    )
    run = RunSpec(plan_path="p.yaml", workload="serving", workdir=".", report_path="run.json", timeout_s=60.0)
    return RankTable(ranks=ranks, run=run)


def _beat(rank: int, progress: int, inflight: int = 0) -> str:
    b = Heartbeat(rank)
    b.progress, b.inflight = progress, inflight
    return b.line() + "\n"


def test_heartbeat_lines_round_trip_and_the_thread_writes_them():
    out = io.StringIO()
    beat = Heartbeat(3, interval_s=0.01, out=out).start()
    beat.progress, beat.inflight = 12, 2
    time.sleep(0.1)
    beat.stop()
    beats = parse_beats(out.getvalue())
    assert beats and beats[-1] == (3, 12, 2)
    assert parse_beats("noise\n" + _beat(1, 5) + "llm_planner.heartbeat rank=2 progr") == [(1, 5, 0)]
    assert without_beats("noise\n" + _beat(1, 5) + "tail\nllm_planner.heartbeat rank=2 progr") == "noise\ntail\n"


def test_a_silent_rank_is_named_after_the_stall_time_and_not_before():
    w = StallWatch(_table(), stall_s=5.0)
    w.feed(_beat(0, 1, 1) + _beat(1, 1), now=0.0)
    w.feed(_beat(0, 2, 1), now=4.0)
    assert w.stalled(4.9) is None
    message, rank = w.stalled(5.5)  # rank 1: last line at 0 s
    assert rank == 1 and message.startswith("rank 1 (s1/gpu:0 on h1) has sent no heartbeat for 6 s")
    assert "--stall-timeout 5 s" in message and "its host no longer reaches the launcher" in message


def test_a_scheduler_with_work_in_flight_and_nothing_back_is_named():
    w = StallWatch(_table(), stall_s=5.0)
    for t in range(8):  # both keep beating; rank 0 waits on one iteration from 1 s on, rank 1 stays idle
        w.feed(_beat(0, min(t, 1), 1) + _beat(1, 0, 0), now=float(t))
    assert w.stalled(6.0) is None  # progress last moved at 1 s
    message, rank = w.stalled(6.5)
    assert rank == 0 and "has had 1 iteration(s) in flight and none back for 6 s" in message
    assert "a rank of its pipeline, or a link between its hosts, is stuck" in message


def test_idle_ranks_lines_cut_short_and_ranks_not_yet_started_are_not_judged():
    w = StallWatch(_table(3), stall_s=2.0)
    line = _beat(0, 7, 0)
    w.feed(line[:10], now=0.0)  # a line cut short waits for its end
    assert w.seen == {}
    w.feed(line[10:] + _beat(1, 3, 0), now=0.5)
    for t in (1.0, 2.0, 2.4):  # nothing in flight, no progress: idle, not stuck; rank 2 never started
        w.feed(_beat(0, 7, 0) + _beat(1, 3, 0), now=t)
    assert w.stalled(3.0) is None and set(w.seen) == {0, 1}


def test_watch_returns_when_the_process_ends_or_its_time_is_up(tmp_path):
    out = tmp_path / "mpiexec.out"
    out.write_text("")
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    assert watch(quick, _table(), out, timeout_s=30.0, stall_s=5.0) == (False, None)
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert watch(slow, _table(), out, timeout_s=0.6, stall_s=None) == (True, None)
        out.write_text(_beat(0, 1, 1))  # one line, then silence: stopped by the stall, not the timeout
        timed_out, stall = watch(slow, _table(), out, timeout_s=20.0, stall_s=1.0)
        assert not timed_out and stall[1] == 0 and "no heartbeat" in stall[0]
    finally:
        slow.kill()
        slow.wait()
