"""A grid of measured serving runs for the fidelity benchmark (benchmarks/bench_fidelity.py): NVIDIA
NIM (its TensorRT-LLM backend) serving Llama-3 8B and 70B on A100-SXM4-80GB and H100 SXM servers.

The data, benchmarks/data/nim_dli_grid.csv, is NVIDIA's benchmark table of its "Sizing LLM
inference systems" course (genai-perf runs of the `meta-llama3-8b-instruct` and
`meta-llama3-70b-instruct` NIM containers, execution type NIM_TRT-LLM), as published in the
public repository wbing520/ai-performance-engineering at
code/ch10_inference/inference_gpu_cluster_sizing/dataset/nim.csv (commit 0e25b2e2362); 18 of its
35 columns, every value copied unchanged, one line per source row (`row_number`, 1-based, the
row's place in the source; 72 configurations were run twice and both runs are kept). Per run:
the GPU, the number of GPUs (taken as the tensor-parallel degree: one NIM engine over them, no
pipeline stages), the precision (fp16, bf16 or fp8), the closed-loop concurrency (1 to 250), the
synthetic prompt and output lengths asked for and the means the requests had, and genai-perf's
means of time to first token, inter-token latency (a request's (end - first token) / (tokens - 1),
its TPOT) and output tokens/s over the run.

genai-perf's concurrency mode sends all C requests at once and each next one as one ends, and every
request of a run has the same lengths: its prompts come in bursts that persist, and the prompts'
time lands in the TTFT rather than in the TPOT of the sequences beside them (the runs show it: at
250 in flight with 200-token prompts and outputs the measured TPOT is within 8% of the model's pure decode step,
and the TTFT grows with the concurrency). So each run is scored as that closed loop, iteration by
iteration (llm_planner.serving.closed_loop, `score --closed-loop`); `grid_rows(closed_loop=False)`
gives the runs scored in the steady state instead, as benchmarks/fit_catalog.py fitted the catalog
on them.

The source does not state the engine's version, its batch limits, its token budget, whether it
chunks prompts, how its front end passes requests on, or how the fp8 runs keep their KV cache. The
closed loop takes prompts whole (TensorRT-LLM's default: context chunking off) under a token budget
an iteration (`max_num_tokens`), the requests reaching the engine through a front end that passes
them on one at a time; the budget and the front end's time a request are fitted together per GPU
on that GPU's calibration runs (benchmarks/fit_grid_admission.py; ENGINE_BUDGETS: NIM builds an
engine per GPU, and the two GPUs' servers need not have the same hosts). The budget
decides how many iterations a burst of prompts takes; the front end spreads a burst's arrival, so
the engine takes it in the iterations it arrives in and a later request waits less for the prompts
ahead of it. Without a front end the C requests of a round all wait for the whole burst, which no
engine can prefill as fast as the runs' TTFTs at 25-150 in flight show. The steady state takes the
planner's defaults (chunked prefill, 2,048 tokens); and the fp8 runs take TensorRT-LLM's default
of fp8 quantization, fp8 weights and activations with the KV cache in the 16-bit dtype (`--weights
fp8 --kv-cache-dtype auto`; an fp8 KV cache is a separate option of its quantizer). The runs
agree: what the model misses grows with the keys read at the same rate on the fp8 runs as on the
fp16 ones (`gap_fits`), which an fp8 cache would halve. The runs on A100 are
calibration runs (the catalog's memory efficiency and overheads are fitted on them with the vLLM
rows, benchmarks/fit_catalog.py, and TensorRT-LLM's own set on them alone, benchmarks/fit_engine.py);
so are the runs on H100 below the issue's range, 1 to 25 in flight (the set's H100 values and the
H100's budget and front end are fitted on them: `use_of`). The H100 runs at 50 to 250 in flight,
fp8 runs among them, are held out.

`gap_fits` locates what the model misses: per group, the least-squares fit of measured minus
modelled TPOT over the runs on a + s C + k C K (C the concurrency, K a sequence's mean context,
its prompt plus half its output): a fixed time per step, a time per sequence per step, and a time
per key read per step.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import provenance

SOURCE = (
    "NVIDIA 'Sizing LLM inference systems' course benchmark table (NIM, TensorRT-LLM backend, genai-perf), "
    "wbing520/ai-performance-engineering code/ch10_inference/inference_gpu_cluster_sizing/dataset/nim.csv "
    "(commit 0e25b2e236211ad01ed2221bd2c1cfa5b3f47b55)"
)
GPUS = {"A100-SXM4-80GB": "a100-sxm-80g", "H100_80GB_HBM3": "h100-sxm-80g"}
MODELS = {
    "meta-llama3-8b-instruct": "meta-llama/Meta-Llama-3-8B-Instruct",
    "meta-llama3-70b-instruct": "meta-llama/Meta-Llama-3-70B-Instruct",
}
# What the source leaves out (module docstring): the token budget an iteration and the front end's
# time a request, fitted together on the calibration runs by benchmarks/fit_grid_admission.py, and
# prompts whole (TensorRT-LLM's default: enable_chunked_context off), per GPU: the engines NIM builds
# for each GPU need not share their build settings, and each GPU's pair is fitted on its own calibration runs
ENGINE_BUDGETS = {
    "a100-sxm-80g": {"max_num_batched_tokens": 16384, "enable_chunked_prefill": False, "front_end_s": 0.004},
    "h100-sxm-80g": {"max_num_batched_tokens": 32768, "enable_chunked_prefill": False, "front_end_s": 0.002},
}
CALIBRATION_GPUS = ("a100-sxm-80g",)  # every run of these is a calibration run (benchmarks/fit_catalog.py's too)
ISSUE_RANGE = (32, 256)  # the concurrencies the issue's bars are set at (in flight)
GROUP_KEYS = ("model", "gpu", "tp", "precision")
METRICS = {"tpot": "TPOT", "tokens_per_s": "output tokens/s", "ttft": "TTFT"}


def grid_rows(path: Path, closed_loop: bool = True) -> list[dict]:
    """The grid's runs as serving rows of fidelity_references.yaml (its header gives the fields),
    scored as the closed loop they ran in at TensorRT-LLM's budget, or in the steady state at the
    planner's defaults (module docstring)."""
    with open(path, newline="") as f:
        rows = [_row(r) for r in csv.DictReader(f)]
    return [{**r, "run": "closed_loop", **ENGINE_BUDGETS[r["gpu"]]} for r in rows] if closed_loop else rows


