"""Read the fp8 runs of two TensorRT-LLM references three ways, to see what their KV cache was: held
in 16 bits, held and read in 8 bits, or held in 8 bits and read at the 16-bit cache's time.

    .venv/bin/python benchmarks/fp8_cache_readings.py [--out DIR]

Neither source states the engine's KV cache dtype for its fp8 runs. The two readings the model had
(`kv_cache_dtype` auto or fp8) tie memory and time together; a device kind's `kv_dequant_factor`
(docs/cluster-spec.md) parts them: 2 holds an fp8 cache at 1 byte an element and times attention's
reads of it at 2 (an engine whose attention gains no time from the 8-bit cache).

- The NIM grid's fp8 runs (benchmarks/fidelity_grid.py: every one on H100, those at 50-250 in flight
  held out and those at 1-25 among the runs the H100's factors are fitted on; TensorRT-LLM's factor
  set; scored as the closed loop genai-perf ran), which the grid scores with a 16-bit cache.
- TensorRT-LLM 0.9.0's static fp8 batches (benchmarks/fidelity_static.py: the kernels alone, held
  out, the catalog's factors), which it scores with an fp8 cache read at its bytes.

Per reading it prints the runs whose concurrency fits the model's memory, their ratios' medians
(model / measured) and shares within the issue's bars (TPOT and tokens/s 15%, TTFT 30%; the static
batches: the decode step and the batch's TTFT), and the runs past memory (the grid scores them with
the engine's queue: docs/fidelity.md, "Past the model's memory"). Nothing is fitted here, and the
grid and the static batches are scored as their own benchmarks score them, the cache aside.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]

import bench_fidelity  # noqa: E402
import fidelity_grid  # noqa: E402
import fidelity_static  # noqa: E402
import fit_catalog  # noqa: E402
import provenance  # noqa: E402

# reading -> (the row's KV cache dtype, the kind's kv_dequant_factor)
READINGS = {
    "16-bit cache": ("auto", 1.0),
    "fp8 cache at its bytes": ("fp8", 1.0),
    "fp8 cache at 16-bit time": ("fp8", 2.0),
}
REFERENCES = {"grid": ("16-bit cache",), "static": ("fp8 cache at its bytes",)}  # how each is scored today
BARS = {"grid": {"tpot": 0.15, "tokens_per_s": 0.15, "ttft": 0.30}, "static": {"tpot": 0.15, "ttft": 0.30}}
COLUMNS = ["reference", "reading", "scored so today", "runs", "fit memory", "TPOT median", "TPOT within bar"]
COLUMNS += ["tokens/s median", "tokens/s within bar", "TTFT median", "TTFT within bar", "past memory"]
COLUMNS += ["past memory: TTFT median", "past memory: TTFT within 30%"]


def fp8_rows(reference: str) -> list[dict]:
    """The reference's fp8 runs, scored as its own benchmark scores them."""
    if reference == "grid":
        rows = fidelity_grid.grid_rows(fit_catalog.DATA / fit_catalog.REFS["grid_file"])
        return [r for r in rows if r["precision"] == "fp8"]
    rows = fidelity_static.static_rows(fit_catalog.DATA / fit_catalog.REFS["static_file"])
    return [r for r in rows if r["precision"] == "fp8" and fidelity_static.why_not(r, fit_catalog.SERVERS) is None]


def _scored(job: tuple[str, str, dict]) -> dict:
    """One run under one reading: its ratios (model / measured) and whether its concurrency fits memory."""
    reference, reading, row = job
    kv, factor = READINGS[reading]
    row = {**row, "kv_cache_dtype": kv}
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.yaml"
        fields = {"kv_dequant_factor": factor} if factor != 1.0 else None
        spec.write_text(bench_fidelity.cluster_yaml(row["gpu"], row["num_gpus"], fit_catalog.SERVERS, fields, row))
        got = bench_fidelity.score(row, fit_catalog.SERVERS, Path(tmp), spec)
    keys = fidelity_grid.KEYS if reference == "grid" else fidelity_static.KEYS
    ratios = fidelity_grid.ratios(row, {**got, "fits": True}, keys)  # past memory too, as past_memory_lines
    return {"reference": reference, "reading": reading, "fits": got["fits"], "ratios": ratios}


def line(reference: str, reading: str, results: list[dict]) -> list[str]:
    mine = [r for r in results if r["reference"] == reference and r["reading"] == reading]
    fit = [r for r in mine if r["fits"]]
    past = [r for r in mine if not r["fits"]]
    cells = []
    for metric in ("tpot", "tokens_per_s", "ttft"):
        bar = BARS[reference].get(metric)
        vals = [r["ratios"][metric] for r in fit] if bar else []
        cells += [f"{statistics.median(vals):.2f}", f"{fidelity_grid.within(vals, bar):.0%}"] if vals else ["-", "-"]
    past_ttft = [r["ratios"]["ttft"] for r in past]
    past_cells = (
        [f"{statistics.median(past_ttft):.2f}", f"{fidelity_grid.within(past_ttft, 0.30):.0%}"]
        if reference == "grid" and past_ttft
        else ["-", "-"]
    )
    today = "yes" if reading in REFERENCES[reference] else ""
    return [reference, reading, today, str(len(mine)), str(len(fit)), *cells, str(len(past)), *past_cells]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fp8_cache_readings"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    jobs = [(ref, reading, row) for ref in REFERENCES for reading in READINGS for row in fp8_rows(ref)]
    with Pool(2) as pool:
        results = pool.map(_scored, jobs, chunksize=8)
    lines = [line(ref, reading, results) for ref in REFERENCES for reading in READINGS]
    print(provenance.markdown_table(COLUMNS, lines))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    provenance.write_results(args.out, COLUMNS, [dict(zip(COLUMNS, x)) for x in lines], facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
