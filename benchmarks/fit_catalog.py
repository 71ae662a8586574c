"""Fit the GPU catalog's serving factors on the calibration runs, and print how they score them.

    .venv/bin/python benchmarks/fit_catalog.py [--out DIR]

The catalog's (llm_planner/core/data/gpu_catalog.yaml) memory efficiency, step overhead,
per-call collective overhead and time per sequence are fitted together, one value of each for the
A100 and H100 entries (which the other entries take until measured), on two calibration sources
weighted alike (each run's squared error by 1 / the runs of its source):

- the `calibration` rows of benchmarks/data/fidelity_references.yaml on A100 and H100 (vLLM,
  Llama-3 8B and 70B at TP1-TP8, 10 in flight);
- the NIM grid's runs on A100 (benchmarks/fidelity_grid.py: TensorRT-LLM, Llama-3 8B at TP1-TP2
  and 70B at TP4-TP8, 1 to 250 in flight; those the model fits in memory), scored in the steady
  state (`grid_rows(closed_loop=False)`): the catalog was fitted so before the grid was scored as
  the closed loop it ran in, and is not refitted under it here (that would move every figure the
  catalog gives; TensorRT-LLM's own set, benchmarks/fit_engine.py, is fitted under it).

Everything else stays held out: the grid's H100 runs (every fp8 run among them; those at 1 to 25
in flight calibrate TensorRT-LLM's own set, benchmarks/fit_engine.py, not the catalog), the static
batches, the vLLM 0.6.0 rows, NIM 1.8's rows, vLLM's nightly A100 rows and the DeepSeek-R1 rows.
The compute efficiency (0.67, Vidur's large GEMMs) and the collectives' bandwidth share (Vidur's
NCCL profiles) are not refitted. The fit minimises the weighted relative TPOT errors by
Gauss-Newton: the model's TPOT over the four factors by forward differences, each linearised step
solved with bounds (efficiency at most 1, times at least 0), a step that does not lower the error
halved. Then the H200's memory efficiency is fitted alone on its three calibration rows (vLLM's
nightly latency tests on one H200: end-to-end time), the least largest error, with the other
factors at their fitted values; and the MI300X's memory efficiency and step overhead together on
its six calibration rows (InferenceX's DeepSeek-R1 on 8x MI300X under SGLang, 4 and 64 in flight at
each of its three prompt/output lengths: its only public serving runs), by the same Gauss-Newton
on their TPOT, the other two factors at the fitted values. It prints the fitted factors and, per
source, the TPOT ratios (model / measured) with the catalog's factors and with the fitted ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import lsq_linear

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench_fidelity  # noqa: E402
import fidelity_grid  # noqa: E402
import provenance  # noqa: E402

from llm_planner.core.catalog import catalog_entry  # noqa: E402

DATA = REPO / "benchmarks" / "data"
# The fitted factors: (field, its unit in the fit, the unit's name, the forward difference in it)
FACTORS = (
    ("mem_efficiency", 1.0, "", 0.01),  # fitted as its inverse
    ("step_overhead_s", 1e-3, "ms", 0.05),
    ("collective_overhead_s", 1e-6, "us", 1.0),
    ("sequence_overhead_s", 1e-6, "us", 1.0),
)
# The W8A8 linear layers' fixed time per decoder layer, fitted as a fifth factor where fp8 runs
# calibrate (fit_engine.py on H100); the catalog's fit has none and leaves it unset.
W8A8_FACTOR = ("w8a8_overhead_s", 1e-6, "us", 1.0)
# Decode attention's least time per key of a sequence, fitted with one engine's factors on request
# (fit_engine.py --fit-decode-key); no fit the catalog or a set takes has it.
DECODE_KEY_FACTOR = ("decode_key_s", 1e-9, "ns", 1.0)
FITTED_GPUS = ("a100-sxm-40g", "a100-sxm-80g", "h100-sxm-80g")
MAX_STEPS = 8
COLUMNS = ["source", "runs", "factors", "tpot median", "tpot within 15%", "tpot rms error"]
SERVERS = yaml.safe_load((DATA / "fidelity_servers.yaml").read_text())
REFS = yaml.safe_load((DATA / "fidelity_references.yaml").read_text())


def calibration_runs() -> dict[str, list[dict]]:
    """The two calibration sources' runs (module docstring), measured TPOT in `tpot_s`."""
    vllm = [r for r in REFS["serving"] if r["use"] == "calibration" and r.get("tpot_s") and r["gpu"] in FITTED_GPUS]
    grid = [
        r
        for r in fidelity_grid.grid_rows(DATA / REFS["grid_file"], closed_loop=False)
        if r["gpu"] in fidelity_grid.CALIBRATION_GPUS
    ]
    return {"vLLM, 10 in flight": vllm, "NIM grid, A100": grid}


