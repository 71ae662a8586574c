"""Fit a cluster spec's efficiency factors and link parameters to measured runs.

Device kinds. Per call of task i on a plan device of kind K for b samples, the
planner's own roofline (llm_planner.cost.roofline.roofline_terms, the terms the problem
builder's pieces come from: FLOPs F and activation bytes A per sample, weight
bytes W streamed per call, an embedding table's indexed rows left out; on a
tensor-parallel group one member's share, plus the group's collectives C(b) over
the spec's link) with x = 1 / compute_efficiency, y = 1 / mem_efficiency and
o = overhead_s reads

    t(b) = o + max( x * F b / peak_flops,  y * (W + A b) / mem_bw_bytes_per_s ) + C(b)

C(b) is the links' and not fitted here: it is taken off the measured time.
`predicted_task_s` is this model with the spec's own factors, which equals the
planner's task time (tests/test_calibrate.py holds them equal).

Once every call is classed as compute- or memory-bound, the measured total of a
(device, task) over its calls is linear in (o, x, y):

    sum_calls t = N * o + x * sum_{compute-bound calls} F b / peak + y * sum_{memory-bound calls} (W + A b) / bw

We solve that by bounded least squares on relative residuals (each row divided
by its measured total; o >= 0, x >= 1, y >= 1 so efficiencies stay in (0, 1]),
re-class the calls with the fitted factors and repeat until the classes stop
changing, from two starts (the spec's factors, and the peaks), keeping the fit
with the smaller residual of the true max model.

Identifiability (what a run can and cannot tell): a factor with no call in its
class (no compute-bound call: compute_efficiency) cannot be fitted and keeps the
spec's value; a fit needs more observations than factors, and if the
remaining columns are collinear (e.g. one task at one batch size: overhead and
efficiency trade off exactly) mem_efficiency keeps the spec's value first, then
compute_efficiency (the per-call overhead, which absorbs what the roofline
does not model, is the last to be given up); a factor whose fitted term
explains under 1% of every measured time is not determined by the data either. A kind with no timed task keeps all
its factors; tasks with explicit times (profiles) are not roofline tasks and
are left out. A factor at its bound (efficiency 1) means the run was faster
than the spec's peak: check peak_flops / mem_bw_bytes_per_s.

Links. Per (sender, receiver) pair the runtime reports messages M, bytes B and
seconds T (the receiver's time in Recv); with the link class of the pair (the
rule of llm_planner.core.spec.ClusterSpec.link), T = M * latency_s + B / bw_bytes_per_s,
fitted the same way per link class (latency_s >= 0). A class with messages of
one size, or with one observation, keeps its bandwidth and fits the latency;
a class with no message keeps both.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm_planner.core.fileio import read_document
from llm_planner.core.plan import Plan, load_plan
from llm_planner.core.spec import ClusterSpec, DeviceKindSpec, load_cluster
from llm_planner.cost import roofline as cost
from llm_planner.measure.fits import CalibrateError, Calibration, Fit, write_calibrated_spec
from llm_planner.measure.lsq import bounded_fit
from llm_planner.measure.observe import MeasureError, RunObservations, read_observations
from llm_planner.placement.inputs import problem_from_plan_inputs
from llm_planner.placement.problem import PlacementProblem

KIND_FIELDS = ("overhead_s", "compute_efficiency", "mem_efficiency")
LINK_FIELDS = ("latency_s", "bw_bytes_per_s")
__all__ = ["CalibrateError", "Calibration", "Fit", "calibrate", "calibrate_files", "load_run"]


@dataclass(frozen=True, kw_only=True)
class RunData:
    """One measured run: its plan, the plan's problem (for the task graph) and the lined-up observations."""

    plan: Plan
    problem: PlacementProblem
    obs: RunObservations


# ----------------------------------------------------------------------------
# Device kinds


@dataclass(frozen=True)
class _Sample:
    total_s: float
    groups: tuple[tuple[int, float, float], ...]  # (calls, compute seconds at peak, memory seconds at peak) per batch
    fixed_s: float = 0.0  # a group's collectives over its calls (the spec's link), not a kind's factor


def _call_groups(terms: cost.RooflineTerms, calls) -> tuple[tuple[tuple[int, float, float], ...], float]:
    """Per batch size: (calls, compute seconds at peak, memory seconds at peak), from the planner's own
    roofline terms (llm_planner.cost.roofline.roofline_terms); and the collectives' seconds over the calls."""
    groups = tuple(
        (
            n,
            terms.flops_per_sample * b / terms.peak_flops,
            (terms.streamed_bytes + terms.bytes_per_sample * b) / terms.mem_bw_bytes_per_s,
        )
        for b, n in calls
    )
    fixed, slope = terms.collective
    return groups, sum(n * (fixed + slope * b) for b, n in calls)


