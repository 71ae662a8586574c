"""Running a launch's mpiexec: wait for it, name what failed, stop everything on Ctrl-C.

- mpiexec starts in its own session; its ranks write `rank<N>.pid` into the workdir
  when they start (llm_planner.runtime.rank);
- a rank that raises writes `error.rank<N>.txt` and the job aborts; a rank that
  dies (killed, out of memory) is named with its device, host and the signal or exit
  code: on a run of this host alone, the rank whose process the kernel saw end first
  (llm_planner.launch.death_order), since mpiexec's "BAD TERMINATION ... PID p" is often
  a rank its own clean-up killed; across hosts, mpiexec's PID and the pid files;
- when the serving ranks' heartbeats show a rank stopped or a replica stuck for `stall_s`
  (llm_planner.launch.stall_watch), the launcher stops the job at once and names the rank;
- past the run's timeout (plus a grace for the ranks' own watchdog), and on Ctrl-C, SIGTERM
  or SIGHUP (KeyboardInterrupt in the launcher: llm_planner.core.procs), the launcher stops
  mpiexec's process group (SIGTERM, then SIGKILL) and any rank still alive by its pid,
  within STOP_GRACE_S * 2 seconds, then re-raises the interrupt;
- a launcher killed outright (SIGKILL) cannot stop anything: on Linux mpiexec gets SIGTERM
  from the kernel when the launcher dies (a parent-death signal) and stops its ranks, and each
  rank dies with its MPI proxy (llm_planner.runtime.__main__);
- a run that fails writes a report anyway (at the report path: "status": "failed"
  or "interrupted", the error, the failed rank and device), so nothing downstream
  mistakes an old report for this run's;
- hosts cut off: no error crosses a dead link (every rank waits for its peer until its
  watchdog fires, and the first to give up is not necessarily on the host that was cut off),
  so the launcher probes each other host of the rank table when the run starts and again when
  it fails (a TCP connect to PROBE_PORT_ENV's port, 22 by default: accepted or refused, the
  host answered); a host that answered at the start and no longer does is named, with its
  ranks, first in the message and under "unreachable_hosts" in the report.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_planner.core.atomic import WriteError, write_atomic
from llm_planner.core.names import check_host
from llm_planner.core.procs import last_stop_signal, preexec_die_with_parent, stop_signals_deferred
from llm_planner.launch.death_order import DeathOrder
from llm_planner.launch.stall_watch import watch
from llm_planner.runtime.heartbeat import without_beats
from llm_planner.runtime.rank import pid_path
from llm_planner.runtime.table import RankTable

log = logging.getLogger(__name__)

KILL_GRACE_S = 15.0  # beyond timeout_s: the ranks' own watchdog fires first
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long, each waited this long
_BAD = re.compile(r"PID (\d+) RUNNING AT (\S+)\s*=\s*EXIT CODE: (\d+)")
_STRING = re.compile(r"EXIT STRING: (.+)")
PROBE_PORT_ENV = "LLM_PLANNER_PROBE_PORT"
DEFAULT_PROBE_PORT = 22  # ssh: on a cluster mpiexec reaches every host through it
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, kw_only=True)
class Outcome:
    returncode: int | None
    duration_s: float
    report: dict[str, Any] | None
    error: str | None
    stderr_tail: str


def run_mpiexec(command: tuple[str, ...], table: RankTable, timeout_s: float, stall_s: float | None = None) -> Outcome:
    """Run the job to its end, its timeout, a stall its ranks' heartbeats show (with `stall_s`:
    llm_planner.launch.stall_watch) or Ctrl-C; the outcome names the failing rank."""
    workdir = Path(table.run.workdir)
    port = probe_port()
    before: dict[str, str | None] = {}
    prober = threading.Thread(target=lambda: before.update(probe_all(remote_hosts(table), port)), daemon=True)
    prober.start()
    start = time.perf_counter()
    with open(workdir / "mpiexec.out", "wb") as out, open(workdir / "mpiexec.err", "wb") as err:
        proc = start_mpiexec(command, out, err)
        on_this_host = all(is_local(r.hostname) for r in table.ranks)  # else the first death may be elsewhere
        deaths = DeathOrder(workdir, [r.rank for r in table.ranks] if on_this_host else [])
        try:
            timed_out, stall = watch(proc, table, workdir / "mpiexec.out", timeout_s + KILL_GRACE_S, stall_s)
            if timed_out or stall is not None:
                stop(proc, table)
            returncode = proc.returncode
        except KeyboardInterrupt:
            with stop_signals_deferred():  # a second signal must not leave the ranks running
                stop(proc, table)
            why = f"interrupted ({last_stop_signal()}): mpiexec and every rank were stopped"
            write_failure(table, "interrupted", why, None)
            log.warning("%s; report: %s", why, table.run.report_path)
            raise
        finally:
            deaths.close()
    duration = time.perf_counter() - start
    tail = _tail(workdir)
    ended = _Ended(returncode, timed_out, tail, deaths.first())
    error, failed = stall if stall is not None else _failure(workdir, table, ended, timeout_s)
    report = None
    if error is None and Path(table.run.report_path).is_file():
        report = json.loads(Path(table.run.report_path).read_text())
    elif error is None:
        error = f"the run ended without writing its report {table.run.report_path}:\n{tail}"
    if error is not None:
        prober.join()
        unreachable = cut_off(table, before, port)
        if unreachable:
            error = f"{cut_off_message(unreachable)}; {error}"
        write_failure(table, "failed", error, failed, unreachable)
    return Outcome(returncode=returncode, duration_s=duration, report=report, error=error, stderr_tail=tail)


def _tail(workdir: Path) -> str:
    """The end of mpiexec's error and output, without the ranks' heartbeat lines."""
    texts = ((workdir / name).read_text(errors="replace") for name in ("mpiexec.err", "mpiexec.out"))
    return "".join(without_beats(text)[-4000:] for text in texts)


@dataclass(frozen=True)
class _Ended:
    """How mpiexec ended: its status, whether it timed out, its output's tail, and this host's rank that
    died first (llm_planner.launch.death_order; None when unknown)."""

    returncode: int | None
    timed_out: bool
    tail: str
    first_dead: int | None


def _failure(workdir: Path, table: RankTable, ended: _Ended, timeout_s: float) -> tuple[str | None, int | None]:
    """(message, failed rank) of a run that failed; (None, None) when it did not."""
    raised = _rank_error(workdir)
    if raised is not None:
        return raised
    if ended.timed_out:
        return f"the run exceeded its timeout of {timeout_s:g} s and was killed", None
    died = _dead_rank(ended.tail, table, ended.first_dead)
    if died is not None:
        return died
    if ended.returncode != 0:
        return f"mpiexec exited with status {ended.returncode}:\n{ended.tail}", None
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
        path = pid_path(table.run.workdir, entry.rank)
        try:
            out[int(path.read_text().split()[0])] = entry.rank
        except (OSError, ValueError, IndexError):
            continue
    return out


def _dead_rank(tail: str, table: RankTable, first_dead: int | None) -> tuple[str, int | None] | None:
    """A rank mpiexec saw die ("BAD TERMINATION"), named with its device and how it ended. mpiexec's
    "PID p" is the first rank in its order that ended badly, often one its clean-up killed: on a run of
    this host alone, the rank it saw die first (`first_dead`, llm_planner.launch.death_order) is named
    instead, with the ending mpiexec gives for the job (its "EXIT STRING" is the first death's)."""
    bad = _BAD.search(tail)
    if bad is None:
        return None
    pid, host, code = int(bad[1]), bad[2], int(bad[3])
    how = _STRING.search(tail)
    ending = how[1].strip() if how else f"exit code {code}"
    rank = rank_pids(table).get(pid)
    if first_dead is not None and is_local(host):
        rank = first_dead
    who = f"rank {rank} ({table.ranks[rank].device})" if rank is not None else f"a rank (pid {pid})"
    return f"{who} on {host} died: {ending}; mpiexec stopped every other rank", rank


def hostfile_of(hosts: Iterable[tuple[str, str]], error: type[Exception] = ValueError) -> str:
    """mpiexec's hostfile: `host:slots` per host in the order first given, a slot for each (host, where)
    pair; every host checked (llm_planner.core.names.check_host), `where` naming the rank it came from."""
    counts: dict[str, int] = {}
    for host, where in hosts:
        counts[check_host(host, where, error)] = counts.get(host, 0) + 1
    return "".join(f"{host}:{n}\n" for host, n in counts.items())


def probe_port(environ: Mapping[str, str] = os.environ, error: type[Exception] = ValueError) -> int:
    """The TCP port the launcher probes hosts on (PROBE_PORT_ENV; 0 turns probing off); `error` names a bad value."""
    raw = environ.get(PROBE_PORT_ENV, str(DEFAULT_PROBE_PORT)).strip()
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise error(f"environment variable {PROBE_PORT_ENV}={raw!r}: expected a TCP port, 0 to 65535 (0: no probe)")
    return int(raw)


def is_local(host: str) -> bool:
    """Whether `host` names this host."""
    return host in {"localhost", "127.0.0.1", "::1", socket.gethostname()}


def remote_hosts(table: RankTable) -> list[str]:
    """The rank table's hosts other than this one (a run on this host alone probes nothing)."""
    return sorted(h for h in {r.hostname for r in table.ranks} if not is_local(h))


def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why `host` cannot be reached from here; None when it answers (a connection accepted or refused: either way
    the host's network stack replied)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return None
    except socket.gaierror as exc:
        return f"its name does not resolve ({exc.strerror})"
    except TimeoutError:
        return f"no answer on TCP port {port} within {timeout_s:g} s"
    except OSError as exc:
        return f"TCP port {port}: {exc.strerror or exc}"


def probe_all(hosts: list[str], port: int) -> dict[str, str | None]:
    """host -> why it cannot be reached (None: it answered), every host probed at once."""
    if not hosts or port == 0:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return dict(zip(hosts, pool.map(lambda h: probe(h, port), hosts)))


def cut_off(table: RankTable, before: dict[str, str | None], port: int) -> list[dict[str, Any]]:
    """The hosts that answered when the run started and no longer do, with their ranks and devices."""
    answered = [h for h, why in before.items() if why is None]
    after = probe_all(answered, port)
    out = []
    for host, why in after.items():
        if why is not None:
            ranks = [r for r in table.ranks if r.hostname == host]
            out.append(
                {"host": host, "ranks": [r.rank for r in ranks], "devices": [r.device for r in ranks], "probe": why}
            )
    return out


def cut_off_message(hosts: list[dict[str, Any]]) -> str:
    parts = []
    for h in hosts:
        ranks = ", ".join(f"rank {r} ({d})" for r, d in zip(h["ranks"], h["devices"]))
        parts.append(f"host {h['host']} ({ranks}) answered when the run started and no longer does: {h['probe']}")
    return "cut off from the launcher: " + "; ".join(parts)


def start_mpiexec(command, stdout, stderr) -> subprocess.Popen:
    """mpiexec in a session of its own (so `stop_group` reaches it and every local process it
    starts), dying with this process (procs.preexec_die_with_parent). The plan launcher and the
    profiler both start it here."""
    return subprocess.Popen(
        list(command), stdout=stdout, stderr=stderr, start_new_session=True, preexec_fn=preexec_die_with_parent()
    )


def stop_group(proc: subprocess.Popen) -> None:
    """Stop mpiexec's process group: SIGTERM, then SIGKILL after STOP_GRACE_S."""
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


def stop(proc: subprocess.Popen, table: RankTable) -> None:
    """Stop mpiexec's process group, then any rank still alive by its pid (this host's ranks)."""
    stop_group(proc)
    for pid in rank_pids(table):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def write_failure(
    table: RankTable, status: str, error: str, rank: int | None, unreachable: list[dict[str, Any]] | None = None
) -> None:
    """The report of a run that did not finish: what failed, so no old report stands in for it."""
    report: dict[str, Any] = {"status": status, "error": error, "plan": table.run.plan_path}
    if rank is not None:
        report.update(failed_rank=rank, failed_device=table.ranks[rank].device, failed_host=table.ranks[rank].hostname)
    if unreachable:
        report["unreachable_hosts"] = unreachable
    try:
        write_atomic(table.run.report_path, json.dumps(report, indent=1) + "\n")
    except WriteError:
        pass  # the run's own error is what the caller reports