def grid_runs(use: str, gpu: str | None = None, closed_loop: bool = True) -> list[dict]:
    """The NIM grid's runs of `use` (fidelity_grid.use_of), on `gpu` alone where given, scored as the
    closed loop or in the steady state (fidelity_grid.grid_rows)."""
    rows = fidelity_grid.grid_rows(DATA / REFS["grid_file"], closed_loop)
    return [r for r in rows if r["use"] == use and gpu in (None, r["gpu"])]


# A fit run on one GPU's grid runs writes benchmarks/results/<name><suffix> (the A100's has none).
RESULTS_SUFFIX = {"h100-sxm-80g": "_h100"}


def results_dir(name: str, gpu: str) -> Path:
    """Where a fit named `name` run on `gpu`'s grid runs writes its results by default."""
    return REPO / "benchmarks" / "results" / f"{name}{RESULTS_SUFFIX.get(gpu, '')}"


def h200_rows() -> list[dict]:
    return [r for r in REFS["serving"] if r["use"] == "calibration" and r["gpu"] == "h200-sxm-141g"]


def mi300x_rows() -> list[dict]:
    return [r for r in REFS["serving"] if r["use"] == "calibration" and r["gpu"] == "mi300x"]


def fields_of(x: np.ndarray, factors: tuple = FACTORS) -> dict:
    """The kind fields of the fit's vector over `factors` (natural units: 1 / efficiency, ms, us, us)."""
    out = {}
    for (name, unit, _, _), v in zip(factors, x):
        out[name] = float(1.0 / v) if name == "mem_efficiency" else float(v * unit)
    return out


def _score(job: tuple[dict, dict | None]) -> dict:
    row, fields = job
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(bench_fidelity.cluster_yaml(row["gpu"], row["num_gpus"], SERVERS, fields))
        return bench_fidelity.score(row, SERVERS, Path(tmp), spec)


def scores(pool, rows: list[dict], fields: dict | None) -> list[dict]:
    """The model's figures for each row, with `fields` over its catalog entry (None: the catalog)."""
    return pool.map(_score, [(r, fields) for r in rows], chunksize=8)


class Problem:
    """The calibration runs that fit in memory, their weights, and the TPOT ratios at a vector."""

    def __init__(self, pool, sources: dict[str, list[dict]], factors: tuple = FACTORS):
        self.pool, self.factors = pool, factors
        before = {name: scores(pool, rows, None) for name, rows in sources.items()}
        self.sources = {n: [r for r, g in zip(rows, before[n]) if g["fits"]] for n, rows in sources.items()}
        self.rows = [r for rows in self.sources.values() for r in rows]
        self.weight = np.concatenate([np.full(len(rows), len(rows) ** -0.5) for rows in self.sources.values()])
        self.measured = np.array([r["tpot_s"] for r in self.rows])

    def fields_of(self, x: np.ndarray) -> dict:
        return fields_of(x, self.factors)

    def ratios(self, x: np.ndarray | None) -> np.ndarray:
        got = scores(self.pool, self.rows, None if x is None else self.fields_of(x))
        return np.array([g["tpot_s"] for g in got]) / self.measured


def gauss_newton(ratios_of, weight: np.ndarray, x: np.ndarray, deltas: np.ndarray, lower: np.ndarray, show):
    """The fitted vector from x and its TPOT ratios (module docstring): `ratios_of(x)` the model's
    TPOT over the measured per row, `weight` each row's, `deltas` the forward differences,
    `lower` the bounds, `show(x)` what each step prints."""

    def error(r: np.ndarray) -> float:
        return float(np.linalg.norm(weight * (r - 1.0)))

    ratios = ratios_of(x)
    err = error(ratios)
    for step_no in range(MAX_STEPS):
        jac = np.column_stack([(ratios_of(x + d) - ratios) / d[j] for j, d in enumerate(np.diag(deltas))])
        a = jac * weight[:, None]
        target = weight * (1.0 - ratios) + a @ x
        new = lsq_linear(a, target, bounds=(lower, np.inf)).x
        step = 1.0
        while step >= 1 / 16:
            trial = x + step * (new - x)
            trial_ratios = ratios_of(trial)
            if error(trial_ratios) < err:
                break
            step /= 2
        else:
            break
        moved = np.max(np.abs(trial - x) / np.maximum(1.0, np.abs(x)))
        x, ratios, err = trial, trial_ratios, error(trial_ratios)
        print(f"step {step_no}: error {err:.4f} at {show(x)}", flush=True)
        if moved < 1e-3:
            break
    return x, ratios