def _observation_terms(cluster: ClusterSpec, run: RunData, o) -> tuple[str, cost.RooflineTerms] | None:
    """(kind name, roofline terms) of an observed (device, task) as the planner costs it on that plan
    device (a tensor-parallel group: one member's share and the collectives over the group's link);
    None for a task with explicit times (not a roofline task)."""
    problem = run.problem
    task = problem.graph.task(o.task)
    if task.time_s_by_kind:
        return None
    names = problem.device_names
    if o.device not in names:
        raise CalibrateError(f"{run.obs.source}: device {o.device!r} of the run is not a device of its plan's problem")
    device = problem.devices[names.index(o.device)]
    kind = cluster.kind(device.kind)
    link = None
    if device.degree > 1:
        single = cluster.device_map()
        link = cluster.link(single[device.members[0]], single[device.members[1]])
    try:
        return kind.name, cost.roofline_terms(task, kind, run.obs.dtype, device.degree, link)
    except cost.CostError as exc:
        raise CalibrateError(f"{run.obs.source}: {exc}, the dtype of the run") from None


def _kind_samples(cluster: ClusterSpec, kind: DeviceKindSpec, runs: Sequence[RunData]) -> list[_Sample]:
    out = []
    for run in runs:
        for o in run.obs.tasks:
            found = _observation_terms(cluster, run, o) if o.measured_s > 0 else None
            if found is None or found[0] != kind.name:
                continue
            groups, fixed_s = _call_groups(found[1], o.calls)
            out.append(_Sample(total_s=o.measured_s, groups=groups, fixed_s=fixed_s))
    return out


def predicted_task_s(cluster: ClusterSpec, run: RunData) -> dict[tuple[str, str], float]:
    """(device, task) -> the seconds calibration's model predicts for the run's timed calls with the
    cluster's own factors: the planner's roofline, term for term (a test holds the two equal)."""
    out = {}
    for o in run.obs.tasks:
        found = _observation_terms(cluster, run, o)
        if found is not None:
            kind = cluster.kind(found[0])
            groups, fixed_s = _call_groups(found[1], o.calls)
            p = np.array([kind.overhead_s, 1.0 / kind.compute_efficiency, 1.0 / kind.mem_efficiency])
            out[(o.device, o.task)] = float(
                _predict([_Sample(total_s=o.measured_s, groups=groups, fixed_s=fixed_s)], p)[0]
            )
    return out


def _predict(samples: list[_Sample], p: np.ndarray) -> np.ndarray:
    o, x, y = p
    return np.array([s.fixed_s + sum(n * (o + max(x * fc, y * fm)) for n, fc, fm in s.groups) for s in samples])


def _rows(samples: list[_Sample], p: np.ndarray) -> np.ndarray:
    _, x, y = p
    a = np.zeros((len(samples), 3))
    for r, s in enumerate(samples):
        for n, fc, fm in s.groups:
            a[r, 0] += n
            if x * fc >= y * fm:
                a[r, 1] += n * fc
            else:
                a[r, 2] += n * fm
    return a


def _rel_rms(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.sqrt(np.mean(((predicted - measured) / measured) ** 2))) if len(measured) else math.nan


def fit_kind(kind: DeviceKindSpec, samples: list[_Sample], path: tuple) -> Fit:
    """Fit (overhead_s, 1/compute_efficiency, 1/mem_efficiency) of one kind; see the module docstring."""
    prior = np.array([kind.overhead_s, 1.0 / kind.compute_efficiency, 1.0 / kind.mem_efficiency])
    before = {
        "overhead_s": kind.overhead_s,
        "compute_efficiency": kind.compute_efficiency,
        "mem_efficiency": kind.mem_efficiency,
    }
    if not samples:
        return Fit(
            name=kind.name,
            path=path,
            values=before,
            before=before,
            fitted=(),
            kept=dict.fromkeys(KIND_FIELDS, "no timed task"),
            samples=0,
            rel_rms_before=math.nan,
            rel_rms_after=math.nan,
        )
    measured = np.array([s.total_s for s in samples])
    weight = 1.0 / measured
    target = (measured - np.array([s.fixed_s for s in samples])) * weight  # the collectives are the links'
    best = None
    for start in (prior, np.array([kind.overhead_s, 1.0, 1.0])):
        p, seen = start, set()
        for _ in range(30):
            a = _rows(samples, p)
            key = a[:, 1:].astype(bool).tobytes()
            if key in seen:
                break
            seen.add(key)
            p, free, kept = bounded_fit(a * weight[:, None], target, prior, np.array([0.0, 1.0, 1.0]), order=(2, 1, 0))
        rms = _rel_rms(_predict(samples, p), measured)
        if best is None or rms < best[0] - 1e-12:
            best = (rms, p, free, kept)
    rms, p, free, kept = best
    values = {"overhead_s": float(p[0]), "compute_efficiency": float(1.0 / p[1]), "mem_efficiency": float(1.0 / p[2])}
    return Fit(
        name=kind.name,
        path=path,
        values=values,
        before=before,
        fitted=tuple(KIND_FIELDS[j] for j in sorted(free)),
        kept={KIND_FIELDS[j]: why for j, why in kept.items()},
        samples=len(samples),
        rel_rms_before=_rel_rms(_predict(samples, prior), measured),
        rel_rms_after=rms,
    )


