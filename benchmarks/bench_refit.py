"""Refit the serving model on a few runs of one engine and judge it on the rest: the NIM grid.

    .venv/bin/python benchmarks/bench_refit.py [--train-size 200/1000] [--train-concurrency 1,25,100] [--out DIR]

The grid (benchmarks/fidelity_grid.py: NIM's TensorRT-LLM backend serving Llama-3 8B and 70B on
A100 and H100 servers, 787 genai-perf runs) is where the catalog's factors are judged (its A100
runs are among those they are fitted on, with vLLM's: benchmarks/fit_catalog.py; docs/fidelity.md).
A catalog is a compromise over engines and models; this asks what a user who measured their own
engine would get: for each (model, GPU, tensor-parallel degree, precision) of the grid,
`calibrate --serving` (llm_planner.measure.serving_fit.calibrate_serving_files) fits the kind's
five factors on that group's runs at one prompt/output size and a few concurrencies, each given as
a genai-perf profile export (the grid's columns are genai-perf's metrics: its inter-token latency,
time to first token, output tokens/s, mean prompt and output lengths and concurrency, rebuilt as
the export's JSON; TTFT left out of the fit by default, `--ttft-weight`), and the fitted spec then
scores every other run of the group as bench_fidelity scores a row. Each line: the fitted factors,
and over the group's other runs the model's TPOT, tokens/s and TTFT against the measured (median
ratio, share within the issue's 15% (TPOT, tokens/s) or 30% (TTFT)) with the fitted factors and,
for comparison, the catalog's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench_fidelity  # noqa: E402
import fidelity_grid  # noqa: E402
import provenance  # noqa: E402

from llm_planner.measure.serving_cases import ServingSettings  # noqa: E402
from llm_planner.measure.serving_fit import calibrate_serving_files  # noqa: E402

FITTED = ("compute_efficiency", "mem_efficiency", "step_overhead_s", "collective_overhead_s", "sequence_overhead_s")
COLUMNS = [
    "model",
    "gpu",
    "tp",
    "precision",
    "trained on",
    "fitted (ce, me, step, coll, seq)",
    "held out",
    "tpot ratio: catalog / fitted",
    "tok/s ratio: catalog / fitted",
    "ttft ratio: catalog / fitted",
]


def genai_export(row: dict) -> dict:
    """The genai-perf profile export of one grid run (the metrics the grid holds, in seconds)."""
    return {
        "inter_token_latency": {"unit": "s", "avg": row["tpot_s"]},
        "time_to_first_token": {"unit": "s", "avg": row["ttft_s"]},
        "output_token_throughput": {"unit": "tokens/sec", "avg": row["output_tokens_per_s"]},
        "input_sequence_length": {"unit": "tokens", "avg": row["prompt_len"]},
        "output_sequence_length": {"unit": "tokens", "avg": row["output_len"]},
        "input_config": {"model": [row["model"]], "concurrency": row["concurrency"]},
    }


def refit_group(rows: list[dict], train: list[dict], servers: dict, tmp: Path, ttft_weight: float) -> dict:
    """Fit the group's kind on `train`, score the other rows with the catalog's and the fitted factors."""
    first = rows[0]
    gpu, n = first["gpu"], first["num_gpus"]
    spec = tmp / f"{gpu}-{n}-{first['precision']}.yaml"
    spec.write_text(bench_fidelity.cluster_yaml(gpu, n, servers))
    files = []
    for i, row in enumerate(train):
        path = tmp / f"train-{i}.json"
        path.write_text(json.dumps(genai_export(row)))
        files.append(str(path))
    replica = f"1 x server/{gpu}" + (f"[tp{n}]" if n > 1 else "")
    precision = bench_fidelity.row_precision(first)
    settings = ServingSettings(model=bench_fidelity.PRESETS[first["model"]], replicas=(replica,), dtype=precision)
    fitted_spec = tmp / f"fitted-{gpu}-{n}-{first['precision']}.yaml"
    result = calibrate_serving_files(spec, files, settings, fitted_spec, {"ttft_s": ttft_weight})
    (fit,) = [f for f in result.calibration.kinds if f.name == gpu]
    held = [r for r in rows if r not in train]
    before = [fidelity_grid.ratios(r, bench_fidelity.score(r, servers, tmp, spec)) for r in held]  # the catalog's
    after = [fidelity_grid.ratios(r, bench_fidelity.score(r, servers, tmp, fitted_spec)) for r in held]
    return {"fit": fit, "held": len(held), "before": before, "after": after}


def cell(before: list, after: list, metric: str, bar: float) -> str:
    return f"{_stat(before, metric, bar)} / {_stat(after, metric, bar)}"


def _stat(scored: list, metric: str, bar: float) -> str:
    v = [s[metric] for s in scored if s is not None]
    if not v:
        return "-"
    return f"{statistics.median(v):.2f} ({fidelity_grid.within(v, bar):.0%})"


def table_row(group: tuple, train: list[dict], got: dict) -> dict:
    fit = got["fit"]
    v = fit.values
    factors = f"{v['compute_efficiency']:.2f}, {v['mem_efficiency']:.2f}, "
    factors += f"{v['step_overhead_s'] * 1e3:.2f} ms, {v['collective_overhead_s'] * 1e6:.0f} us, "
    factors += f"{v['sequence_overhead_s'] * 1e6:.1f} us"
    kept = [f for f in FITTED if f not in fit.fitted]
    return dict(
        zip(COLUMNS[:4], group),
        **{
            "trained on": f"{train[0]['size']} at c={','.join(str(r['concurrency']) for r in train)}",
            "fitted (ce, me, step, coll, seq)": factors + (f" (kept: {', '.join(kept)})" if kept else ""),
            "held out": got["held"],
            "tpot ratio: catalog / fitted": cell(got["before"], got["after"], "tpot", 0.15),
            "tok/s ratio: catalog / fitted": cell(got["before"], got["after"], "tokens_per_s", 0.15),
            "ttft ratio: catalog / fitted": cell(got["before"], got["after"], "ttft", 0.30),
        },
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-size", default="200/1000", help="the prompt/output size trained on (the grid's)")
    ap.add_argument("--train-concurrency", default="1,25,100", help="the concurrencies trained on")
    ap.add_argument(
        "--ttft-weight",
        type=float,
        default=0.0,
        help="TTFT's weight in the fit (calibrate --ttft-weight; default 0: the grid's TTFT grows with the "
        "concurrency in a way the model's steady-state TTFT does not describe, docs/fidelity.md)",
    )
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "refit"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    refs = yaml.safe_load((bench_fidelity.DATA / "fidelity_references.yaml").read_text())
    servers = yaml.safe_load((bench_fidelity.DATA / "fidelity_servers.yaml").read_text())
    # the steady state, as this table was made: refitting each group as the closed loop the runs are
    # (calibrate --serving --closed-loop) takes about 7 minutes a group here, and is not run
    grid = fidelity_grid.grid_rows(bench_fidelity.DATA / refs["grid_file"], closed_loop=False)
    wanted = [int(c) for c in args.train_concurrency.split(",")]
    groups: dict = {}
    for row in grid:
        groups.setdefault(fidelity_grid.group_of(row), []).append(row)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for group, members in sorted(groups.items()):
            train = [next(r for r in members if r["size"] == args.train_size and r["concurrency"] == c) for c in wanted]
            rows.append(table_row(group, train, refit_group(members, train, servers, Path(tmp), args.ttft_weight)))
            print(" | ".join(str(rows[-1][c]) for c in COLUMNS), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    provenance.write_results(args.out, COLUMNS, rows, facts)
    print(provenance.markdown_table(COLUMNS, ([r[c] for c in COLUMNS] for r in rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
