"""What a failed serving run says: the failing rank's host, replica and stage, the hosts cut off, what was served.

The placement launcher's machinery (llm_planner.launch.mpiexec_run) names the failing rank, its device and
host, and the hosts cut off from the launcher, in its message and in the failure report it writes at the
report path. A serving run adds where those ranks sit in the plan: each is named as `replica i stage s of n`
(and its member index in a tensor-parallel stage), in the message

    cut off from the launcher: host H2 (rank 1 (server1/cpu-core:0)) answered when the run started and no longer
    does: ...; the ranks cut off served: rank 1: replica 0 stage 1 of 2; rank 0 (replica 0 stage 0 of 2) on host H1
    failed: rank 0 (server0/cpu-core:0): TimeoutError: ...

    ...; served before the failure: 41 requests, 205 output tokens (the report's "served")

(the part about hosts cut off only when there are any; without a known failing rank, mpiexec's own error) and
in the failure report: `failed_replica` and `failed_stage` beside `failed_rank`, `stages` (`[{"rank",
"replica", "stage"}]`) in each entry of `unreachable_hosts`, and `served`: the run report
(llm_planner.launch.serve_report) of what each replica served until its last record before the failure
(llm_planner.runtime.serve_progress: up to half a second is lost).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from llm_planner.core.atomic import WriteError, write_atomic
from llm_planner.launch.mpiexec_run import cut_off_message
from llm_planner.runtime.serve_spec import ServeSpec

log = logging.getLogger(__name__)


def stage_label(spec: ServeSpec, rank: int) -> str:
    """`replica i stage s of n`, with `, member m of k` for a rank of a tensor-parallel stage."""
    role = spec.role(rank)
    stages = spec.replicas[role.replica].stages
    size = len(stages[role.stage].ranks)
    member = f", member {role.member} of {size}" if size > 1 else ""
    return f"replica {role.replica} stage {role.stage} of {len(stages)}{member}"


def serving_failure(
    error: str | None, report_path: str | Path, spec: ServeSpec, served: dict[str, Any] | None = None
) -> str | None:
    """The message of a failed serving run (module docstring); the failure report at report_path gains the
    replicas and stages of the ranks it names, and `served` (a run report of what was served before the
    failure, llm_planner.launch.serve_report). `error` as the launcher's run gave it."""
    try:
        failure = json.loads(Path(report_path).read_text())
    except (OSError, ValueError):
        return error
    if error is None or not isinstance(failure, dict) or failure.get("status") != "failed":
        return error
    parts = []
    unreachable: list[dict[str, Any]] = failure.get("unreachable_hosts") or []
    if unreachable:
        cut = cut_off_message(unreachable)
        error = error.removeprefix(f"{cut}; ")
        for host in unreachable:
            host["stages"] = [_where(spec, r) for r in host["ranks"]]
        stages = "; ".join(f"rank {r}: {stage_label(spec, r)}" for h in unreachable for r in h["ranks"])
        parts.append(f"{cut}; the ranks cut off served: {stages}")
    rank = failure.get("failed_rank")
    if rank is None:
        parts.append(error)
    else:
        failure.update({f"failed_{k}": v for k, v in _where(spec, rank).items() if k != "rank"})
        parts.append(f"rank {rank} ({stage_label(spec, rank)}) on host {failure['failed_host']} failed: {error}")
    if served is not None:
        n, tokens = served["total"]["requests_completed"], served["total"]["output_tokens"]
        what = f"{n} request{'s' if n != 1 else ''}, {tokens} output token{'s' if tokens != 1 else ''}"
        parts.append(f'served before the failure: {what} (the report\'s "served")')
        failure["served"] = served
    message = "; ".join(parts)
    failure["error"] = message
    try:
        write_atomic(report_path, json.dumps(failure, indent=1) + "\n")
    except WriteError as exc:  # the run's own failure is what the caller reports
        log.warning("could not add the failing stages to the failure report: %s", exc)
    return message


def add_served(report_path: str | Path, served: dict[str, Any]) -> None:
    """The report of an interrupted run (Ctrl-C, SIGTERM) with what was served before it stopped
    (`served`, as serving_failure adds it to a failed run's)."""
    try:
        report = json.loads(Path(report_path).read_text())
    except (OSError, ValueError):
        return
    if isinstance(report, dict) and report.get("status") == "interrupted":
        try:
            write_atomic(report_path, json.dumps(report | {"served": served}, indent=1) + "\n")
        except WriteError as exc:
            log.warning("could not add what was served to the report: %s", exc)


def _where(spec: ServeSpec, rank: int) -> dict[str, int]:
    role = spec.role(rank)
    return {"rank": rank, "replica": role.replica, "stage": role.stage}
