"""Atomic writes: every file the command line writes goes through here.

A file is written to a temporary file in the destination's own directory,
flushed and fsynced, then renamed over the destination (os.replace, atomic on
POSIX within one file system). A full disk, a killed process or an exception
while writing leaves the old file (or none) in place, never a half-written one;
the temporary file is removed on any failure.

A symbolic link is never followed to a file: writing to a link to a regular file
(or to nothing) is refused, naming the link and its target, so a link planted in a
shared directory cannot make a command replace another file (the kernel's
protected_symlinks guards `open`, not a rename over a resolved path). A link to a
device or a FIFO (`/dev/stdout`) is written through in place, as the device itself is.

`check_writable(path)` tells before a long computation whether `path` can be
written at all (its directory exists and takes new files, it is not a
directory), so a command fails in seconds, not after a solve.

Errors are raised as `error(message)`, the caller's error class (WriteError by
default), with a message that names the path; the command line turns those into
exit code 2.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


class WriteError(ValueError):
    """A file that cannot be written; the message names it."""


def check_writable(path: str | Path, error: type[Exception] = WriteError) -> None:
    """`error` naming `path` unless a file can be created or replaced there."""
    path = _target(Path(path), error)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise error(f"{path}: cannot write: it is a directory")
    if _special(path):
        if not os.access(path, os.W_OK):
            raise error(f"{path}: cannot write: permission denied")
        return
    if not parent.is_dir():
        raise error(f"{path}: cannot write: the directory {parent} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
    except OSError as exc:
        raise error(f"{path}: cannot write in {parent}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)
    if path.exists() and not os.access(path, os.W_OK):
        raise error(f"{path}: cannot write: the file is read-only")


def make_directory(path: str | Path, error: type[Exception] = WriteError) -> Path:
    """The directory at `path`, made with its parents where missing; `error` naming it where it cannot
    be (a file stands there, a parent cannot be written)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = "a file stands there" if path.exists() and not path.is_dir() else exc.strerror or str(exc)
        raise error(f"{path}: cannot make the directory: {what}") from None
    return path


def check_not_an_input(
    path: str | Path, inputs: dict[str, str | Path | None], error: type[Exception] = WriteError
) -> None:
    """`error` when `path` names one of the command's input files (`inputs`: what names each, a flag
    or a plan field, -> its path; None: not given): writing there would destroy the input."""
    out = Path(path)
    if not out.exists():  # nothing there yet: no input to write over
        return
    for what, given in inputs.items():
        if given is not None and Path(given).exists() and out.samefile(given):  # links and other spellings too
            raise error(f"{path}: is the input {what} ({given}): writing there would destroy it; name a new file")


@contextlib.contextmanager
def atomic_path(path: str | Path, error: type[Exception] = WriteError) -> Iterator[Path]:
    """A temporary path beside `path` to write to (for writers that want a file name, such as
    matplotlib's savefig); on leaving without an exception it replaces `path`."""
    path = _target(Path(path), error)
    check_writable(path, error)
    if _special(path):  # /dev/null, a FIFO, a terminal: written in place, never replaced by a file
        try:
            yield path
        except OSError as exc:
            raise error(f"{path}: cannot write: {exc.strerror or exc}") from None
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    try:
        os.chmod(tmp, _mode_for(path))  # mkstemp makes it 0600; keep what the file had or what a new one gets
        yield Path(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(path.parent if str(path.parent) else ".")  # the rename itself survives a crash
    except OSError as exc:
        raise error(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_figure(fig, path: str | Path, error: type[Exception] = WriteError) -> None:
    """A matplotlib figure written to `path` through write_atomic, in the format its suffix names
    (PNG without one): rendered in memory first, so a device that refuses the bytes (/dev/full) is
    `error` naming the path (savefig to it reports nothing); an unknown suffix is `error` too."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    known = fig.canvas.get_supported_filetypes()
    if fmt not in known:
        raise error(f"{path}: cannot write a figure as .{fmt}: use one of .{', .'.join(sorted(known))}")
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format=fmt)
    write_atomic(path, buffer.getvalue(), error)


def write_atomic(path: str | Path, data: str | bytes, error: type[Exception] = WriteError) -> None:
    """Write `data` (text as UTF-8) to `path` atomically; `error` naming the path on failure."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, error) as tmp:
        with open(tmp, "wb") as f:
            f.write(payload)


def _target(path: Path, error: type[Exception]) -> Path:
    """The path itself, a symbolic link to a device or FIFO included (opened through the link, so
    the kernel's checks of links still apply); `error` for any other link (the module docstring)."""
    if not path.is_symlink() or _special(path):
        return path
    target = Path(os.path.realpath(path))
    raise error(
        f"{path}: cannot write: it is a symbolic link (to {target}); a link is never written through: "
        "give the file's own path, or remove the link"
    )


def _special(path: Path) -> bool:
    """Exists and is neither a regular file nor a directory (a device, a FIFO)."""
    return path.exists() and not path.is_file() and not path.is_dir()


def _mode_for(path: Path) -> int:
    """The permission bits of the existing file, else those a new file gets under the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
