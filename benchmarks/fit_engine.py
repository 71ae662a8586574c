"""Fit one engine's serving factors on that engine's runs alone, and judge them on its held-out runs.

    .venv/bin/python benchmarks/fit_engine.py [--fit-on steady|closed-loop] [--out DIR]

The catalog's own factors (benchmarks/fit_catalog.py) are a compromise of two engines: vLLM at 10
in flight and TensorRT-LLM under NIM at 1 to 250. This script fits the same four factors (memory
efficiency, step overhead, per-call collective overhead, time per sequence) on TensorRT-LLM's
calibration runs alone, the NIM grid's runs on A100 (benchmarks/fidelity_grid.py, those the model
fits in memory), by the same Gauss-Newton from the catalog's A100 values (fit_catalog.gauss_newton).
The set was fitted on them scored in the steady state (`--fit-on steady`, the default, which
reproduces it), before the grid was scored as the closed loop genai-perf ran (fidelity_grid); fitted
on them scored as that closed loop (`--fit-on closed-loop`) the held-out runs come out worse
(docs/fidelity.md), so the set stays as fitted.
The fitted values, rounded, are the `tensorrt-llm` set of llm_planner/core/data/engine_factors.yaml,
which a spec's kind takes with `engine: tensorrt-llm` (docs/cluster-spec.md).

It then scores the grid's held-out runs (H100, every fp8 run among them; as the closed loop) with
the catalog's factors and with the fitted ones, and prints per set the TPOT and output tokens/s
ratios (model / measured): median and share within 15%, over every run and over those at 32-256 in
flight (the issue's range).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]

import fidelity_grid  # noqa: E402
import fit_catalog  # noqa: E402
import provenance  # noqa: E402

COLUMNS = ["factors", "runs", "in flight", "metric", "median", "within 15%"]
METRICS = (("tpot_s", "tpot_s", "TPOT"), ("tokens_per_s", "output_tokens_per_s", "output tokens/s"))
RANGES = ((1, 250, "1-250"), (*fidelity_grid.ISSUE_RANGE, "32-256"))


def grid_runs(use: str, closed_loop: bool = True) -> list[dict]:
    rows = fidelity_grid.grid_rows(fit_catalog.DATA / fit_catalog.REFS["grid_file"], closed_loop)
    return [r for r in rows if r["use"] == use]


def judged(label: str, rows: list[dict], got: list[dict]) -> list[dict]:
    """Per range and metric: the runs that fit memory, the median ratio and the share within 15%."""
    out = []
    for low, high, name in RANGES:
        both = [(r, g) for r, g in zip(rows, got) if g["fits"] and low <= r["concurrency"] <= high]
        for model_key, measured_key, metric in METRICS:
            ratios = np.array([g[model_key] / r[measured_key] for r, g in both])
            out.append(
                {
                    "factors": label,
                    "runs": len(ratios),
                    "in flight": name,
                    "metric": metric,
                    "median": f"{statistics.median(ratios):.2f}",
                    "within 15%": f"{np.mean(np.abs(ratios - 1) <= 0.15):.0%}",
                }
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--fit-on",
        choices=("steady", "closed-loop"),
        default="steady",
        help="how the calibration runs are scored in the fit (module docstring; default: steady, the set's own)",
    )
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fit_engine"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    with Pool(2) as pool:
        calibration = grid_runs("calibration", closed_loop=args.fit_on == "closed-loop")
        problem = fit_catalog.Problem(pool, {"NIM grid, A100": calibration})
        _, fitted = fit_catalog.fit_factors(problem)
        held = grid_runs("held_out")
        rows = judged("catalog", held, fit_catalog.scores(pool, held, None))
        rows += judged("tensorrt-llm, fitted", held, fit_catalog.scores(pool, held, fitted))
    print("tensorrt-llm fitted:", ", ".join(f"{k} {v:.4g}" for k, v in fitted.items()))
    print(provenance.markdown_table(COLUMNS, ([r[c] for c in COLUMNS] for r in rows)))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    provenance.write_results(args.out, COLUMNS, rows, facts)
    (Path(args.out) / "fit.json").write_text(json.dumps({"tensorrt-llm": fitted}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