def use_of(gpu: str, concurrency: int) -> str:
    """A run's use: every run on a CALIBRATION_GPUS GPU calibrates, and on the others the runs below
    the issue's range (module docstring); the rest are held out."""
    return "calibration" if gpu in CALIBRATION_GPUS or concurrency < ISSUE_RANGE[0] else "held_out"


def _row(r: dict) -> dict:
    n, size = int(r["n_gpus"]), f"{r['input_tokens_mean_config']}-{r['output_tokens_mean_config']}"
    short = r["model"].removeprefix("meta-").removesuffix("-instruct")
    return {
        "id": f"nim-grid-{GPUS[r['gpu']]}-{short}-tp{n}-{r['precision']}-{size}-c{r['concurrency']}-r{r['row_number']}",
        "source": f"{SOURCE}, row {r['row_number']}",
        "engine": "nvidia-nim (TensorRT-LLM)",
        "model": MODELS[r["model"]],
        "gpu": GPUS[r["gpu"]],
        "num_gpus": n,
        "tp": n,
        "pp": 1,
        **precision_fields(r["precision"]),
        "concurrency": int(r["concurrency"]),
        "prompt_len": float(r["num_input_token_avg"]),
        "output_len": float(r["num_output_token_avg"]),
        "stat": "mean",
        "tpot_s": float(r["itl_avg_ns"]) * 1e-9,
        "ttft_s": float(r["ttft_avg_ns"]) * 1e-9,
        "output_tokens_per_s": float(r["output_token_throughput_avg"]),
        "use": use_of(GPUS[r["gpu"]], int(r["concurrency"])),
        "size": f"{r['input_tokens_mean_config']}/{r['output_tokens_mean_config']}",  # the sizes asked for
    }


