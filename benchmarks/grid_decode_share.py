"""Where the NIM grid's TPOT under load sits against the model's pure decode step, and how much
prompt work lands in it: measured and modelled.

    .venv/bin/python benchmarks/grid_decode_share.py [--out DIR]

For every run of the NIM grid (benchmarks/fidelity_grid.py: TensorRT-LLM under NIM, genai-perf's
closed loop; A100 runs calibration, H100 runs at 50-250 in flight held out) with 100 to 250 in
flight whose sequences fit the model's memory, it takes the model's pure decode step D at the run's
concurrency (one iteration of C decodes at the mean context, no prompt work:
`ReplicaModel.decode_step_s`, TensorRT-LLM's factor set) and sets beside it

    measured TPOT / D     what the engine's TPOT holds beyond the model's decode step
    modelled TPOT / D     the same for the model's TPOT, the closed loop as bench_fidelity scores it

per GPU, precision and request shape (medians over the tensor-parallel degrees, models and
concurrencies). With 200-token prompts the prompt work per output token is 1 (200/200), 0.2
(200/1000) and 0.1 (200/2000) tokens: how the ratio grows from 200/2000 to 200/200 is how much of the
prompts' time a TPOT carries, in the engine and in the model; what it is at 200/2000 is mostly how
far the decode step itself is from the engine's. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import statistics
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

from llm_planner.serving.score import queued_split  # noqa: E402

LOADED = (100, 250)  # sequences in flight: the loaded end of the grid, in the range
COLUMNS = ["gpu", "precision", "prompt/output", "runs", "measured TPOT / decode step", "model TPOT / decode step"]


def _scored(row: dict) -> dict | None:
    """The run's decode step and modelled closed-loop TPOT, or None where memory does not hold it."""
    with tempfile.TemporaryDirectory() as tmp:
        _, model = bench_fidelity.replica_of(row, fit_catalog.SERVERS, Path(tmp))
        split, running = queued_split(model, row["concurrency"])
        if running != row["concurrency"]:
            return None
        got = bench_fidelity.score(row, fit_catalog.SERVERS, Path(tmp))
        step = model.decode_step_s(split, row["concurrency"], 1)
    return {"measured": row["tpot_s"] / step, "model": got["tpot_s"] / step}


def lines(rows: list[dict], got: list[dict | None]) -> list[list[str]]:
    cells = defaultdict(list)
    for row, g in zip(rows, got):
        if g is not None:
            cells[(row["gpu"], row["precision"], row["size"])].append(g)
    out = []
    for (gpu, precision, size), found in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], _shape(kv[0][2]))):
        measured = statistics.median(g["measured"] for g in found)
        model = statistics.median(g["model"] for g in found)
        out.append([gpu, precision, size, str(len(found)), f"{measured:.2f}", f"{model:.2f}"])
    return out


def _shape(size: str) -> tuple[int, int]:
    prompt, output = size.split("/")
    return int(prompt), -int(output)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "grid_decode_share"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    rows = fidelity_grid.grid_rows(fit_catalog.DATA / fit_catalog.REFS["grid_file"])
    rows = [r for r in rows if LOADED[0] <= r["concurrency"] <= LOADED[1]]
    with Pool(2) as pool:
        got = pool.map(_scored, rows, chunksize=4)
    table = lines(rows, got)
    provenance.publish(args.out, COLUMNS, table, facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
