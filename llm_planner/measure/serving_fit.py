"""Fit a cluster spec's serving factors to measured serving runs: `calibrate --serving`.

For every device kind the measured replicas ran on, the factors are
x = (1 / compute_efficiency, 1 / mem_efficiency, step_overhead_s, collective_overhead_s, sequence_overhead_s)
(llm_planner.cost.iteration, llm_planner.serving.costs). Each observation's figures F (TPOT, output
tokens/s, TTFT, and the pure decode step where the run measured it) are predicted by the serving
model itself, exactly as `llm-planner score` scores the replica
(llm_planner.measure.serving_cases.predict), and the fit minimises the weighted relative errors

    sum over observations and figures  w_F^2 (predicted_F(x) / measured_F - 1)^2

with w = 1 for TPOT, tokens/s and the decode step and 0.25 for TTFT (DEFAULT_WEIGHTS; the
command line sets those of TTFT and tokens/s): the model's TTFT is a steady-state estimate that
leaves out the wait for a slot, which a loaded run's TTFT includes, and a run's tokens/s counts
its ramp-up and tail, most of a closed batch of a few prompts. Bounds: efficiencies in (0, 1]
(x >= 1), overheads >= 0.

Every kernel's time is a maximum of terms linear in x, and so is a cycle, so each figure is
piecewise linear in x except tokens/s = C / TPOT. The fit is Gauss-Newton: at x, a forward
difference of the model gives the figures' derivatives (exact within a linear piece), and the
linearised problem is solved by bounded least squares over the factors the data determines
(llm_planner.measure.lsq.bounded_fit, as calibration of placement runs); a step that does not
lower the error is halved. It stops when x stops moving.

What the data cannot tell keeps the spec's value, with the reason in the output: a kind no
observation ran on; a factor no figure depends on (collective_overhead_s without a tensor-parallel
group of the kind; compute_efficiency where every kernel is memory-bound); more factors than the
independent figures minus one (tokens/s is C / TPOT in the model, so it counts with TPOT as one
figure); collinear factors (one concurrency: the step overhead and the memory efficiency trade off;
one concurrency tells no time per sequence from the step's), given up in the order
collective_overhead_s, sequence_overhead_s, compute_efficiency, mem_efficiency; a factor whose term
explains under 1% of every figure. step_overhead_s, which absorbs what the model does not count, is
given up last and never as weak.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm_planner.core.spec import ClusterSpec, DeviceKindSpec, load_cluster
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.measure.fits import CalibrateError, Calibration, Fit, write_calibrated_spec
from llm_planner.measure.lsq import bounded_fit
from llm_planner.measure.serving_cases import (
    FIGURES,
    ServingCase,
    ServingSettings,
    build_cases,
    model_config,
    predict,
    with_kind_values,
)
from llm_planner.measure.serving_results import read_serving_results

FIELDS = ("compute_efficiency", "mem_efficiency", "step_overhead_s", "collective_overhead_s", "sequence_overhead_s")
NF = len(FIELDS)
SCALE = np.array([1.0, 1.0, 1e-3, 1e-6, 1e-6])  # units of x in the fit: 1 / efficiency, ms, us, us
LOWER = np.array([1.0, 1.0, 0.0, 0.0, 0.0])
GIVE_UP = (3, 4, 0, 1, 2)  # field indices, the first given up first among equally good fits
DEFAULT_WEIGHTS = {"tpot_s": 1.0, "tokens_per_s": 1.0, "ttft_s": 0.25, "decode_step_s": 1.0}
MAX_STEPS = 60
AT_BOUND = 1e-6  # in x's units: a factor closer than this to its bound is taken as at it


@dataclass(frozen=True, kw_only=True)
class FigureError:
    """One measured figure with its prediction before (the spec's values) and after the fit."""

    source: str
    replica: str
    concurrency: int
    figure: str  # one of FIGURES
    measured: float
    before: float
    after: float


@dataclass(frozen=True, kw_only=True)
class ServingCalibration:
    calibration: Calibration  # one Fit per device kind of the spec
    figures: tuple[FigureError, ...]
    notes: tuple[str, ...] = ()  # what the command says beside the fit (a concurrency read from a rate)


@dataclass(frozen=True)
class _Row:
    case: int
    figure: str
    measured: float
    weight: float


class _Problem:
    """The cases, their rows, and the factors' columns: kind j // NF, field j % NF."""

    def __init__(self, cluster: ClusterSpec, config: DecoderConfig, cases: Sequence[ServingCase], weights: dict):
        self.cluster, self.config, self.cases = cluster, config, list(cases)
        self.rows = [
            _Row(i, f, getattr(c.obs.measured, f), weights[f])
            for i, c in enumerate(self.cases)
            for f in FIGURES
            if getattr(c.obs.measured, f) is not None and weights[f] > 0
        ]
        used = {k for c in self.cases for k in c.kinds}
        self.kinds = [k for k in cluster.device_kinds if k.name in used]
        self.prior = np.concatenate([_natural(k) / SCALE for k in self.kinds])
        self.lower = np.tile(LOWER / SCALE, len(self.kinds))
        self.measured = np.array([r.measured for r in self.rows])
        self.weight = np.array([r.weight for r in self.rows])
        self.figures = len({(r.case, r.figure if r.figure != "tokens_per_s" else "tpot_s") for r in self.rows})

    def values(self, x: np.ndarray) -> dict[str, dict[str, float]]:
        out = {}
        for n, kind in enumerate(self.kinds):
            c, m, step, coll, seq = x[NF * n : NF * n + NF] * SCALE
            out[kind.name] = {
                "compute_efficiency": float(1.0 / c),
                "mem_efficiency": float(1.0 / m),
                "step_overhead_s": float(step),
                "collective_overhead_s": float(coll),
                "sequence_overhead_s": float(seq),
            }
        return out

    def predict(self, x: np.ndarray) -> np.ndarray:
        cluster = with_kind_values(self.cluster, self.values(x))
        figures = [predict(cluster, self.config, case) for case in self.cases]
        return np.array([figures[r.case][r.figure] for r in self.rows])

    def error(self, predicted: np.ndarray) -> float:
        return float(np.linalg.norm(self.weight * (predicted / self.measured - 1.0)))


def _natural(kind: DeviceKindSpec) -> np.ndarray:
    """(1 / compute_efficiency, 1 / mem_efficiency, step, collective and sequence overheads) as the model reads them."""
    ce, me, step, coll, seq = _spec_values(kind)
    return np.array([1.0 / ce, 1.0 / me, step, coll, seq])


def _spec_values(kind: DeviceKindSpec) -> tuple[float, ...]:
    """The fields as the model reads them (a default where the spec states none)."""
    return (
        kind.compute_efficiency,
        kind.mem_efficiency,
        kind.serving_step_s,
        kind.collective_call_s,
        kind.serving_sequence_s,
    )


def _jacobian(problem: _Problem, x: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """d(predicted / measured) / dx by forward differences (exact within a linear piece)."""
    out = np.zeros((len(predicted), len(x)))
    for j in range(len(x)):
        h = 1e-6 * max(1.0, abs(x[j]))
        moved = x.copy()
        moved[j] += h
        out[:, j] = (problem.predict(moved) - predicted) / (h * problem.measured)
    return out


def _gauss_newton(problem: _Problem) -> tuple[np.ndarray, list[int], dict[int, str]]:
    """The fitted x, the fitted columns and why the others keep the spec's values (module docstring).

    The first pass chooses the columns the data determines, the set it ends with; the columns it
    gave up may have moved on the way, so a second pass fits that set again from the spec's values
    with the others held there (the fit `after` figures describe)."""
    x, free, kept = _iterate(problem, None)
    if not kept:
        return x, free, kept
    again, free_again, kept_again = _iterate(problem, free)
    gave_up = {j: why for j, why in kept_again.items() if j in free}  # weak in the second pass
    return again, free_again, {**kept, **gave_up}


def _iterate(problem: _Problem, only: list[int] | None) -> tuple[np.ndarray, list[int], dict[int, str]]:
    """Gauss-Newton from the spec's values over every column (only=None: bounded_fit chooses the
    set at each step) or over `only`, the others held at the spec's values."""
    x, w = problem.prior.copy(), problem.weight
    predicted = problem.predict(x)
    err = problem.error(predicted)
    free, kept = [], {}
    for _ in range(MAX_STEPS):
        new, new_free, new_kept = _linear_step(problem, x, predicted, w, only)
        step = 1.0
        while True:
            trial = x + step * (new - x)
            trial_predicted = problem.predict(trial)
            trial_err = problem.error(trial_predicted)
            if trial_err <= err * (1 + 1e-12) or step < 1e-3:
                break
            step /= 2
        if trial_err > err * (1 + 1e-12) and free:  # no step along the direction lowers the error: x is the fit
            break
        moved = np.max(np.abs(trial - x) / np.maximum(1.0, np.abs(x)))
        x, predicted, err, free, kept = trial, trial_predicted, trial_err, new_free, new_kept
        if moved < 1e-10:
            break
    x[list(kept)] = problem.prior[list(kept)]
    # A factor the damped steps left within a millionth of a unit (1 ps, 1 ns) of its bound is at it.
    x = np.where(np.abs(x - problem.lower) < AT_BOUND, problem.lower, x)
    return x, free, kept


def _linear_step(problem: _Problem, x, predicted, w, only: list[int] | None):
    """The linearised problem's bounded solution at x: over every column, or over `only`."""
    a = _jacobian(problem, x, predicted) * w[:, None]
    target = w * (1.0 - predicted / problem.measured) + a @ x
    order = [NF * n + f for f in GIVE_UP for n in range(len(problem.kinds))]
    exempt = [NF * n + 2 for n in range(len(problem.kinds))]
    if only is None:
        return bounded_fit(
            a, target, problem.prior, problem.lower, order, figures=problem.figures, exempt=exempt, what="figure"
        )
    rest = [j for j in range(len(x)) if j not in only]
    sub, sub_free, sub_kept = bounded_fit(
        a[:, only],
        target - a[:, rest] @ x[rest],
        problem.prior[only],
        problem.lower[only],
        [only.index(j) for j in order if j in only],
        figures=problem.figures,
        exempt=[only.index(j) for j in exempt if j in only],
        what="figure",
    )
    new = x.copy()
    new[only] = sub
    return new, [only[i] for i in sub_free], {only[i]: why for i, why in sub_kept.items()}


def fit_serving(
    cluster: ClusterSpec,
    config: DecoderConfig,
    cases: Sequence[ServingCase],
    weights: Mapping[str, float] | None = None,
) -> ServingCalibration:
    """Fit the serving factors of the kinds the cases ran on (module docstring); `weights`
    per figure over DEFAULT_WEIGHTS."""
    problem = _Problem(cluster, config, cases, {**DEFAULT_WEIGHTS, **(weights or {})})
    if not problem.rows:
        raise CalibrateError("no measured figure to fit")
    x, free, kept = _gauss_newton(problem)
    before, after = problem.predict(problem.prior), problem.predict(x)
    fitted = problem.values(x)
    fits = []
    for i, kind in enumerate(cluster.device_kinds):
        n = next((n for n, k in enumerate(problem.kinds) if k.name == kind.name), None)
        fits.append(_kind_fit(problem, kind, i, n, fitted, free, kept, before, after))
    figures = tuple(
        FigureError(
            source=cases[r.case].obs.source,
            replica=cases[r.case].replica,
            concurrency=cases[r.case].concurrency,
            figure=r.figure,
            measured=r.measured,
            before=float(b),
            after=float(a),
        )
        for r, b, a in zip(problem.rows, before, after)
    )
    return ServingCalibration(calibration=Calibration(kinds=tuple(fits)), figures=figures)


def _kind_fit(problem: _Problem, kind: DeviceKindSpec, i: int, n, fitted, free, kept, before, after) -> Fit:
    spec = dict(zip(FIELDS, _spec_values(kind)))
    path = ("device_kinds", i)
    if n is None:
        reasons = dict.fromkeys(FIELDS, "no observation ran on this kind")
        return Fit(
            name=kind.name,
            path=path,
            values=spec,
            before=spec,
            fitted=(),
            kept=reasons,
            samples=0,
            rel_rms_before=math.nan,
            rel_rms_after=math.nan,
        )
    cols = {f: NF * n + j for j, f in enumerate(FIELDS)}
    grouped = any(kind.name in c.grouped_kinds for c in problem.cases)
    reasons = {f: kept[c] for f, c in cols.items() if c in kept}
    if "collective_overhead_s" in reasons and not grouped:
        reasons["collective_overhead_s"] = "no observation runs a tensor-parallel group of this kind"
    mine = [k for k, r in enumerate(problem.rows) if kind.name in problem.cases[r.case].kinds]
    w = np.array([problem.rows[k].weight for k in mine])
    return Fit(
        name=kind.name,
        path=path,
        values={f: (fitted[kind.name][f] if cols[f] in free else spec[f]) for f in FIELDS},
        before=spec,
        fitted=tuple(f for f in FIELDS if cols[f] in free),
        kept=reasons,
        samples=len({problem.rows[k].case for k in mine}),
        rel_rms_before=_rel_rms(before[mine], problem.measured[mine], w),
        rel_rms_after=_rel_rms(after[mine], problem.measured[mine], w),
    )


def _rel_rms(predicted: np.ndarray, measured: np.ndarray, weights: np.ndarray) -> float:
    """The RMS of the relative errors weighted as the fit weighs them (its objective, so the fit
    does not raise it where one kind ran every observation)."""
    if not len(measured):
        return math.nan
    return float(np.sqrt(np.sum((weights * (predicted / measured - 1.0)) ** 2) / np.sum(weights**2)))


def _inferred_notes(cases: Sequence[ServingCase]) -> tuple[str, ...]:
    """One line per case whose concurrency the command read from an open loop's rate (not given)."""
    return tuple(
        f"{c.obs.source}: fitted at {c.concurrency} in flight: {c.obs.concurrency_note}"
        for c in cases
        if c.obs.concurrency_inferred and c.concurrency == c.obs.concurrency
    )


def calibrate_serving_files(
    cluster_path: str | Path,
    result_paths: Sequence[str],
    settings: ServingSettings,
    output: str | Path,
    weights: Mapping[str, float] | None = None,
) -> ServingCalibration:
    """Read the results, fit, and write the corrected spec (module docstring)."""
    cluster = load_cluster(cluster_path)
    files = [(str(p), read_serving_results(p)) for p in result_paths]
    config = model_config(settings, [o for _, obs in files for o in obs])
    cases = build_cases(cluster, config, files, settings)
    result = dataclasses.replace(fit_serving(cluster, config, cases, weights), notes=_inferred_notes(cases))
    sources = [f"{path} ({', '.join(dict.fromkeys(o.engine for o in obs))})" for path, obs in files]
    write_calibrated_spec(cluster_path, result.calibration, output, sources=sources)
    return result