def precision_fields(name: str) -> dict:
    """The row's precision fields: fp8 as TensorRT-LLM's fp8 quantization (module docstring)."""
    if name == "fp8":
        return {"dtype": "fp16", "weights": "fp8", "kv_cache_dtype": "auto", "precision": "fp8"}
    return {"dtype": name, "precision": name}


# metric -> (the model's key in bench_fidelity.score's figures, the measured key in the row)
KEYS = {
    "tpot": ("tpot_s", "tpot_s"),
    "tokens_per_s": ("tokens_per_s", "output_tokens_per_s"),
    "ttft": ("ttft_s", "ttft_s"),
}


def ratios(row: dict, got: dict, keys: dict = KEYS) -> dict | None:
    """Model / measured of one run per metric of `keys`, or None where the model does not fit its
    concurrency in memory."""
    if not got["fits"]:
        return None
    return {metric: got[model] / row[measured] for metric, (model, measured) in keys.items()}


def group_of(row: dict) -> tuple:
    return (row["model"].split("/")[-1], row["gpu"], row["tp"], row["precision"])


def tables(
    rows: list[dict], scored: list[dict | None], metrics: tuple[str, ...] = tuple(METRICS), prefix: str = "c"
) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Per metric: one line per (model, GPU, tp, dtype), one column per concurrency, each cell the
    median ratio over that cell's runs (its prompt/output sizes and repeats), `-` where none fit."""
    cells: dict = defaultdict(list)
    concurrencies = sorted({r["concurrency"] for r in rows})
    for row, got in zip(rows, scored):
        if got is not None:
            cells[group_of(row), row["concurrency"]].append(got)
    out = {}
    for metric in metrics:
        head = [*GROUP_KEYS, *(f"{prefix}{c}" for c in concurrencies)]
        lines = []
        for group in sorted({group_of(r) for r in rows}):
            vals = [cells.get((group, c)) for c in concurrencies]
            lines.append([*map(str, group), *(_median(v, metric) for v in vals)])
        out[metric] = (head, lines)
    return out


def table_sections(tables_by_metric: dict, title) -> list[str]:
    """Markdown of `tables`' output: per metric, `title(metric)` and its table."""
    out = []
    for metric, (head, lines) in tables_by_metric.items():
        out += [f"\n{title(metric)}:\n", provenance.markdown_table(head, lines).rstrip("\n")]
    return out


def _median(runs: list[dict] | None, metric: str) -> str:
    return f"{statistics.median(r[metric] for r in runs):.2f}" if runs else "-"


GAP_HEAD = [*GROUP_KEYS, "runs", "a (ms/step)", "s (us/sequence)", "k (ns/key)", "TPOT error rms: model / model + fit"]


def gap_fits(rows: list[dict], got: list[dict]) -> list[list[str]]:
    """Per group, measured - modelled TPOT fitted on a + s C + k C K by least squares (module
    docstring), over the runs whose concurrency fits; the relative error's RMS without and with it."""
    groups: dict = defaultdict(list)
    for row, g in zip(rows, got):
        if g["fits"]:
            context = row["prompt_len"] + row["output_len"] / 2
            groups[group_of(row)].append((row["concurrency"], context, row["tpot_s"], g["tpot_s"]))
    lines = []
    for group, runs in sorted(groups.items()):
        c, k, measured, model = (np.array(x, dtype=float) for x in zip(*runs))
        basis = np.column_stack([np.ones_like(c), c, c * k])
        coef, *_ = np.linalg.lstsq(basis, measured - model, rcond=None)
        before = np.sqrt(np.mean((model / measured - 1) ** 2))
        after = np.sqrt(np.mean(((model + basis @ coef) / measured - 1) ** 2))
        a, s, per_key = coef
        lines.append(
            [*map(str, group), str(len(runs)), f"{a * 1e3:.2f}", f"{s * 1e6:.1f}", f"{per_key * 1e9:.1f}"]
            + [f"{before:.2f} / {after:.2f}"]
        )
    return lines


BARS = (("tpot", 0.15), ("tokens_per_s", 0.15), ("ttft", 0.30))


def within(ratios, bar: float) -> float:
    """The share of the ratios (model / measured) within `bar` of 1."""
    return sum(abs(x - 1) <= bar for x in ratios) / len(ratios)


