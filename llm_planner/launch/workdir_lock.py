"""One launch at a time in a workdir: a run holds an exclusive lock on `launch.lock` there while its
ranks run, so that a second launch into the same folder is refused (exit 2, naming the folder and
the launcher holding it) instead of clearing the first's rank files and killing its ranks with
its own. The lock is the kernel's (flock): it goes with the process that holds it, however that
process ends, so a stale file never blocks a later run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from llm_planner.core.atomic import make_directory
from llm_planner.launch.launch_types import LaunchError

LOCK_NAME = "launch.lock"


def run_lock(workdir: str | Path, dry_run: bool) -> contextlib.AbstractContextManager:
    """workdir_lock for a run that starts ranks; nothing for a dry run, which starts none."""
    return contextlib.nullcontext() if dry_run else workdir_lock(workdir)


@contextlib.contextmanager
def workdir_lock(workdir: str | Path) -> Iterator[Path]:
    """The workdir (made where missing), locked for this process while inside; LaunchError when
    another launch holds it."""
    folder = make_directory(workdir, LaunchError)
    path = folder / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LaunchError(f"{path}: cannot open the launch lock: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LaunchError(
                f"{folder}: another launch is running in this workdir ({_holder(fd)}); wait for it, or give "
                "this one another --workdir (or --report in another folder)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield folder
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _holder(fd: int) -> str:
    """The pid the holding launcher wrote, as a phrase."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return f"launcher pid {text}" if text.isdigit() else "its launcher's pid not yet written"
