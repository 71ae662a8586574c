"""Running a launch's mpiexec: wait for it, name what failed, stop everything on Ctrl-C.

- mpiexec starts in its own session; its ranks write `rank<N>.pid` into the workdir
  when they start (llm_planner.runtime.rank);
- a rank that raises writes `error.rank<N>.txt` and the job aborts; a rank that
  dies (killed, out of memory) is named from mpiexec's "BAD TERMINATION ... PID p"
  and the pid files: rank, device, host and the signal or exit code;
- past the run's timeout (plus a grace for the ranks' own watchdog), and on Ctrl-C, SIGTERM
  or SIGHUP (KeyboardInterrupt in the launcher: llm_planner.procs), the launcher stops
  mpiexec's process group (SIGTERM, then SIGKILL) and any rank still alive by its pid,
  within STOP_GRACE_S * 2 seconds, then re-raises the interrupt;
- a launcher killed outright (SIGKILL) cannot stop anything: on Linux mpiexec gets SIGTERM
  from the kernel when the launcher dies (a parent-death signal) and stops its ranks, and each
  rank dies with its MPI proxy (llm_planner.runtime.__main__);
- a run that fails writes a report anyway (at the report path: "status": "failed"
  or "interrupted", the error, the failed rank and device), so nothing downstream
  mistakes an old report for this run's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_planner.atomic import WriteError, write_atomic
from llm_planner.procs import last_stop_signal, preexec_die_with_parent, stop_signals_deferred
from llm_planner.runtime.table import RankTable

log = logging.getLogger(__name__)

KILL_GRACE_S = 15.0  # beyond timeout_s: the ranks' own watchdog fires first
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long, each waited this long
_BAD = re.compile(r"PID (\d+) RUNNING AT (\S+)\s*=\s*EXIT CODE: (\d+)")
_STRING = re.compile(r"EXIT STRING: (.+)")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    returncode: int | None
    duration_s: float
    report: dict[str, Any] | None
    error: str | None
    stderr_tail: str


def run_mpiexec(command: tuple[str, ...], table: RankTable, timeout_s: float) -> Outcome:
    """Run the job to its end, its timeout or Ctrl-C; the outcome names the failing rank."""
    workdir = Path(table.run.workdir)
    start = time.perf_counter()
    with open(workdir / "mpiexec.out", "wb") as out, open(workdir / "mpiexec.err", "wb") as err:
        proc = subprocess.Popen(
            command, stdout=out, stderr=err, start_new_session=True, preexec_fn=preexec_die_with_parent()
        )
        try:
            returncode, timed_out = proc.wait(timeout=timeout_s + KILL_GRACE_S), False
        except subprocess.TimeoutExpired:
            stop(proc, table)
            returncode, timed_out = proc.returncode, True
        except KeyboardInterrupt:
            with stop_signals_deferred():  # a second signal must not leave the ranks running
                stop(proc, table)
            why = f"interrupted ({last_stop_signal()}): mpiexec and every rank were stopped"
            write_failure(table, "interrupted", why, None)
            log.warning("%s; report: %s", why, table.run.report_path)
            raise
    duration = time.perf_counter() - start
    tail = _tail(workdir)
    error, failed = _failure(workdir, table, returncode, timed_out, timeout_s, tail)
    report = None
    if error is None and Path(table.run.report_path).is_file():
        report = json.loads(Path(table.run.report_path).read_text())
    elif error is None:
        error = f"the run ended without writing its report {table.run.report_path}:\n{tail}"
    if error is not None:
        write_failure(table, "failed", error, failed)
    return Outcome(returncode=returncode, duration_s=duration, report=report, error=error, stderr_tail=tail)


def _tail(workdir: Path) -> str:
    return "".join((workdir / name).read_text(errors="replace")[-4000:] for name in ("mpiexec.err", "mpiexec.out"))


def _failure(
    workdir: Path, table: RankTable, returncode: int, timed_out: bool, timeout_s: float, tail: str
) -> tuple[str | None, int | None]:
    """(message, failed rank) of a run that failed; (None, None) when it did not."""
    raised = _rank_error(workdir)
    if raised is not None:
        return raised
    if timed_out:
        return f"the run exceeded its timeout of {timeout_s:g} s and was killed", None
    died = _dead_rank(tail, table)
    if died is not None:
        return died
    if returncode != 0:
        return f"mpiexec exited with status {returncode}:\n{tail}", None
    return None, None


def _rank_error(workdir: Path) -> tuple[str, int] | None:
    """The first failing rank's message (its error file's first line)."""
    files = sorted(workdir.glob("error.rank*.txt"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    return files[0].read_text(errors="replace").split("\n\n", 1)[0], int(
        files[0].name[len("error.rank") : -len(".txt")]
    )


def rank_pids(table: RankTable) -> dict[int, int]:
    """pid -> rank, from the pid files the ranks wrote."""
    out = {}
    for entry in table.ranks:
        path = Path(table.run.workdir) / f"rank{entry.rank}.pid"
        try:
            out[int(path.read_text().split()[0])] = entry.rank
        except (OSError, ValueError, IndexError):
            continue
    return out


def _dead_rank(tail: str, table: RankTable) -> tuple[str, int | None] | None:
    """A rank mpiexec saw die ("BAD TERMINATION"), named with its device and how it ended."""
    bad = _BAD.search(tail)
    if bad is None:
        return None
    pid, host, code = int(bad[1]), bad[2], int(bad[3])
    how = _STRING.search(tail)
    ending = how[1].strip() if how else f"exit code {code}"
    rank = rank_pids(table).get(pid)
    who = f"rank {rank} ({table.ranks[rank].device})" if rank is not None else f"a rank (pid {pid})"
    return f"{who} on {host} died: {ending}; mpiexec stopped every other rank", rank


def stop(proc: subprocess.Popen, table: RankTable) -> None:
    """Stop mpiexec's process group, then any rank still alive by its pid (this host's ranks)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=STOP_GRACE_S)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in rank_pids(table):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def write_failure(table: RankTable, status: str, error: str, rank: int | None) -> None:
    """The report of a run that did not finish: what failed, so no old report stands in for it."""
    report: dict[str, Any] = {"status": status, "error": error, "plan": table.run.plan_path}
    if rank is not None:
        report.update(failed_rank=rank, failed_device=table.ranks[rank].device, failed_host=table.ranks[rank].hostname)
    try:
        write_atomic(table.run.report_path, json.dumps(report, indent=1) + "\n")
    except WriteError:
        pass  # the run's own error is what the caller reports