def summary(scored: list[dict | None], bars: tuple = BARS, label: str = "held_out grid") -> list[str]:
    """One line per metric: runs scored, median, 10th-90th percentile, share within 15% (TPOT,
    tokens/s) or 30% (TTFT): the issue's bars."""
    lines = []
    fit = [s for s in scored if s is not None]
    for metric, bar in bars:
        v = sorted(s[metric] for s in fit)
        if len(v) < 2:
            continue
        deciles = statistics.quantiles(v, n=10, method="inclusive")
        lines.append(
            f"{label} {metric:12s} n={len(v)} median {statistics.median(v):.2f} p10-p90 "
            f"{deciles[0]:.2f}-{deciles[-1]:.2f} within {bar:.0%}: {within(v, bar):.0%}"
        )
    return lines


def run(path: Path, score, out_dir: Path) -> tuple[str, list[str]]:
    """Score every run of the grid with `score(row) -> dict` (bench_fidelity's), write grid.csv
    (each run: measured, model, ratios) in out_dir; return the grid's markdown and summary lines
    (the held-out runs' also in the steady state, the figure a plan states)."""
    rows = grid_rows(path)
    got = [score(row) for row in rows]
    scored = [ratios(row, g) for row, g in zip(rows, got)]
    _write_runs(out_dir / "grid.csv", rows, got, scored)
    lines = []
    for use in ("calibration", "held_out"):
        lines += summary([sc for row, sc in zip(rows, scored) if row["use"] == use], label=f"{use} grid")
    low, high = ISSUE_RANGE
    in_range = [sc for row, sc in zip(rows, scored) if row["use"] == "held_out" and low <= row["concurrency"] <= high]
    lines += summary(in_range, label=f"held_out grid at {low}-{high} in flight")
    lines += past_memory_lines(rows, got)
    steady = [(row, ratios(row, score(row))) for row in grid_rows(path, closed_loop=False) if row["use"] == "held_out"]
    lines += summary([sc for _, sc in steady], label="held_out grid, steady state")
    lines += summary(
        [sc for row, sc in steady if low <= row["concurrency"] <= high],
        label=f"held_out grid, steady state, at {low}-{high} in flight",
    )
    md = table_sections(
        tables(rows, scored),
        lambda m: f"{METRICS[m]}, model / measured, median over the prompt/output sizes of each cell",
    )
    md.append(
        "\nWhat the model misses, per group: measured - modelled TPOT fitted on a + s C + k C K "
        "(C in flight, K a sequence's mean context):\n"
    )
    md.append(provenance.markdown_table(GAP_HEAD, gap_fits(rows, got)).rstrip("\n"))
    return "\n".join(md) + "\n", lines


def past_memory_lines(rows: list[dict], got: list[dict]) -> list[str]:
    """The summary of the runs whose C full contexts the model's memory does not hold, scored with the
    engine queueing what it cannot hold (bench_fidelity.closed_loop_score), per use, the 16-bit runs
    apart from the fp8 ones (docs/fidelity.md says why)."""
    lines = []
    for use in ("calibration", "held_out"):
        for label, fp8 in (("16-bit", False), ("fp8", True)):
            past = [
                ratios(row, {**g, "fits": True})
                for row, g in zip(rows, got)
                if row["use"] == use and not g["fits"] and g["admitted"] and (row["precision"] == "fp8") == fp8
            ]
            lines += summary(past, label=f"{use} grid past memory, {label}, engine queueing")
    return lines


RUN_COLUMNS = ["id", "concurrency", "prompt_len", "output_len", "fits", "admitted"]
RUN_COLUMNS += [f"{m}_{k}" for m in ("tpot_s", "tokens_per_s", "ttft_s") for k in ("measured", "model")]


def _write_runs(path: Path, rows: list[dict], got: list[dict], scored: list[dict | None]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RUN_COLUMNS)
        for row, g, s in zip(rows, got, scored):
            values = [v for model, measured in KEYS.values() for v in (row[measured], g[model])]
            admitted = g.get("admitted", row["concurrency"])
            w.writerow(
                [row["id"], row["concurrency"], row["prompt_len"], row["output_len"], s is not None, admitted, *values]
            )
