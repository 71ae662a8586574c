"""A plan's first two bounds (llm_planner.serving.bound), which need no plan, computed in a child
process while the plan's layout search runs in this one: the search is Python and holds one core,
the bounds' MILPs take the other.

A process, not a thread: a thread still inside HiGHS when an interrupted plan's interpreter shuts
down can abort the process (exit 134 instead of 130), and joining it first did not prevent that.
The child is a fresh interpreter (`python -m llm_planner.serving.aside FD`, the inputs pickled on
its standard input): nothing of this process is copied into it, and no caller's main module is run
again. The value comes back pickled in an unnamed temporary file whose descriptor the child
inherits (FD), never on its standard output: HiGHS (or anything else) may print there, and what
it prints, on stdout or stderr, is kept apart, quoted only when the child fails. A file, not a
pipe: the child never blocks on a reader, however long an error's message. The child rebuilds the
plan's context from the same inputs and computes the same deterministic MILPs, so the value is the
one the plan would compute itself. It ignores Ctrl-C; an interrupted plan terminates it. Worth it
only where the bounds take seconds: small clusters compute them in the plan's process
(ASIDE_DEVICES).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from typing import Any

from llm_planner.serving.bound import first_two_bounds
from llm_planner.serving.context import build_context

ASIDE_DEVICES = 64  # clusters with at least this many devices compute the first two bounds aside
CHILD = ("-m", "llm_planner.serving.aside")  # the child's interpreter arguments; the result's FD follows


def _first_two_of(inputs: dict[str, Any]) -> float:
    """first_two_bounds for the plan of `inputs` (build_context's arguments)."""
    ctx = build_context(**inputs)
    return first_two_bounds(ctx.cache, ctx.classes, ctx.workload.tpot_slo_s)


class Aside:
    """first_two_bounds for the plan of `inputs` (build_context's arguments), started in a child
    process; calling the object waits for it."""

    def __init__(self, inputs: dict[str, Any]):
        self._result = tempfile.TemporaryFile()  # unlinked: nothing to clean up, whatever happens
        fd = self._result.fileno()
        self._proc = subprocess.Popen(
            [sys.executable, *CHILD, str(fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the child's output, both streams, only for an error's message
            pass_fds=(fd,),
        )
        self._proc.stdin.write(pickle.dumps(inputs))  # a few hundred bytes: within the pipe's buffer
        self._proc.stdin.close()
        self._proc.stdin = None  # sent: communicate() has nothing more to write

    def __call__(self) -> float:
        output, _ = self._proc.communicate()
        with self._result:
            self._result.seek(0)
            data = self._result.read()
        if self._proc.returncode != 0 or not data:
            raise RuntimeError(
                f"the first two bounds' process ended with code {self._proc.returncode} and no value: "
                f"{output.decode(errors='replace')[-2000:]}"
            )
        kind, value = pickle.loads(data)
        if kind == "error":
            raise value
        return value

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait()
        self._result.close()


def _main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    result_fd = int(sys.argv[-1])
    inputs = pickle.loads(sys.stdin.buffer.read())
    try:
        result = ("value", _first_two_of(inputs))
    except Exception as exc:  # handed to the parent
        result = ("error", exc)
    with os.fdopen(result_fd, "wb") as out:
        out.write(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
