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

The source does not state the engine's version, its batch limits, its token budget, whether it
chunks prompts or keeps the KV cache in fp8 for the fp8 runs: the model takes the planner's
defaults (chunked prefill, a 2,048-token budget) and plans fp8 runs in fp8 throughout, as it
does the NIM 1.8 rows of fidelity_references.yaml. No constant was fitted on these rows: they
are held out.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

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
GROUP_KEYS = ("model", "gpu", "tp", "dtype")
METRICS = {"tpot": "TPOT", "tokens_per_s": "output tokens/s", "ttft": "TTFT"}


def grid_rows(path: Path) -> list[dict]:
    """The grid's runs as serving rows of fidelity_references.yaml (its header gives the fields)."""
    with open(path, newline="") as f:
        return [_row(r) for r in csv.DictReader(f)]


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
        "dtype": r["precision"],
        "concurrency": int(r["concurrency"]),
        "prompt_len": float(r["num_input_token_avg"]),
        "output_len": float(r["num_output_token_avg"]),
        "stat": "mean",
        "tpot_s": float(r["itl_avg_ns"]) * 1e-9,
        "ttft_s": float(r["ttft_avg_ns"]) * 1e-9,
        "output_tokens_per_s": float(r["output_token_throughput_avg"]),
        "use": "held_out",
    }


def ratios(row: dict, got: dict) -> dict | None:
    """Model / measured of one run, or None where the model does not fit its concurrency in memory."""
    if not got["fits"]:
        return None
    return {
        "tpot": got["tpot_s"] / row["tpot_s"],
        "tokens_per_s": got["tokens_per_s"] / row["output_tokens_per_s"],
        "ttft": got["ttft_s"] / row["ttft_s"],
    }


def group_of(row: dict) -> tuple:
    return (row["model"].split("/")[-1], row["gpu"], row["tp"], row["dtype"])


def tables(rows: list[dict], scored: list[dict | None]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Per metric: one line per (model, GPU, tp, dtype), one column per concurrency, each cell the
    median ratio over that cell's runs (its prompt/output sizes and repeats), `-` where none fit."""
    cells: dict = defaultdict(list)
    concurrencies = sorted({r["concurrency"] for r in rows})
    for row, got in zip(rows, scored):
        if got is not None:
            cells[group_of(row), row["concurrency"]].append(got)
    out = {}
    for metric in METRICS:
        head = [*GROUP_KEYS, *(f"c{c}" for c in concurrencies)]
        lines = []
        for group in sorted({group_of(r) for r in rows}):
            vals = [cells.get((group, c)) for c in concurrencies]
            lines.append([*map(str, group), *(_median(v, metric) for v in vals)])
        out[metric] = (head, lines)
    return out


def _median(runs: list[dict] | None, metric: str) -> str:
    return f"{statistics.median(r[metric] for r in runs):.2f}" if runs else "-"


def summary(scored: list[dict | None]) -> list[str]:
    """One line per metric: runs scored, median, 10th-90th percentile, share within 15% (TPOT,
    tokens/s) or 30% (TTFT): the issue's bars."""
    lines = []
    fit = [s for s in scored if s is not None]
    for metric, bar in (("tpot", 0.15), ("tokens_per_s", 0.15), ("ttft", 0.30)):
        v = sorted(s[metric] for s in fit)
        if len(v) < 2:
            continue
        deciles = statistics.quantiles(v, n=10, method="inclusive")
        within = sum(abs(x - 1) <= bar for x in v) / len(v)
        lines.append(
            f"held_out grid {metric:12s} n={len(v)} median {statistics.median(v):.2f} p10-p90 "
            f"{deciles[0]:.2f}-{deciles[-1]:.2f} within {bar:.0%}: {within:.0%}"
        )
    return lines


def run(path: Path, score, out_dir: Path) -> tuple[str, list[str]]:
    """Score every run of the grid with `score(row) -> dict` (bench_fidelity's), write grid.csv
    (each run: measured, model, ratios) in out_dir; return the grid's markdown and summary lines."""
    rows = grid_rows(path)
    got = [score(row) for row in rows]
    scored = [ratios(row, g) for row, g in zip(rows, got)]
    _write_runs(out_dir / "grid.csv", rows, got, scored)
    md = []
    for metric, (head, lines) in tables(rows, scored).items():
        md.append(f"\n{METRICS[metric]}, model / measured, median over the prompt/output sizes of each cell:\n")
        md.append("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        md += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(md) + "\n", summary(scored)


RUN_COLUMNS = ["id", "concurrency", "prompt_len", "output_len", "fits"]
RUN_COLUMNS += [f"{m}_{k}" for m in ("tpot_s", "tokens_per_s", "ttft_s") for k in ("measured", "model")]


def _write_runs(path: Path, rows: list[dict], got: list[dict], scored: list[dict | None]) -> None:
    measured = {"tpot_s": "tpot_s", "tokens_per_s": "output_tokens_per_s", "ttft_s": "ttft_s"}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RUN_COLUMNS)
        for row, g, s in zip(rows, got, scored):
            values = [v for m, key in measured.items() for v in (row[key], g[m])]
            w.writerow([row["id"], row["concurrency"], row["prompt_len"], row["output_len"], s is not None, *values])
