"""How much faster the NIM grid's engine runs on H100 than on A100, against how much faster the model
says it runs: the A100 / H100 TPOT ratio of each pair of runs alike but for the GPU, by load.

    .venv/bin/python benchmarks/grid_gpu_ratio.py [--out DIR]

The grid (benchmarks/fidelity_grid.py: TensorRT-LLM under NIM, genai-perf's closed loop) ran every
16-bit configuration on both GPUs (Llama-3 8B at TP1-TP2, 70B at TP4-TP8; the 70B at TP8 in bf16 on
A100 and fp16 on H100, the same width). For each pair whose sequences fit the model's memory on
both, it divides the A100 run's TPOT by the H100 run's, measured and as bench_fidelity scores them
(TensorRT-LLM's factor set, each GPU's values fitted on its own calibration runs; the closed loop at
each GPU's token budget and front end). One line per model, degree and request shape, one cell per concurrency:
"measured / model". Where the model's ratio falls short of the measured, the model's H100 time is
too long against its A100 time. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]

import bench_fidelity  # noqa: E402
import fidelity_grid  # noqa: E402
import fit_catalog  # noqa: E402
import provenance  # noqa: E402

GPUS = ("a100-sxm-80g", "h100-sxm-80g")
CONCURRENCIES = (1, 10, 50, 100, 150, 200, 250)
COLUMNS = ["model", "tp", "prompt/output", *(f"c{c}" for c in CONCURRENCIES)]


def _key(row: dict) -> tuple:
    """What a run shares with its twin on the other GPU."""
    return row["model"], row["tp"], row["size"], row["concurrency"]


def pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(A100 run, H100 run) of every 16-bit configuration the grid ran on both GPUs."""
    by_gpu = {gpu: {_key(r): r for r in rows if r["gpu"] == gpu and r["precision"] != "fp8"} for gpu in GPUS}
    return [(a, by_gpu[GPUS[1]][k]) for k, a in by_gpu[GPUS[0]].items() if k in by_gpu[GPUS[1]]]


def _tpot(row: dict) -> float | None:
    with tempfile.TemporaryDirectory() as tmp:
        got = bench_fidelity.score(row, fit_catalog.SERVERS, Path(tmp))
    return got["tpot_s"] if got["fits"] else None


def _ratios(pair: tuple[dict, dict]) -> tuple[float, float] | None:
    """(measured, modelled) A100 / H100 TPOT of a pair, or None where either does not fit."""
    a100, h100 = pair
    modelled = _tpot(a100), _tpot(h100)
    if None in modelled:
        return None
    return a100["tpot_s"] / h100["tpot_s"], modelled[0] / modelled[1]


def lines(found: list[tuple[tuple[dict, dict], tuple[float, float] | None]]) -> list[list[str]]:
    cells = defaultdict(dict)
    for (a100, _), got in found:
        if got is not None:
            cells[(a100["model"].split("/")[-1], a100["tp"], a100["size"])][a100["concurrency"]] = got
    out = []
    for (model, tp, size), by_c in sorted(cells.items()):
        row = [model, str(tp), size]
        row += [f"{by_c[c][0]:.2f} / {by_c[c][1]:.2f}" if c in by_c else "-" for c in CONCURRENCIES]
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "grid_gpu_ratio"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    rows = fidelity_grid.grid_rows(fit_catalog.DATA / fit_catalog.REFS["grid_file"])
    todo = [p for p in pairs(rows) if p[0]["concurrency"] in CONCURRENCIES]
    with Pool(2) as pool:
        got = pool.map(_ratios, todo, chunksize=4)
    table = lines(list(zip(todo, got)))
    provenance.publish(args.out, COLUMNS, table, facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
