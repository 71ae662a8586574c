"""Process lifetime: every process `plan` and `launch` start stops when they stop.

- SIGTERM and SIGHUP do what SIGINT does (`stop_signals_as_interrupt`): they call the SIGINT
  handler in place (the MILP's "stop and keep the best plan", or Python's KeyboardInterrupt),
  so a scheduler's or a closed terminal's stop request ends a command the way Ctrl-C does;
  `last_stop_signal` names the signal for the messages;
- SIGKILL cannot be caught, so the children watch their parent (`die_with_parent`): on Linux
  the kernel sends them a signal when the parent dies (prctl PR_SET_PDEATHSIG); elsewhere a
  daemon thread polls os.getppid() every WATCH_PERIOD_S seconds and exits the process when the
  parent has changed. `preexec_die_with_parent` does the same for a program (mpiexec) started
  with subprocess, where only the kernel's signal can work.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
WATCH_PERIOD_S = 1.0  # the portable liveness check's period: a child outlives its parent by at most this
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_received: list[int] = []  # the stop signals received by this process, in order


def _libc_prctl() -> Callable[..., int] | None:
    """libc's prctl on Linux (loaded once, here: a forked child should not load libraries); else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def last_stop_signal() -> str:
    """SIGINT, or the SIGTERM / SIGHUP this process last turned into an interrupt."""
    return signal.Signals(_received[-1]).name if _received else "SIGINT"


def _as_interrupt(signum: int, frame) -> None:
    _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # the MILP's handler, or Python's default_int_handler
        return
    raise KeyboardInterrupt  # SIGINT ignored (a background job): the stop request still stops


@contextlib.contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """While inside: SIGTERM and SIGHUP act as SIGINT. Only the main thread can set handlers; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = {sig: signal.signal(sig, _as_interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """While inside (a clean-up that must finish: stopping children), SIGINT, SIGTERM and SIGHUP are ignored.
    Only the main thread can set handlers; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def default_stop_signals() -> None:
    """In a forked child: SIGTERM and SIGHUP back to their defaults (the parent's handlers came with the fork)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL, *, kernel: bool = True) -> None:
    """End this process when `parent_pid` (its parent) ends: the kernel's parent-death signal `sig` on Linux
    (it fires when the parent's thread that started this process ends: pass kernel=False unless that thread
    outlives this process), else a daemon thread's liveness check. Exits at once if the parent is gone."""
    if kernel and _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
        if os.getppid() != parent_pid:  # it died before the signal was armed
            os._exit(1)
        return
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watch", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        threading.Event().wait(WATCH_PERIOD_S)
    os._exit(1)


def preexec_die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A subprocess preexec_fn that makes the child (a program: mpiexec) receive `sig` when this process ends;
    None where the kernel offers no parent-death signal (the child then outlives a killed parent)."""
    if _PRCTL is None:
        return None
    parent, prctl = os.getpid(), _PRCTL

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm
