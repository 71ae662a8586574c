"""Four readings of the NIM grid's closed loop that could explain its held-out TTFTs, each scored on
the calibration runs that would have to choose it.

    .venv/bin/python benchmarks/grid_ttft_probes.py [--out DIR]

On H100 the measured TTFT of long prompts levels off past 50 in flight while the model's keeps
growing (docs/fidelity.md, "Dense models under load"). Each reading below rescored the grid's runs
that fit the model's memory (TensorRT-LLM's factor set) at every candidate token budget and front-end
time fit_grid_admission.py tries; per GPU the candidate with the most TTFT ratios within 30% on that
GPU's calibration runs is the one the reading would use (ties: the most TPOT ratios within 15%),
as fit_grid_admission.py chooses:

- `as scored`: the closed loop bench_fidelity scores (whole prompts; every request of three rounds
  counted, the cold start among them);
- `cold start left out`: the first C requests to end left out (a load generator that measures a
  window of a running load), the next 3 x C counted and tokens/s counted from the last one left out:
  the loop of 4 x C less its first C (the simulation is deterministic, so the first C are those of a
  loop of C);
- `front end a prompt token`: the front end's time a request grown by a time a prompt token
  (tokenizing), 1-6 us;
- `context chunking`: prompts cut to the budget (TensorRT-LLM's `enable_chunked_context`), budgets
  from 2,048.

Each row: the reading, its candidates chosen on the A100's and the H100's calibration runs (budget,
front end, time a prompt token), the calibration runs' TTFT share within 30% at them, the H100's
held-out runs (50-250 in flight) at the H100's candidate (TTFT median and share, TPOT and tokens/s
shares within 15%), the held-out TTFT share at the reading's best candidate for them (what no
calibration would pick), and the A100's runs of 2,000-token prompts at 50 in flight and more within
30% (the load at which H100's measured TTFT levels off). Nothing is kept: fidelity_grid's
ENGINE_BUDGETS stays as fit_grid_admission.py chose it.
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
import fit_grid_admission  # noqa: E402
import provenance  # noqa: E402

from llm_planner.serving.closed_loop import ROUNDS  # noqa: E402
from llm_planner.serving.score import closed_loop_of  # noqa: E402

PAIRS = list(product(fit_grid_admission.BUDGETS, fit_grid_admission.FRONT_ENDS_S))
PROMPT_TOKEN_S = (1e-6, 2e-6, 3e-6, 4e-6, 6e-6)
CHUNK_BUDGETS = (2048, 4096, 8192, 16384, 32768)
READINGS = ("as scored", "cold start left out", "front end a prompt token", "context chunking")
USES = {"a100": ("calibration", "a100-sxm-80g"), "h100": ("calibration", "h100-sxm-80g"), "held": ("held_out", None)}
LONG = ("2000/200", "2000/2000")
COLUMNS = ["reading", "A100 candidate", "H100 candidate", "A100 calibration TTFT within 30%"]
COLUMNS += ["H100 calibration TTFT within 30%", "held-out TTFT median", "held-out TTFT within 30%"]
COLUMNS += ["held-out TPOT within 15%", "held-out tokens/s within 15%", "held-out TTFT within 30%, best candidate"]
COLUMNS += ["A100 2,000-token prompts at 50+ within 30%"]


def _figures(got) -> dict:
    return {"tpot_s": got.tpot_s, "tokens_per_s": got.tokens_per_s, "ttft_s": got.ttft_s, "fits": True}


def _warm(ctx, model, split, c: int, budget: int, front: float) -> dict:
    """The loop of (1 + ROUNDS) x C less its first C: the requests' sums and end times differenced."""
    cold = closed_loop_of(ctx, model, split, c, rounds=1, front_end_s=front, token_budget=budget)
    both = closed_loop_of(ctx, model, split, c, rounds=1 + ROUNDS, front_end_s=front, token_budget=budget)
    n = both.requests - cold.requests
    return {
        "ttft_s": (both.ttft_s * both.requests - cold.ttft_s * cold.requests) / n,
        "tpot_s": (both.tpot_s * both.requests - cold.tpot_s * cold.requests) / n,
        "tokens_per_s": n / (both.requests / both.tokens_per_s - cold.requests / cold.tokens_per_s),
        "fits": True,
    }