def h200_efficiency(pool, fields: dict) -> tuple[float, list[float]]:
    """The H200's memory efficiency with the other factors at `fields`: the least largest error of
    its three calibration rows' end-to-end time, over 0.50-0.80 in steps of 0.01."""
    rows = h200_rows()
    best = None
    for eff in np.arange(0.50, 0.805, 0.01):
        got = scores(pool, rows, {**fields, "mem_efficiency": round(float(eff), 2)})
        r = [g["e2e_s"] / row["e2e_s"] for g, row in zip(got, rows)]
        worst = max(abs(np.log(v)) for v in r)
        if best is None or worst < best[0]:
            best = (worst, round(float(eff), 2), r)
    return best[1], best[2]


def mi300x_fit(pool, fields: dict) -> tuple[dict, list[float]]:
    """The MI300X's memory efficiency and step overhead with the other factors at `fields` (module
    docstring): `gauss_newton` on its calibration rows' TPOT (those the model fits in memory), as
    (1 / efficiency, ms), from the A100/H100 fit's values."""
    rows = [r for r, g in zip(mi300x_rows(), scores(pool, mi300x_rows(), fields)) if g["fits"]]
    measured = np.array([r["tpot_s"] for r in rows])

    def mine(x: np.ndarray) -> dict:
        return {"mem_efficiency": float(1 / x[0]), "step_overhead_s": float(x[1] * 1e-3)}

    def ratios(x: np.ndarray) -> np.ndarray:
        return np.array([g["tpot_s"] for g in scores(pool, rows, {**fields, **mine(x)})]) / measured

    x0 = np.array([1 / fields["mem_efficiency"], fields["step_overhead_s"] * 1e3])
    deltas, lower = np.array([0.05, 0.5]), np.array([1.0, 0.0])
    x, r = gauss_newton(ratios, np.ones(len(rows)), x0, deltas, lower, mine)
    return mine(x), [float(v) for v in r]


def fit_factors(problem: Problem) -> tuple[np.ndarray, dict]:
    """`problem`'s factors fitted on its runs from the catalog's A100 values (0 for a time the entry
    states none of): the vector and its kind fields."""
    factors = problem.factors
    deltas = np.array([d for _, _, _, d in factors])
    lower = np.array([1.0 if name == "mem_efficiency" else 0.0 for name, _, _, _ in factors])
    x, _ = gauss_newton(problem.ratios, problem.weight, start_vector(factors), deltas, lower, problem.fields_of)
    return x, problem.fields_of(x)


def summary_rows(problem: Problem, x0: np.ndarray | None, x: np.ndarray) -> list[dict]:
    out = []
    for label, vec in (("catalog", x0), ("fitted", x)):
        ratios = problem.ratios(vec)
        start = 0
        for name, rows in problem.sources.items():
            r = ratios[start : start + len(rows)]
            start += len(rows)
            out.append(
                {
                    "source": name,
                    "runs": len(rows),
                    "factors": label,
                    "tpot median": f"{statistics.median(r):.2f}",
                    "tpot within 15%": f"{np.mean(np.abs(r - 1) <= 0.15):.0%}",
                    "tpot rms error": f"{np.sqrt(np.mean((r - 1) ** 2)):.3f}",
                }
            )
    return out


def start_vector(factors: tuple = FACTORS) -> np.ndarray:
    """The catalog's A100 values as the fit's vector over `factors` (0 for a time it states none of)."""
    entry = catalog_entry("a100-sxm-80g")
    return np.array(
        [1.0 / entry[name] if name == "mem_efficiency" else entry.get(name, 0.0) / unit for name, unit, _, _ in factors]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fit_catalog"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    with Pool(2) as pool:
        problem = Problem(pool, calibration_runs())
        x, fitted = fit_factors(problem)
        h200, h200_ratios = h200_efficiency(pool, fitted)
        mi300x, mi300x_ratios = mi300x_fit(pool, fitted)
        rows = summary_rows(problem, None, x)
    shown = {
        name: (v if name == "mem_efficiency" else v / unit) for (name, unit, _, _), v in zip(FACTORS, fitted.values())
    }
    print(
        "fitted (A100, H100):",
        ", ".join(f"{n} {v:.3g} {u}".rstrip() for (n, _, u, _), v in zip(FACTORS, shown.values())),
    )
    print(f"H200 mem_efficiency {h200:.2f}: end-to-end ratios {', '.join(f'{r:.2f}' for r in h200_ratios)}")
    shown_ratios = ", ".join(f"{r:.2f}" for r in mi300x_ratios)
    step_ms = mi300x["step_overhead_s"] * 1e3
    print(
        f"MI300X mem_efficiency {mi300x['mem_efficiency']:.2f}, step_overhead {step_ms:.1f} ms: "
        f"TPOT ratios {shown_ratios}"
    )
    print(provenance.markdown_table(COLUMNS, ([r[c] for c in COLUMNS] for r in rows)))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    provenance.write_results(args.out, COLUMNS, rows, facts)
    fit = {**fitted, "h200_mem_efficiency": h200, **{f"mi300x_{k}": v for k, v in mi300x.items()}}
    (Path(args.out) / "fit.json").write_text(json.dumps(fit, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
