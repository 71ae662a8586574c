"""What a placement launch takes and gives: its options, its result, and its errors (a plan that cannot be
launched as asked, a plan `verify` rejects)."""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from typing import Any

from llm_planner.runtime.table import RankTable

log = logging.getLogger(__name__)


class LaunchError(ValueError):
    """A plan that cannot be launched as asked; nothing was started."""

    exit_code = 2  # the CLI's exit status for bad input


class PlanRejected(LaunchError):
    """A plan that `verify` rejects (one line per violation); nothing was started."""

    exit_code = 1  # as `verify`'s exit status for an invalid plan


DEFAULT_NEW_TOKENS = 16  # a decoder plan's tokens per request without --max-new-tokens


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    dry_run: bool = False  # write the files, build the command, start nothing
    checkpoint: str | None = (
        None  # decoder: Hugging Face checkpoint dir (safetensors) whose config the plan was made from
    )
    prompt_ids: tuple[tuple[int, ...], ...] = ()  # decoder: one prompt per request; empty: batch_size seeded prompts
    max_new_tokens: int | None = None  # decoder: tokens per request; None: DEFAULT_NEW_TOKENS
    report_path: str | None = None  # default: <workdir>/run.json
    timeout_s: float = 600.0  # bound on the whole run
    workdir: str | None = None  # default: <report dir>/<plan stem>.launch with a report path, else launch/<plan stem>
    extra: tuple[str, ...] = ()  # extra mpiexec arguments, placed before the program
    num_ranks: int | None = None  # the rank count asked for; must equal the number of devices the plan uses
    seed: int | None = None  # seeded weights and CNN inputs; default: the plan's model seed
    dtype: str | None = None  # compute dtype; default: the plan's
    fail_rank: int | None = None  # fault injection for tests: this rank raises once the run starts
    warmup: int = 0  # untimed runs of the whole workload before the timed one
    stall_timeout_s: float | None = None  # serving runs: stop on a stall the heartbeats show (launch.stall_watch)

    @property
    def new_tokens(self) -> int:
        """The tokens a decoder's request generates: --max-new-tokens, or DEFAULT_NEW_TOKENS."""
        return DEFAULT_NEW_TOKENS if self.max_new_tokens is None else self.max_new_tokens


@dataclass(frozen=True, kw_only=True)
class LaunchResult:
    command: tuple[str, ...]
    rank_table: RankTable
    workdir: str
    hostfile_path: str
    rank_table_path: str
    report_path: str
    dry_run: bool
    returncode: int | None = None  # None for a dry run
    duration_s: float = 0.0
    report: dict[str, Any] | None = None
    error: str | None = None  # the failing rank's message (or mpiexec's) when the run failed
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.dry_run or (self.returncode == 0 and self.error is None)

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)

    @property
    def tokens(self) -> list[list[int]] | None:
        return None if self.report is None else self.report.get("tokens")
