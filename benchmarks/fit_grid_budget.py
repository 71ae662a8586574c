"""Fit the token budget the NIM grid's engine ran at, which its source does not state, on the grid's
calibration runs, and show what each candidate gives the held-out runs.

    .venv/bin/python benchmarks/fit_grid_budget.py [--out DIR]

The grid (benchmarks/fidelity_grid.py) is scored as the closed loop genai-perf ran: C requests sent
at once, each resent as it ends, every iteration carrying the waiting prompts whole within the
engine's token budget (TensorRT-LLM's `max_num_tokens`; context chunking off). The budget decides how
a burst of prompts spreads over iterations: within one iteration every request of the burst gets
its first token at the burst's end and the C sequences stay in step for good; spread over several,
the requests split into cohorts that end apart, and later bursts are smaller. The source states
neither the engine's version nor its build settings; TensorRT-LLM's BuildConfig defaults to 8,192,
which NIM's engines need not keep.

So the budget is fitted as one more factor of the engine: each candidate (powers of two from 8,192)
scores the grid's calibration runs (A100) whose burst, C x prompt tokens, exceeds the smallest
candidate (on the others every candidate schedules alike); the one with the most TTFT ratios within
30% is kept (ties: the most TPOT ratios within 15%). The held-out runs (H100, every fp8 run among
them) are scored at each candidate beside it, to judge the choice, not to make it. fidelity_grid's
ENGINE_BUDGET states the kept value.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]

import bench_fidelity  # noqa: E402
import fidelity_grid  # noqa: E402
import fit_catalog  # noqa: E402
import provenance  # noqa: E402

CANDIDATES = (8192, 16384, 32768, 65536)
COLUMNS = ["budget", "runs", "use", "TTFT median", "TTFT within 30%", "TPOT median", "TPOT within 15%"]
COLUMNS += ["tokens/s median", "tokens/s within 15%", "kept"]
BARS = {"ttft": 0.30, "tpot": 0.15, "tokens_per_s": 0.15}


def burst_rows(use: str) -> list[dict]:
    """The grid's runs of `use` whose burst exceeds the smallest candidate, scored as the closed loop."""
    rows = fidelity_grid.grid_rows(fit_catalog.DATA / fit_catalog.REFS["grid_file"])
    return [r for r in rows if r["use"] == use and r["concurrency"] * r["prompt_len"] > min(CANDIDATES)]


def _score(row: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return bench_fidelity.score(row, fit_catalog.SERVERS, Path(tmp))


def judged(pool, rows: list[dict], budget: int) -> dict:
    """The ratios' medians and shares within their bars, at `budget`, over the runs that fit."""
    got = pool.map(_score, [{**r, "max_num_batched_tokens": budget} for r in rows], chunksize=4)
    ratios = [fidelity_grid.ratios(r, g) for r, g in zip(rows, got)]
    ratios = [x for x in ratios if x is not None]
    out = {"budget": budget, "runs": len(ratios)}
    for metric, bar in BARS.items():
        vals = np.array([x[metric] for x in ratios])
        out[metric] = (statistics.median(vals), float(np.mean(np.abs(vals - 1) <= bar)))
    return out


def kept(calibration: list[dict]) -> int:
    """The candidate with the most TTFT ratios within 30%, then the most TPOT ratios within 15%."""
    return max(calibration, key=lambda j: (j["ttft"][1], j["tpot"][1]))["budget"]


def table_row(j: dict, use: str, best: int) -> list[str]:
    cells = [cell for m in BARS for cell in (f"{j[m][0]:.2f}", f"{j[m][1]:.0%}")]
    return [str(j["budget"]), str(j["runs"]), use, *cells, "yes" if j["budget"] == best else ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fit_grid_budget"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    with Pool(2) as pool:
        cal_rows, held_rows = burst_rows("calibration"), burst_rows("held_out")
        calibration = [judged(pool, cal_rows, b) for b in CANDIDATES]
        best = kept(calibration)
        held = [judged(pool, held_rows, b) for b in CANDIDATES]
    lines = [table_row(j, "calibration", best) for j in calibration]
    lines += [table_row(j, "held_out", best) for j in held]
    print(f"kept budget: {best} tokens")
    print(provenance.markdown_table(COLUMNS, lines))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    provenance.write_results(args.out, COLUMNS, [dict(zip(COLUMNS, line)) for line in lines], facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
