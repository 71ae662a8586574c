"""A table of static batches for the fidelity benchmark (benchmarks/bench_fidelity.py): TensorRT-LLM
0.9.0 timing one batch of B prompts, all started at once and each generating its full output.

The data, benchmarks/data/trtllm_090_static.csv, is NVIDIA's TensorRT-LLM 0.9.0 performance
table as its "Sizing LLM inference systems" course ships it, published in the public repository
wbing520/ai-performance-engineering at
code/ch11_inference/inference_gpu_cluster_sizing/dataset/trt_llm_0_9_0_dli.csv (commit
5a4d0c37a32): the rows of the models with a planner preset (LLaMA v2 7B, 13B and 70B, Mixtral
8x7B) on GPUs of the catalog (A100-SXM4-80GB, H100 80GB HBM3, H200 141GB HBM3, L40S) that have a
result, 11 of the source's 34 columns, every value copied unchanged (`row_number`: the row's place
among the source's data rows, 1-based). Per run: the GPU, the tensor- and pipeline-parallel
sizes, the precision (FP8, or "Mixed": 16-bit), the batch size (1-1536), the prompt and output
lengths (every sequence exactly these: 128 or 2048 tokens in, 128 to 4096 out), and the measured
first-token latency, token-to-token latency and whole latency. The runs used fake weights and
TensorRT-LLM's XQA attention kernels (the source's columns).

It is a check of the kernels alone: one static batch, no arrivals, no scheduler. Scored as
bench_fidelity scores vLLM's offline latency tests (`run: fixed_batch`): the batch's prompts in
one context phase (the batch at once, as TensorRT-LLM 0.9 runs it), then output - 1 decode steps
of the batch at its mean context; the model's TTFT, decode step (against the token-to-token
latency) and whole latency. FP8 rows keep their KV cache in fp8 too (`--weights fp8
--kv-cache-dtype fp8`): the source does not say, but 45 of its FP8 runs hold batches whose 16-bit
cache would not fit the GPUs (the model finds them over memory with one) and fit with an fp8 one.
Not scored: L40S rows with more than one GPU (the source does not describe their server's GPU
link) and Mixtral (the source ran fake weights, and a router on them does not spread tokens over
the experts as a trained one does, so the expert weights a batch reads are not the model's: the
model reads 2-2.8x the time at 2-32 sequences). No constant was fitted on these rows: they are
held out.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import fidelity_grid

SOURCE = (
    "TensorRT-LLM 0.9.0 performance table, NVIDIA 'Sizing LLM inference systems' course, "
    "wbing520/ai-performance-engineering code/ch11_inference/inference_gpu_cluster_sizing/dataset/"
    "trt_llm_0_9_0_dli.csv (commit 5a4d0c37a3231b2ff8a268df7f129be259c48a48)"
)
GPUS = {
    "A100-SXM4-80GB": "a100-sxm-80g",
    "H100 80GB HBM3": "h100-sxm-80g",
    "H200 141GB HBM3": "h200-sxm-141g",
    "L40S": "l40s",
}
MODELS = {
    "LLaMA v2 7B": "meta-llama/Llama-2-7b-hf",
    "LLaMA v2 13B": "meta-llama/Llama-2-13b-hf",
    "LLaMA v2 70B": "meta-llama/Llama-2-70b-hf",
    "Mixtral 8x7B": "mistralai/Mixtral-8x7B-v0.1",
}
METRICS = {"tpot": "decode step (token-to-token latency)", "ttft": "TTFT (the batch's context phase)", "e2e": "latency"}
BARS = (("tpot", 0.15), ("ttft", 0.30), ("e2e", 0.15))
KEYS = {"tpot": ("tpot_s", "tpot_s"), "ttft": ("ttft_s", "ttft_s"), "e2e": ("e2e_s", "e2e_s")}  # as fidelity_grid.KEYS
FP8 = {"dtype": "fp16", "weights": "fp8", "kv_cache_dtype": "fp8", "precision": "fp8"}


def static_rows(path: Path) -> list[dict]:
    """The table's runs as fixed-batch serving rows of fidelity_references.yaml."""
    with open(path, newline="") as f:
        return [_row(r) for r in csv.DictReader(f)]


def _row(r: dict) -> dict:
    prompt, output = (int(x) for x in r["input_output_lengths"].split(","))
    gpu, tp, batch = GPUS[r["gpu"]], int(r["tp_size"]), int(r["batch_size"])
    precision = "fp8" if r["precision"] == "FP8" else "fp16"
    short = r["model"].lower().replace("llama v2 ", "llama2-").replace(" ", "-")
    return {
        "id": f"trtllm-static-{gpu}-{short}-tp{tp}-{precision}-{prompt}-{output}-b{batch}-r{r['row_number']}",
        "source": f"{SOURCE}, row {r['row_number']}",
        "engine": "tensorrt-llm 0.9.0",
        "model": MODELS[r["model"]],
        "gpu": gpu,
        "num_gpus": tp * int(r["pp_size"]),
        "tp": tp,
        "pp": int(r["pp_size"]),
        **(FP8 if precision == "fp8" else {"dtype": "fp16", "precision": "fp16"}),
        "run": "fixed_batch",
        "concurrency": batch,
        "prompt_len": float(prompt),
        "output_len": float(output),
        "enable_chunked_prefill": False,
        "tpot_s": float(r["token_to_token_latency_ms"]) * 1e-3,
        "ttft_s": float(r["ttft_ms"]) * 1e-3,
        "e2e_s": float(r["latency_ms"]) * 1e-3,
        "use": "held_out",
    }


def why_not(row: dict, servers: dict) -> str | None:
    """Why a run is not scored (module docstring), or None."""
    if row["model"].startswith("mistralai/Mixtral"):
        return "fake weights: a router on them does not spread tokens over the experts as a trained one does"
    if row["num_gpus"] > 1 and row["gpu"] not in servers:
        return f"{row['gpu']}: the source does not describe the server's GPU link"
    return None


def run(path: Path, score, servers: dict, out_dir: Path) -> tuple[str, list[str]]:
    """Score every scoreable run with `score(row)`; the tables' markdown and the summary lines."""
    every = static_rows(path)
    reasons = Counter(why_not(r, servers) for r in every)
    rows = [r for r in every if why_not(r, servers) is None]
    got = [score(row) for row in rows]
    scored = [fidelity_grid.ratios(row, g, KEYS) for row, g in zip(rows, got)]
    with open(out_dir / "static.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "fits", "tpot_s_measured", "tpot_s_model", "ttft_s_measured", "ttft_s_model"])
        for row, g in zip(rows, got):
            w.writerow([row["id"], g["fits"], row["tpot_s"], g["tpot_s"], row["ttft_s"], g["ttft_s"]])
    md = fidelity_grid.table_sections(
        fidelity_grid.tables(rows, scored, tuple(METRICS), "b"),
        lambda m: f"{METRICS[m]}, model / measured, by batch size, median over the prompt/output sizes",
    )
    over = sum(s is None for s in scored)
    lines = fidelity_grid.summary(scored, BARS, "held_out static") + [f"held_out static over memory: {over} runs"]
    lines += [
        f"held_out static not scored: {n} runs, {why}" for why, n in sorted((w, n) for w, n in reasons.items() if w)
    ]
    return "\n".join(md) + "\n", lines
