"""Fit the two settings that decide how the NIM grid's requests reach and enter its engine, which the
source does not state, on the grid's calibration runs, and show what each candidate gives the
held-out runs.

    .venv/bin/python benchmarks/fit_grid_admission.py [--gpu a100-sxm-80g|h100-sxm-80g] [--out DIR]

The grid (benchmarks/fidelity_grid.py) is scored as the closed loop genai-perf ran: C requests sent
at once, each resent as it ends (llm_planner.serving.closed_loop). Two settings shape it:

- the engine's token budget an iteration (TensorRT-LLM's `max_num_tokens`; context chunking off, so
  prompts go whole): it decides how many iterations a burst of prompts takes;
- the front end's time a request: NIM's server receives, tokenizes and hands requests to the
  engine one at a time, so C requests sent together reach the engine spread over C times it. A
  burst that arrives spread out is taken in the iterations it arrives in, and later requests wait
  less for the prompts ahead of them; at 1 in flight the time is added to every TTFT.

The source states neither (nor the engine's version or build settings; TensorRT-LLM's BuildConfig
defaults to a budget of 8,192), and NIM builds its engines per GPU. So both are fitted as factors of
the engine on one GPU (`--gpu`): each pair of candidates (budgets, powers of two from 8,192;
front-end times 0 to 6 ms) scores every calibration run of that GPU that fits the model's memory
(fidelity_grid.use_of: every A100 run; the H100 runs below 32 in flight), and the pair with the most
TTFT ratios within 30% is kept (ties: the most TPOT ratios within 15%). The held-out runs (H100 at
50-250 in flight, every fp8 run there among them) are scored at each pair beside it, to judge the
choice, not to make it. fidelity_grid's ENGINE_BUDGETS states each GPU's kept pair.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from itertools import product
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_fidelity  # noqa: E402
import fidelity_grid  # noqa: E402
import fit_catalog  # noqa: E402
import provenance  # noqa: E402

from llm_planner.serving.score import closed_loop_of  # noqa: E402

BUDGETS = (8192, 16384, 32768, 65536)
FRONT_ENDS_S = (0.0, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006)
COLUMNS = ["budget", "front end ms", "runs", "use", "TTFT median", "TTFT within 30%", "TPOT median"]
COLUMNS += ["TPOT within 15%", "tokens/s median", "tokens/s within 15%", "kept"]
BARS = {"ttft": 0.30, "tpot": 0.15, "tokens_per_s": 0.15}


def _ratios(row: dict) -> dict | None:
    """Per budget and front-end time, the run's ratios model / measured (None where C does not fit):
    the replica's split and iteration times are the same at every pair, so they are built once and
    each pair's budget is passed to the closed loop."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx, model = bench_fidelity.replica_of(row, fit_catalog.SERVERS, Path(tmp))
    c = row["concurrency"]
    split = model.split_layers(c, 1)
    if split is None:
        return None
    out = {}
    for budget, front in product(BUDGETS, FRONT_ENDS_S):
        got = closed_loop_of(ctx, model, split, c, front_end_s=front, token_budget=budget)
        figures = {"tpot_s": got.tpot_s, "tokens_per_s": got.tokens_per_s, "ttft_s": got.ttft_s, "fits": True}
        out[budget, front] = fidelity_grid.ratios(row, figures)
    return out


def judged(per_run: list[dict | None], pair: tuple[int, float]) -> dict:
    """The ratios' medians and shares within their bars at one (budget, front end), over the runs that fit."""
    ratios = [r[pair] for r in per_run if r is not None]
    out = {"pair": pair, "runs": len(ratios)}
    for metric, bar in BARS.items():
        vals = [x[metric] for x in ratios]
        out[metric] = (statistics.median(vals), fidelity_grid.within(vals, bar))
    return out


def kept(calibration: list[dict]) -> tuple[int, float]:
    """The pair with the most TTFT ratios within 30%, then the most TPOT ratios within 15%."""
    return max(calibration, key=lambda j: (j["ttft"][1], j["tpot"][1]))["pair"]


def table_row(j: dict, use: str, best: tuple[int, float]) -> list[str]:
    cells = [cell for m in BARS for cell in (f"{j[m][0]:.2f}", f"{j[m][1]:.0%}")]
    budget, front = j["pair"]
    return [str(budget), f"{front * 1e3:g}", str(j["runs"]), use, *cells, "yes" if j["pair"] == best else ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", choices=tuple(fidelity_grid.ENGINE_BUDGETS), default="a100-sxm-80g")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/fit_grid_admission[_h100]")
    args = ap.parse_args()
    out = args.out or fit_catalog.results_dir("fit_grid_admission", args.gpu)
    facts = provenance.start(sys.argv)
    pairs = list(product(BUDGETS, FRONT_ENDS_S))
    with Pool(2) as pool:
        mine = {
            "calibration": fit_catalog.grid_runs("calibration", args.gpu),
            "held_out": fit_catalog.grid_runs("held_out"),
        }
        per_use = {use: pool.map(_ratios, rows, chunksize=4) for use, rows in mine.items()}
    calibration = [judged(per_use["calibration"], p) for p in pairs]
    best = kept(calibration)
    lines = [table_row(j, "calibration", best) for j in calibration]
    lines += [table_row(judged(per_use["held_out"], p), "held_out", best) for p in pairs]
    print(f"kept for {args.gpu}: budget {best[0]} tokens, front end {best[1] * 1e3:g} ms a request")
    provenance.publish(out, COLUMNS, lines, facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
