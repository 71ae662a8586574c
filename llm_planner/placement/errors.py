"""The errors every solver raises (below the solvers, so that none imports solve.api for them)."""

from __future__ import annotations


class SolveError(RuntimeError):
    """No plan could be made (infeasible instance, unusable backend); the message says why."""


class VerificationError(AssertionError):
    """A solver returned a plan the verifier rejects: a bug, never a user error."""


class SolveInterrupted(SolveError):
    """Ctrl-C stopped a solve before it had any plan to return (with one, the plan has status `interrupted`)."""