def _replica(row: dict):
    with tempfile.TemporaryDirectory() as tmp:
        ctx, model = bench_fidelity.replica_of(row, fit_catalog.SERVERS, Path(tmp))
    split = model.split_layers(row["concurrency"], 1)
    return ctx, model, split


def _ratios(row: dict) -> dict | None:
    """{(reading, candidate): ratios} for one run, None where its C sequences do not fit."""
    ctx, model, split = _replica(row)
    if split is None:
        return None
    c, prompt, out = row["concurrency"], max(1, round(row["prompt_len"])), {}
    for budget, front in PAIRS:
        got = closed_loop_of(ctx, model, split, c, front_end_s=front, token_budget=budget)
        out["as scored", (budget, front, 0.0)] = fidelity_grid.ratios(row, _figures(got))
        out["cold start left out", (budget, front, 0.0)] = fidelity_grid.ratios(
            row, _warm(ctx, model, split, c, budget, front)
        )
        for per_token in PROMPT_TOKEN_S:
            got = closed_loop_of(ctx, model, split, c, front_end_s=front + per_token * prompt, token_budget=budget)
            out["front end a prompt token", (budget, front, per_token)] = fidelity_grid.ratios(row, _figures(got))
    ctx, model, split = _replica({**row, "enable_chunked_prefill": True})
    for budget, front in product(CHUNK_BUDGETS, fit_grid_admission.FRONT_ENDS_S):
        got = closed_loop_of(ctx, model, split, c, front_end_s=front, token_budget=budget)
        out["context chunking", (budget, front, 0.0)] = fidelity_grid.ratios(row, _figures(got))
    return out


def _share(runs: list[dict], key, metric: str, bar: float) -> float:
    return fidelity_grid.within([r[key][metric] for r in runs], bar)


def _chosen(runs: list[dict], keys: list) -> tuple:
    return max(keys, key=lambda k: (_share(runs, k, "ttft", 0.30), _share(runs, k, "tpot", 0.15)))


def _candidate(key) -> str:
    (budget, front, per_token) = key[1]
    text = f"{budget}, {front * 1e3:g} ms"
    return text + (f", {per_token * 1e6:g} us a prompt token" if per_token else "")


def table_row(reading: str, runs: dict, rows: dict) -> list[str]:
    keys = [k for k in runs["a100"][0] if k[0] == reading]
    a100, h100 = _chosen(runs["a100"], keys), _chosen(runs["h100"], keys)
    held = runs["held"]
    long = [r for row, r in zip(rows["a100"], runs["a100"]) if row["size"] in LONG and row["concurrency"] >= 50]
    best = max(_share(held, k, "ttft", 0.30) for k in keys)
    return [
        reading,
        _candidate(a100),
        _candidate(h100),
        f"{_share(runs['a100'], a100, 'ttft', 0.30):.0%}",
        f"{_share(runs['h100'], h100, 'ttft', 0.30):.0%}",
        f"{statistics.median(r[h100]['ttft'] for r in held):.2f}",
        f"{_share(held, h100, 'ttft', 0.30):.0%}",
        f"{_share(held, h100, 'tpot', 0.15):.0%}",
        f"{_share(held, h100, 'tokens_per_s', 0.15):.0%}",
        f"{best:.0%}",
        f"{sum(abs(r[a100]['ttft'] - 1) <= 0.30 for r in long)} of {len(long)}",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(fit_catalog.results_dir("grid_ttft_probes", "a100-sxm-80g")))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    rows = {name: fit_catalog.grid_runs(use, gpu) for name, (use, gpu) in USES.items()}
    with Pool(2) as pool:
        scored = {name: pool.map(_ratios, found, chunksize=4) for name, found in rows.items()}
    fits = {name: [i for i, r in enumerate(scored[name]) if r is not None] for name in rows}
    runs = {name: [scored[name][i] for i in fits[name]] for name in rows}
    kept = {name: [rows[name][i] for i in fits[name]] for name in rows}
    table = [table_row(reading, runs, kept) for reading in READINGS]
    provenance.publish(args.out, COLUMNS, table, facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
