"""Predicted against measured: a plan's cost model next to what a run of it measured.

Inputs: a plan, the problem it was made for (rebuilt from the plan's inputs)
and a run report of `llm-planner launch` (lined up with the plan by
llm_planner.measure.observe). Rows, each with the relative error
(measured - predicted) / predicted:

- per (device, task): time per call. Predicted: t(i, k, b) of the cost model
  for each call's batch b (a shard's samples, or a micro-batch's requests),
  averaged over the calls; measured: the calls' total / their number;
- per device: busy time per pass. Predicted: the sum of the plan's task times
  on the device (one pass); measured: the timed calls' total / passes
  (decode steps counted, else the batches a graph run streamed). Tasks the runtime does not time (graph
  inputs and outputs) count in the prediction only;
- per link (sender -> receiver device): time per message. Predicted: the
  alpha-beta time of the plan's tensors cut between the two devices (one
  message per tensor and receiving device, as the runtime sends them);
  measured: the receiver's time in Recv / messages. Messages the plan does not
  model (a decoder's next-token ids) have no prediction;
- end to end: the plan's objective_s against the run (see llm_planner.measure.observe).

The summary of the per-task errors gives the median, 90th percentile and
maximum of |relative error|, and the median signed error (the model's bias).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from llm_planner.core.atomic import write_atomic
from llm_planner.core.fileio import read_document
from llm_planner.core.fmt import fmt_bytes, fmt_s
from llm_planner.core.plan import Plan, load_plan
from llm_planner.measure.observe import MeasureError, RunObservations, read_observations
from llm_planner.placement.inputs import problem_from_plan_inputs
from llm_planner.placement.problem import PlacementProblem

MEASURE_FORMAT = "llm_planner.measure.compare"
__all__ = ["MeasureError", "Measurement", "measure_files", "measure_run", "measurement_tables", "write_measurement"]


def rel_error(predicted: float | None, measured: float | None) -> float | None:
    """(measured - predicted) / predicted; None when either is missing or the prediction is 0."""
    if predicted is None or measured is None or not predicted > 0:
        return None
    return (measured - predicted) / predicted


@dataclass(frozen=True, kw_only=True)
class TaskRow:
    device: str
    task: str
    calls: int
    predicted_s: float  # per call
    measured_s: float  # per call

    @property
    def rel_error(self) -> float | None:
        return rel_error(self.predicted_s, self.measured_s)


@dataclass(frozen=True, kw_only=True)
class DeviceRow:
    device: str
    predicted_busy_s: float  # per pass
    measured_busy_s: float  # per pass, timed tasks only
    tasks_timed: int
    tasks_untimed: int

    @property
    def rel_error(self) -> float | None:
        return rel_error(self.predicted_busy_s, self.measured_busy_s)


@dataclass(frozen=True, kw_only=True)
class LinkRow:
    src: str
    dst: str
    messages: int
    measured_bytes: float  # per message
    measured_s: float  # per message
    predicted_bytes: float | None  # per message; None where the plan models no such message
    predicted_s: float | None

    @property
    def rel_error(self) -> float | None:
        return rel_error(self.predicted_s, self.measured_s)


@dataclass(frozen=True, kw_only=True)
class ErrorSummary:
    count: int
    median_abs: float
    p90_abs: float
    max_abs: float
    median: float  # signed: > 0 means the model predicts too little

    @staticmethod
    def of(errors: list[float]) -> ErrorSummary:
        if not errors:
            return ErrorSummary(count=0, median_abs=math.nan, p90_abs=math.nan, max_abs=math.nan, median=math.nan)
        a = np.abs(np.asarray(errors, dtype=float))
        return ErrorSummary(
            count=len(errors),
            median_abs=float(np.median(a)),
            p90_abs=float(np.percentile(a, 90)),
            max_abs=float(a.max()),
            median=float(np.median(errors)),
        )


@dataclass(frozen=True, kw_only=True)
class Measurement:
    plan_source: str
    report_source: str
    workload: str
    objective: str
    phase: str
    dtype: str
    end_to_end_what: str
    predicted_s: float
    measured_s: float
    tasks: tuple[TaskRow, ...]
    devices: tuple[DeviceRow, ...]
    links: tuple[LinkRow, ...]
    untimed: tuple[tuple[str, str], ...]  # (device, task) placed by the plan, not timed by the runtime
    notes: tuple[str, ...] = ()

    @property
    def rel_error(self) -> float | None:
        return rel_error(self.predicted_s, self.measured_s)

    @property
    def task_errors(self) -> ErrorSummary:
        return ErrorSummary.of([e for r in self.tasks if (e := r.rel_error) is not None])

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MEASURE_FORMAT,
            "version": 1,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "rel_error": self.rel_error,
            "end_to_end": self.end_to_end_what,
            "plan": self.plan_source,
            "report": self.report_source,
            "workload": self.workload,
            "objective": self.objective,
            "phase": self.phase,
            "dtype": self.dtype,
            "task_error": self.task_errors.__dict__,
            "devices": [{**r.__dict__, "rel_error": r.rel_error} for r in self.devices],
            "links": [{**r.__dict__, "rel_error": r.rel_error} for r in self.links],
            "tasks": [{**r.__dict__, "rel_error": r.rel_error} for r in self.tasks],
            "untimed_tasks": [{"device": d, "task": t} for d, t in self.untimed],
            "notes": list(self.notes),
        }


def measure_run(
    plan: Plan, problem: PlacementProblem, report: Any, *, plan_source: str = "<plan>", report_source: str = "<report>"
) -> Measurement:
    """Compare a run report with its plan; MeasureError names the report field that does not fit."""
    obs = read_observations(plan, report, report_source)
    task_index = {t.name: i for i, t in enumerate(problem.graph.tasks)}
    device_index = {name: k for k, name in enumerate(problem.device_names)}
    rows = []
    for o in obs.tasks:
        i, k = task_index[o.task], device_index[o.device]
        predicted = sum(n * problem.task_time(i, k, b) for b, n in o.calls) / o.num_calls
        rows.append(
            TaskRow(
                device=o.device,
                task=o.task,
                calls=o.num_calls,
                predicted_s=predicted,
                measured_s=o.measured_s / o.num_calls if o.num_calls else 0.0,
            )
        )
    notes = []
    if obs.dtype != plan.inputs.dtype:
        notes.append(f"the run computed in {obs.dtype}, the plan's costs are for {plan.inputs.dtype}")
    if obs.workload == "decoder":
        notes.append("decoder plans cost one step at the plan's seq_len; the run's context grows from the prompt")
    return Measurement(
        plan_source=plan_source,
        report_source=report_source,
        workload=obs.workload,
        objective=plan.objective,
        phase=obs.phase,
        dtype=obs.dtype,
        end_to_end_what=obs.end_to_end_what,
        predicted_s=plan.objective_s,
        measured_s=obs.end_to_end_s,
        tasks=tuple(rows),
        devices=_device_rows(plan, obs),
        links=_link_rows(plan, problem, obs),
        untimed=obs.unmeasured,
        notes=tuple(notes),
    )


def _device_rows(plan: Plan, obs: RunObservations) -> tuple[DeviceRow, ...]:
    predicted: dict[str, float] = {}
    for item in plan.schedule:
        predicted[item.device] = predicted.get(item.device, 0.0) + (item.finish_s - item.start_s)
    rows = []
    for device in plan.devices_used():
        timed = [o for o in obs.tasks if o.device == device]
        rows.append(
            DeviceRow(
                device=device,
                predicted_busy_s=predicted.get(device, 0.0),
                measured_busy_s=sum(o.measured_s for o in timed) / obs.passes,
                tasks_timed=len(timed),
                tasks_untimed=sum(1 for d, _ in obs.unmeasured if d == device),
            )
        )
    return tuple(rows)


def _link_rows(plan: Plan, problem: PlacementProblem, obs: RunObservations) -> tuple[LinkRow, ...]:
    """Per (sender, receiver): the plan's messages (one per tensor and receiving device) against the run's."""
    kidx = {name: k for k, name in enumerate(problem.device_names)}
    messages: dict[tuple[int, str, str], tuple[str, str, float, float]] = {}
    for e in range(problem.num_edges):
        u, v = problem.graph.tasks[int(problem.edge_src[e])].name, problem.graph.tasks[int(problem.edge_dst[e])].name
        for s, (size, assignment) in enumerate(zip(plan.shard_sizes, plan.shard_assignments)):
            a, b = assignment.get(u), assignment.get(v)
            if a is None or b is None or a == b:
                continue
            t = problem.transfer_time(e, kidx[a], kidx[b], int(size))
            nbytes = problem.graph.edges[e].bytes_per_sample * int(size)
            old = messages.get((s, u, b))
            messages[(s, u, b)] = (a, b, max(t, old[2] if old else 0.0), max(nbytes, old[3] if old else 0.0))
    by_pair: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for a, b, t, nbytes in messages.values():
        by_pair.setdefault((a, b), []).append((t, nbytes))
    rows = []
    for o in sorted(obs.transfers, key=lambda o: (o.src, o.dst)):
        planned = by_pair.get((o.src, o.dst))
        rows.append(
            LinkRow(
                src=o.src,
                dst=o.dst,
                messages=o.messages,
                measured_bytes=o.num_bytes / o.messages if o.messages else 0.0,
                measured_s=o.measured_s / o.messages if o.messages else 0.0,
                predicted_bytes=float(np.mean([n for _, n in planned])) if planned else None,
                predicted_s=float(np.mean([t for t, _ in planned])) if planned else None,
            )
        )
    return tuple(rows)


def measure_files(
    plan_path: str | Path, report: str | Path | dict[str, Any], *, check_hashes: bool = True
) -> Measurement:
    """Load the plan, rebuild its problem and compare it with the report (a file path, or the parsed report)."""

    plan = load_plan(plan_path)
    problem = problem_from_plan_inputs(plan.inputs, check_hashes=check_hashes)
    if isinstance(report, (str, Path)):
        data, source = read_document(report, MeasureError), str(report)
    else:
        data, source = report, "<run report>"
    return measure_run(plan, problem, data, plan_source=str(plan_path), report_source=source)


def write_measurement(measurement: Measurement, path: str | Path) -> None:
    """The JSON form: top-level predicted_s, measured_s and rel_error (end to end), then every row; NaN as null."""
    write_atomic(path, json.dumps(_finite(measurement.to_dict()), indent=1, allow_nan=False) + "\n", MeasureError)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:+.1f}%"


def _abs_pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _fs(x: float | None) -> str:
    return "-" if x is None else fmt_s(x)


def measurement_tables(m: Measurement, *, max_task_rows: int = 20) -> list[Table]:
    """Rich tables: end to end with the task error summary, devices, links, and the tasks with the largest errors."""
    top = Table(
        title=f"predicted vs measured: {m.workload} run of {m.plan_source} ({m.objective}, {m.phase}, {m.dtype})"
    )
    for col in ("what", "predicted", "measured", "error"):
        top.add_column(col, justify="left" if col == "what" else "right")
    top.add_row(f"end to end: {m.end_to_end_what}", fmt_s(m.predicted_s), fmt_s(m.measured_s), _pct(m.rel_error))
    errs = m.task_errors
    top.add_row(
        f"per-task |error| over {errs.count} timed tasks: median / p90 / max",
        "",
        "",
        f"{_abs_pct(errs.median_abs)} / {_abs_pct(errs.p90_abs)} / {_abs_pct(errs.max_abs)}",
    )
    top.add_row("per-task signed error, median (> 0: the model predicts too little)", "", "", _pct(errs.median))
    if m.notes:
        top.caption = "; ".join(m.notes)
    devices = Table(title="devices: busy time per pass")
    for col in ("device", "tasks timed", "untimed", "predicted", "measured", "error"):
        devices.add_column(col, justify="left" if col == "device" else "right")
    for r in m.devices:
        devices.add_row(
            r.device,
            str(r.tasks_timed),
            str(r.tasks_untimed),
            fmt_s(r.predicted_busy_s),
            fmt_s(r.measured_busy_s),
            _pct(r.rel_error),
        )
    links = Table(title="links: time per message (receiver's Recv)")
    for col in ("from", "to", "messages", "bytes/msg predicted", "measured", "time/msg predicted", "measured", "error"):
        links.add_column(col, justify="left" if col in ("from", "to") else "right")
    for r in m.links:
        links.add_row(
            r.src,
            r.dst,
            str(r.messages),
            "-" if r.predicted_bytes is None else fmt_bytes(r.predicted_bytes),
            fmt_bytes(r.measured_bytes),
            _fs(r.predicted_s),
            fmt_s(r.measured_s),
            _pct(r.rel_error),
        )
    ranked = sorted(m.tasks, key=lambda r: -abs(r.rel_error) if r.rel_error is not None else 0.0)
    tasks = Table(
        title=f"tasks: time per call ({min(max_task_rows, len(ranked))} of {len(ranked)}, largest |error| first)"
    )
    for col in ("device", "task", "calls", "predicted", "measured", "error"):
        tasks.add_column(col, justify="left" if col in ("device", "task") else "right")
    for r in ranked[:max_task_rows]:
        tasks.add_row(r.device, r.task, str(r.calls), fmt_s(r.predicted_s), fmt_s(r.measured_s), _pct(r.rel_error))
    if m.untimed:
        tasks.caption = (
            f"{len(m.untimed)} placed task(s) not timed by the runtime (graph inputs/outputs), e.g. {m.untimed[0][1]}"
        )
    return [top, devices, links, tasks]