# ----------------------------------------------------------------------------
# Links


def link_class(cluster: ClusterSpec, src: str, dst: str) -> tuple[str | int, ...] | None:
    """The spec path of the link rule between two devices (ClusterSpec.link_path); None on one device."""
    devices = cluster.device_map()
    return cluster.link_path(devices[src], devices[dst])


def fit_link(cluster: ClusterSpec, path: tuple, rows: list[tuple[int, int, float]]) -> Fit:
    """Fit latency_s and bandwidth of one link class from (messages, bytes, seconds) rows."""
    spec = cluster.link_at(path)
    before = {"latency_s": spec.latency_s, "bw_bytes_per_s": spec.bw_bytes_per_s}
    prior = np.array([spec.latency_s, 1.0 / spec.bw_bytes_per_s])
    rows = [r for r in rows if r[2] > 0 and r[0] > 0]
    name = ".".join(map(str, path))
    if not rows:
        return Fit(
            name=name,
            path=path,
            values=before,
            before=before,
            fitted=(),
            kept=dict.fromkeys(LINK_FIELDS, "no message measured"),
            samples=0,
            rel_rms_before=math.nan,
            rel_rms_after=math.nan,
        )
    a = np.array([[m, nbytes] for m, nbytes, _ in rows], dtype=float)
    measured = np.array([s for _, _, s in rows])
    p, free, kept = bounded_fit(a / measured[:, None], np.ones(len(rows)), prior, np.array([0.0, 1e-18]), order=(1, 0))
    values = {"latency_s": float(p[0]), "bw_bytes_per_s": float(1.0 / p[1])}
    return Fit(
        name=name,
        path=path,
        values=values,
        before=before,
        fitted=tuple(LINK_FIELDS[j] for j in sorted(free)),
        kept={LINK_FIELDS[j]: why for j, why in kept.items()},
        samples=len(rows),
        rel_rms_before=_rel_rms(a @ prior, measured),
        rel_rms_after=_rel_rms(a @ p, measured),
    )


# ----------------------------------------------------------------------------
# Putting it together


def calibrate(cluster: ClusterSpec, runs: Sequence[RunData]) -> Calibration:
    """Fit every device kind and link class of `cluster` to the runs (see the module docstring)."""
    devices = cluster.device_map()
    for run in runs:
        for name in run.plan.physical_devices_used():
            if name not in devices:
                raise CalibrateError(f"{run.obs.source}: device {name!r} of the run is not in cluster {cluster.source}")
    kinds = tuple(
        fit_kind(k, _kind_samples(cluster, k, runs), ("device_kinds", i)) for i, k in enumerate(cluster.device_kinds)
    )
    by_class: dict[tuple, list[tuple[int, int, float]]] = {}
    for run in runs:
        for t in run.obs.transfers:
            path = link_class(cluster, t.src, t.dst)
            if path is not None:
                by_class.setdefault(path, []).append((t.messages, t.num_bytes, t.measured_s))
    links = tuple(fit_link(cluster, path, rows) for path, rows in sorted(by_class.items(), key=lambda kv: str(kv[0])))
    return Calibration(kinds=kinds, links=links)


def load_run(plan_path: str | Path, report_path: str | Path) -> RunData:
    """Read one plan and its run report; the task graph is rebuilt in the dtype the run computed in."""

    plan = load_plan(plan_path)
    report = read_document(report_path, MeasureError)
    obs = read_observations(plan, report, str(report_path))
    inputs = plan.inputs
    if obs.dtype != inputs.dtype and "graph" not in inputs.model:
        inputs = dataclasses.replace(inputs, model={**inputs.model, "dtype": obs.dtype}, dtype=obs.dtype)
    problem = problem_from_plan_inputs(inputs, check_hashes=False)
    if inputs is plan.inputs and problem.inputs is not None and problem.inputs.graph_sha256 != plan.inputs.graph_sha256:
        raise CalibrateError(f"{plan_path}: inputs.model: the task graph differs from the one the plan was made for")
    return RunData(plan=plan, problem=problem, obs=obs)


def calibrate_files(
    cluster_path: str | Path, plan_paths: Sequence[str], report_paths: Sequence[str], output: str | Path
) -> Calibration:
    """Read the runs (one plan for every report, or one plan per report), fit, and write the corrected spec."""
    if not report_paths:
        raise CalibrateError("give at least one run report (--report)")
    if len(plan_paths) not in (1, len(report_paths)):
        raise CalibrateError(
            "give one plan for all reports or one plan per report; "
            f"got {len(plan_paths)} plans for {len(report_paths)} reports"
        )
    plans = list(plan_paths) * len(report_paths) if len(plan_paths) == 1 else list(plan_paths)
    cluster = load_cluster(cluster_path)
    runs = [load_run(p, r) for p, r in zip(plans, report_paths)]
    result = calibrate(cluster, runs)
    write_calibrated_spec(cluster_path, result, output, sources=[f"{r} ({p})" for p, r in zip(plans, report_paths)])
    return result
