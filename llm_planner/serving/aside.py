"""A plan's first two bounds (llm_planner.serving.bound), which need no plan, computed in a child
process while the plan's layout search runs in this one: the search is Python and holds one core,
the bounds' MILPs take the other.

A process, not a thread: a thread still inside HiGHS when an interrupted plan's interpreter shuts
down can abort the process (exit 134 instead of 130), and joining it first did not prevent that.
The child is a fresh interpreter (`python -m llm_planner.serving.aside`, the inputs pickled on
its standard input, the value on its standard output): nothing of this process is copied into
it, and no caller's main module is run again. It rebuilds the plan's context from the same inputs
and computes the same deterministic MILPs, so the value is the one the plan would compute itself.
It ignores Ctrl-C; an interrupted plan terminates it. Worth it only where the bounds take seconds:
small clusters compute them in the plan's process (ASIDE_DEVICES).
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
from typing import Any

from llm_planner.serving.bound import first_two_bounds
from llm_planner.serving.context import build_context

ASIDE_DEVICES = 64  # clusters with at least this many devices compute the first two bounds aside


def _first_two_of(inputs: dict[str, Any]) -> float:
    """first_two_bounds for the plan of `inputs` (build_context's arguments)."""
    ctx = build_context(**inputs)
    return first_two_bounds(ctx.cache, ctx.classes, ctx.workload.tpot_slo_s)


class Aside:
    """first_two_bounds for the plan of `inputs` (build_context's arguments), started in a child
    process; calling the object waits for it."""

    def __init__(self, inputs: dict[str, Any]):
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "llm_planner.serving.aside"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._proc.stdin.write(pickle.dumps(inputs))  # a few hundred bytes: within the pipe's buffer
        self._proc.stdin.close()
        self._proc.stdin = None  # sent: communicate() has nothing more to write

    def __call__(self) -> float:
        out, err = self._proc.communicate()
        if self._proc.returncode != 0:
            raise RuntimeError(
                f"the first two bounds' process ended with code {self._proc.returncode}: {err.decode()[-2000:]}"
            )
        kind, value = pickle.loads(out)
        if kind == "error":
            raise value
        return value

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait()


def _main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    inputs = pickle.loads(sys.stdin.buffer.read())
    try:
        result = ("value", _first_two_of(inputs))
    except Exception as exc:  # handed to the parent
        result = ("error", exc)
    sys.stdout.buffer.write(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
