"""The serving cost model against measurements nobody here made: one row per reference run.

    .venv/bin/python benchmarks/bench_fidelity.py [--out DIR]

Each serving row of benchmarks/data/fidelity_references.yaml (engine, model, GPUs, tensor and
pipeline degrees, concurrency, mean prompt and output lengths, each with its source) is scored
by the planner's own model, as `llm-planner score` would: a one-server cluster of the row's GPUs
from the package's catalog (`catalog:`; the NIM grid's TensorRT-LLM runs with `engine: tensorrt-llm`,
the factors fitted on that engine's runs alone, ENGINE_SETS; with the server's GPU link from
benchmarks/data/fidelity_servers.yaml; a pipeline row's pp servers of tp GPUs each, joined by the
row's `server_link`), the row's model preset and dtype, the replica pp stages x tp GPUs, the row's
concurrency in pp micro-batches, one a stage as vLLM runs a pipeline (an open-loop row, requests at a rate
with no cap: the concurrency where Little's law holds in the model), the row's token budget and
chunked-prefill setting where it states them, SGLang's rows with prompts in iterations of their own
unless they state --enable-mixed-chunk (`mixed_iterations`). A row with no TPOT but a mean
end-to-end latency is judged on the mean time per token that gives (`measured_tpot`). It prints and writes the model's
TPOT, tokens/s and TTFT beside the measured ones and their ratios (model / measured). Rows the
model cannot score (a GPU, concurrency or model the source does not state) are listed with why.

What the rows mean is in the data file's header: `calibration` rows are those the constants were
fitted on; `held_out` rows judge the model. TTFT of a closed batch (all prompts at once, as in
the LambdaLabs prompt_10 runs) or of an engine with multi-step scheduling (a prompt admitted only
every n steps) is not the steady state the model describes: its ratio is shown, marked, and kept
out of the summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import fidelity_grid  # noqa: E402 (benchmarks/fidelity_grid.py, beside this script)
import fidelity_static  # noqa: E402
import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

from llm_planner.core.catalog import engine_entries  # noqa: E402
from llm_planner.core.precision import build_precision  # noqa: E402
from llm_planner.core.spec import load_cluster  # noqa: E402
from llm_planner.cost.chunks import engine_mixes_prompts  # noqa: E402
from llm_planner.cost.iteration import Load, layer_kernels  # noqa: E402
from llm_planner.graph.decoder_presets import preset_config  # noqa: E402
from llm_planner.serving.context import ServingOptions, build_context  # noqa: E402
from llm_planner.serving.layout import Segment  # noqa: E402
from llm_planner.serving.score import closed_loop_of, queued_split  # noqa: E402
from llm_planner.serving.workload import RequestShape, ServingWorkload  # noqa: E402

DATA = REPO / "benchmarks" / "data"
# The Hugging Face names of the references and the presets with their architecture.
PRESETS = {
    "meta-llama/Meta-Llama-3-8B-Instruct": "llama3-8b",
    "meta-llama/Meta-Llama-3-70B-Instruct": "llama3-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama3-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama3-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama3-70b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama3-70b",
    "meta-llama/Llama-2-7b-hf": "llama2-7b",
    "meta-llama/Llama-2-13b-hf": "llama2-13b",
    "meta-llama/Llama-2-70b-hf": "llama2-70b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3",
}
PROJECTIONS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
OP_COLUMNS = ["gpu", "model", "tp", "linear ratio by tokens (1, 8, 32, 64, 128, 256, 512, 1024, 2048)"]
AR_COLUMNS = [
    "gpu",
    "GPUs",
    "all-reduce ratio by bytes (2 KiB .. 64 MiB, x4 steps)",
    "bandwidth share reached (1-64 MiB slope)",
]
DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
COLUMNS = [
    "id",
    "use",
    "gpu",
    "tp",
    "concurrency",
    "prompt/output",
    "tpot measured",
    "tpot model",
    "tpot ratio",
    "tok/s measured",
    "tok/s model",
    "tok/s ratio",
    "ttft measured",
    "ttft model",
    "ttft ratio",
    "e2e measured",
    "e2e model",
    "e2e ratio",
]


def cluster_yaml(gpu: str, num_gpus: int, servers: dict, fields: dict | None = None, row: dict | None = None) -> str:
    """A spec of `num_gpus` catalog GPUs, with kind `fields` over the catalog's: one server, or for a
    pipeline row (pp > 1) pp servers of num_gpus / pp each, linked by the row's `server_link`."""
    pp = (row or {}).get("pp", 1)
    per_server = num_gpus // pp
    link = servers[gpu]["gpu_link"] if per_server > 1 else None  # one GPU a server: no link between GPUs
    engine = engine_set(row) if row is not None else None
    spec = {
        "name": f"{pp}-{gpu}-servers",
        "device_kinds": [{"name": gpu, "catalog": gpu, **({"engine": engine} if engine else {}), **(fields or {})}],
        "nodes": [
            {
                "name": "server",
                "count": pp,
                "devices": {gpu: per_server},
                "links": [{"between": [gpu, gpu], **link}] if link else [],
            }
        ],
    }
    if pp > 1:
        spec["links"] = {"inter_node": row["server_link"]}
    return yaml.safe_dump(spec, sort_keys=False)


# The engine factor set (llm_planner/core/data/engine_factors.yaml) a row's engine is scored with, by the
# row's `engine`: TensorRT-LLM as NIM serves it, the engine the set is fitted on (the NIM grid). NIM 1.8's
# tables do not say which backend ran; TensorRT-LLM 0.9.0's static batches are its kernels alone, without
# the server and scheduler around them, and keep the catalog's factors (docs/fidelity.md).
ENGINE_SETS = {"nvidia-nim (TensorRT-LLM)": "tensorrt-llm"}


def engine_set(row: dict) -> str | None:
    """The engine factor set the row is scored with (ENGINE_SETS), where the set stands for its GPU."""
    engine = ENGINE_SETS.get(str(row.get("engine")))
    return engine if engine is not None and row["gpu"] in engine_entries(engine) else None


def why_not(row: dict) -> str | None:
    """Why a row cannot be scored, or None."""
    if row.get("gpu") is None:
        return "the source does not name the GPU"
    if row.get("concurrency") is None and not _open_loop(row):
        return "the source does not state the concurrency (max_num_seqs unknown)"
    if row.get("model") not in PRESETS:
        return f"no preset for {row.get('model')}"
    if row.get("pp", 1) != 1 and (row.get("server_link") is None or row["num_gpus"] != row["tp"] * row["pp"]):
        return "a pipeline row needs its servers' link and tp x pp GPUs"
    return None


def _open_loop(row: dict) -> bool:
    """A run whose requests arrive at a finite rate with no concurrency cap: the model finds its
    concurrency by Little's law."""
    rate = row.get("request_rate")
    return row.get("concurrency") is None and isinstance(rate, (int, float)) and rate != float("inf")


def score(row: dict, servers: dict, tmp: Path, spec: Path | None = None) -> dict:
    """The model's figures for the row, on a one-server spec of its GPUs from the catalog (or `spec`)."""
    ctx, model = replica_of(row, servers, tmp, spec)
    pp, (prompt, output) = row.get("pp", 1), _lengths(row)
    if _open_loop(row):
        return open_loop_score(model, ctx.config.num_layers, float(row["request_rate"]), output, pp=pp)
    if row.get("run") == "fixed_batch":
        return fixed_batch_score(model, ctx.config.num_layers, row["concurrency"], prompt, output)
    if row.get("run") == "closed_loop":
        return closed_loop_score(ctx, model, ctx.config.num_layers, row["concurrency"], row.get("front_end_s", 0.0))
    return _at(model, ctx.config.num_layers, row["concurrency"], pp)


def replica_of(row: dict, servers: dict, tmp: Path, spec: Path | None = None):
    """The serving context of the row's model, workload, precision and engine settings, and its
    replica: tp GPUs a stage, pp stages (one a server; pp micro-batches in flight, as vLLM runs them)."""
    if spec is None:
        spec = tmp / f"{row['gpu']}-{row['num_gpus']}.yaml"
        spec.write_text(cluster_yaml(row["gpu"], row["num_gpus"], servers, row=row))
    prompt, output = _lengths(row)
    workload = ServingWorkload(requests=(RequestShape(prompt_len=prompt, output_len=output),), tpot_slo_s=10.0)
    budget = row.get("max_num_batched_tokens") or ServingOptions().max_batched_tokens
    options = ServingOptions(max_batched_tokens=budget, chunked_prefill=mixed_iterations(row))
    ctx = build_context(str(spec), PRESETS[row["model"]], workload, row_precision(row), options)
    return ctx, ctx.replica((Segment(ctx.classes[0].name, row["tp"], row.get("pp", 1)),))


def mixed_iterations(row: dict) -> bool:
    """Whether the row's engine runs prompt chunks in the decodes' iterations, the model's chunked
    prefill (False: prompts in prefill iterations of their own, llm_planner.cost.chunks). vLLM:
    its enable_chunked_prefill, unstated taken as on. SGLang: --enable-mixed-chunk, off unless stated;
    without it SGLang chunks a prompt at --chunked-prefill-size but runs the chunks in prefill
    iterations of their own while the decodes wait."""
    return engine_mixes_prompts(row.get("engine"), row.get("enable_mixed_chunk"), row.get("enable_chunked_prefill"))


def measured_tpot(row: dict) -> float | None:
    """The row's measured time per output token after the first: its tpot_s; else, where the source
    gives a mean end-to-end latency, (mean_e2e_s - ttft_s) / (output_len - 1), the mean gap over
    every token as the model's TPOT is one (a median inter-token gap leaves out the iterations a
    prefill stalls); else its itl_s."""
    if row.get("tpot_s"):
        return row["tpot_s"]
    if row.get("mean_e2e_s") and row.get("ttft_s") and row["output_len"] > 1 and row["mean_e2e_s"] > row["ttft_s"]:
        return (row["mean_e2e_s"] - row["ttft_s"]) / (row["output_len"] - 1)
    return row.get("itl_s")


def _lengths(row: dict) -> tuple[int, int]:
    return max(1, round(row["prompt_len"])), max(1, round(row["output_len"]))


def closed_loop_score(ctx, model, num_layers: int, c: int, front_end_s: float = 0.0) -> dict:
    """c requests of the row's one shape sent at once and each resent as it ends, through a front end of
    `front_end_s` a request, run iteration by iteration (llm_planner.serving.closed_loop), on the split
    the planner picks at c: the TTFT, TPOT and tokens/s such a load generator reports. Where memory
    holds fewer than c full contexts, the engine runs the most it holds (`admitted`, on the split for
    them) and queues the rest, as `score --closed-loop` does; all layers on one stage where not one fits."""
    split, running = queued_split(model, c)
    got = closed_loop_of(ctx, model, split or (num_layers,), c, max_running=running or None, front_end_s=front_end_s)
    figures = {"tpot_s": got.tpot_s, "tokens_per_s": got.tokens_per_s, "ttft_s": got.ttft_s}
    return {**figures, "fits": running == c, "concurrency": c, "admitted": running}


def row_precision(row: dict):
    """The row's dtype, or its weights and KV cache below the activations where it states them."""
    if row.get("weights") is None and row.get("kv_cache_dtype") is None:
        return DTYPES[row["dtype"]]
    return build_precision(row["dtype"], row.get("weights"), row.get("kv_cache_dtype"))


def _at(model, num_layers: int, c: int, pp: int = 1) -> dict:
    """The model at c in flight: pp micro-batches over pp stages (the layers split as the planner splits
    them, evenly where no split fits memory)."""
    m = min(pp, c)
    split = model.split_layers(c, m)
    even = tuple(num_layers // pp + (i < num_layers % pp) for i in range(pp))
    ev = model.evaluate(split or even, c, m)
    return {
        "tpot_s": ev.tpot_s,
        "tokens_per_s": ev.tokens_per_s,
        "ttft_s": ev.ttft_s,
        "fits": split is not None,
        "concurrency": c,
    }


def fixed_batch_score(model, num_layers: int, c: int, prompt: int, output: int) -> dict:
    """A batch of c prompts submitted at once, nothing after them, every sequence generating
    `output` tokens: the prompts in as few iterations as the token budget allows (all in one when
    prefill is not chunked), which yield the first tokens, then output - 1 decode steps of the c
    sequences at the mean context. Its end-to-end time is what the source measured."""
    split = model.split_layers(c, 1)
    layers = split or (num_layers,)
    tokens = c * prompt
    budget = model.tasks.token_budget if model.tasks.chunked_prefill else tokens
    iterations = -(-tokens // budget)
    stages = [
        model.slots[s].costs.stage_load_s(0, tokens / iterations, n, *model.ends[s]) for s, n in enumerate(layers)
    ]
    prefill = iterations * (sum(stages) + model.handoffs_s(c))
    step = model.decode_step_s(layers, c, 1)
    e2e = prefill + (output - 1) * step
    return {
        "tpot_s": step,
        "tokens_per_s": None,
        "ttft_s": prefill,
        "e2e_s": e2e,
        "fits": split is not None,
        "concurrency": c,
    }


def open_loop_score(model, num_layers: int, rate: float, output: int, most: int = 4096, pp: int = 1) -> dict:
    """Requests arriving at `rate` per second: the concurrency c the model settles at is where
    Little's law holds, c = rate x (TTFT(c) + (output - 1) x TPOT(c)); the model's figures there,
    interpolated between the integers around c. The model's tokens/s is rate x output whatever it
    is, so it is not scored."""

    def gap(got: dict) -> float:
        return rate * (got["ttft_s"] + (output - 1) * got["tpot_s"]) - got["concurrency"]

    lo = _at(model, num_layers, 1, pp)
    if gap(lo) <= 0:
        return {**lo, "tokens_per_s": None, "concurrency": f"<1 at {rate:g}/s"}
    c = 1
    while c < most:
        hi = _at(model, num_layers, c + 1, pp)
        if gap(hi) <= 0:
            t = gap(lo) / (gap(lo) - gap(hi))
            mixed = {k: lo[k] + t * (hi[k] - lo[k]) for k in ("tpot_s", "ttft_s")}
            fits = lo["fits"] and hi["fits"]
            return {**mixed, "tokens_per_s": None, "fits": fits, "concurrency": f"{c + t:.1f} at {rate:g}/s"}
        lo, c = hi, c + 1
    return {**lo, "tokens_per_s": None, "fits": False, "concurrency": f"over {most} at {rate:g}/s"}


def ratio(model: float, measured) -> str:
    return f"{model / measured:.2f}" if measured else "-"


def ms(x) -> str:
    return f"{x * 1e3:.1f} ms" if x else "-"


def table_row(row: dict, got: dict) -> dict:
    closed = str(row["id"]).startswith("lambda-p10") or row.get("run") == "fixed_batch"
    if not got["fits"]:  # the engine cannot hold them all: it runs fewer and queues the rest
        return {**_row_head(row, got), **{c: "over memory" for c in COLUMNS[7:] if "ratio" in c}}
    return {
        **_row_head(row, got),
        "e2e ratio": ratio(got["e2e_s"], row.get("e2e_s")) if got.get("e2e_s") else "-",
        "tpot ratio": ratio(got["tpot_s"], measured_tpot(row)),
        "tok/s ratio": "-"
        if closed or got["tokens_per_s"] is None
        else ratio(got["tokens_per_s"], row.get("output_tokens_per_s")),
        "ttft ratio": ratio(got["ttft_s"], row.get("ttft_s")) + _ttft_mark(row, closed),
    }


def _ttft_mark(row: dict, closed: bool) -> str:
    """Why a TTFT is not the model's steady state: a closed batch (all prompts at once), or an engine
    admitting prompts only every n steps (vLLM's multi-step scheduling, gone in V1), a wait the
    model does not have."""
    if closed:
        return " (closed batch)" if row.get("ttft_s") else ""
    steps = row.get("num_scheduler_steps") or 1
    return f" (multi-step {steps})" if steps > 1 and row.get("ttft_s") else ""


def _row_head(row: dict, got: dict) -> dict:
    return {
        "id": row["id"],
        "use": row["use"],
        "gpu": row["gpu"],
        "tp": row["tp"] if row.get("pp", 1) == 1 else f"{row['tp']} x pp{row['pp']}",
        "concurrency": got["concurrency"],
        "prompt/output": f"{row['prompt_len']:.0f}/{row['output_len']:.0f}",
        "tpot measured": ms(measured_tpot(row)),
        "tpot model": ms(got["tpot_s"]),
        "tok/s measured": f"{row['output_tokens_per_s']:,.0f}" if row.get("output_tokens_per_s") else "-",
        "tok/s model": f"{got['tokens_per_s']:,.0f}" if got["tokens_per_s"] else "-",
        "ttft measured": ms(row.get("ttft_s")),
        "ttft model": ms(got["ttft_s"]),
        "e2e measured": ms(row.get("e2e_s")),
        "e2e model": ms(got.get("e2e_s")),
    }


def summary(rows: list[dict]) -> list[str]:
    out = []
    for use in ("calibration", "held_out"):
        for key in ("tpot ratio", "tok/s ratio", "ttft ratio", "e2e ratio"):
            values = [float(r[key]) for r in rows if r["use"] == use and _scored(r[key])]
            if values:
                out.append(
                    f"{use:12s} {key:12s} n={len(values):2d} median {statistics.median(values):.2f} "
                    f"range {min(values):.2f}-{max(values):.2f}"
                )
    return out


def operator_rows(ops: dict, servers: dict, tmp: Path) -> tuple[list[dict], list[dict]]:
    """The linear kernel (Vidur's four projections summed) and the all-reduce per call, model / measured."""
    kinds, lin, ar = {}, {}, {}
    for row in ops["mlp"]:
        if row["model"] not in PRESETS:
            continue
        kind, link = _kind(row["gpu"], max(2, row["tp"]), servers, tmp, kinds)
        ks = layer_kernels(
            preset_config(PRESETS[row["model"]]), "fp16", kind, row["tp"], link if row["tp"] > 1 else None
        )
        model = ks.kernel_s(next(k for k in ks.kernels if k.name == "linear"), Load(decodes=row["num_tokens"]))
        measured = sum(row["time_s"][op] for op in PROJECTIONS)
        lin.setdefault((row["gpu"], row["model"].split("/")[-1], row["tp"]), []).append(f"{model / measured:.2f}")
    for row in ops["all_reduce"]:
        k = row["num_workers"]
        if k != row["devices_per_node"] or row["gpu"] not in servers or row["size_bytes"].bit_length() % 2 == 0:
            continue  # in one server only; every other power of two
        kind, link = _kind(row["gpu"], k, servers, tmp, kinds)
        beta = link.bw_bytes_per_s * kind.collective_bw_efficiency
        model = kind.collective_call_s + 2 * (k - 1) * link.latency_s + 2 * (k - 1) / k * row["size_bytes"] / beta
        ar.setdefault((row["gpu"], k), []).append(f"{model / row['time_s']:.2f}")
    lin_rows = [dict(zip(OP_COLUMNS, (*key, " ".join(v)))) for key, v in lin.items()]
    shares = bandwidth_shares(ops["all_reduce"], servers, tmp, kinds)
    ar_rows = [dict(zip(AR_COLUMNS, (*key, " ".join(v), shares[key]))) for key, v in ar.items()]
    return lin_rows, ar_rows


def bandwidth_shares(rows: list[dict], servers: dict, tmp: Path, kinds: dict) -> dict:
    """(gpu, k) -> the share of the link's bandwidth the all-reduce's bytes reach: the least-squares
    slope of time over size from 1 to 64 MiB (where the per-call time no longer dominates), as
    2 (k - 1) / k / slope over the link's bandwidth; the catalog's collective_efficiency is its
    median over k (llm_planner/core/data/gpu_catalog.yaml)."""
    points: dict = {}
    for row in rows:
        k = row["num_workers"]
        if k == row["devices_per_node"] and row["gpu"] in servers and 2**20 <= row["size_bytes"] <= 2**26:
            points.setdefault((row["gpu"], k), []).append((row["size_bytes"], row["time_s"]))
    out = {}
    for (gpu, k), xy in points.items():
        mx, my = statistics.fmean(x for x, _ in xy), statistics.fmean(y for _, y in xy)
        slope = sum((x - mx) * (y - my) for x, y in xy) / sum((x - mx) ** 2 for x, _ in xy)
        _, link = _kind(gpu, k, servers, tmp, kinds)
        out[(gpu, k)] = f"{2 * (k - 1) / k / slope / link.bw_bytes_per_s:.2f}"
    return out


def _kind(gpu: str, k: int, servers: dict, tmp: Path, seen: dict):
    if (gpu, k) not in seen:
        spec = tmp / f"op-{gpu}-{k}.yaml"
        spec.write_text(cluster_yaml(gpu, k, servers))
        cluster = load_cluster(spec)
        devices = cluster.devices()
        seen[(gpu, k)] = (cluster.device_kinds[0], cluster.link(devices[0], devices[1]))
    return seen[(gpu, k)]


def _scored(cell: str) -> bool:
    return cell not in ("-", "over memory") and "(" not in cell


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fidelity"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    refs = yaml.safe_load((DATA / "fidelity_references.yaml").read_text())
    servers = yaml.safe_load((DATA / "fidelity_servers.yaml").read_text())
    rows, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for row in refs["serving"]:
            reason = why_not(row)
            if reason:
                skipped.append(f"{row['id']}: {reason}")
                continue
            rows.append(table_row(row, score(row, servers, Path(tmp))))
        ops = yaml.safe_load((DATA / refs["operators_file"]).read_text())
        lin_rows, ar_rows = operator_rows(ops, servers, Path(tmp))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        grid_md, grid_lines = fidelity_grid.run(
            DATA / refs["grid_file"], lambda row: score(row, servers, Path(tmp)), Path(args.out)
        )
        static_md, static_lines = fidelity_static.run(
            DATA / refs["static_file"], lambda row: score(row, servers, Path(tmp)), servers, Path(args.out)
        )
    print(provenance.markdown_table(COLUMNS, ([r[c] for c in COLUMNS] for r in rows)))
    lines = summary(rows) + grid_lines + static_lines
    print("\n".join(lines))
    print(grid_md + static_md)
    print("not scored:\n  " + "\n  ".join(skipped))
    ops_md = provenance.markdown_table(OP_COLUMNS, ([r[c] for c in OP_COLUMNS] for r in lin_rows))
    ops_md += "\n" + provenance.markdown_table(AR_COLUMNS, ([r[c] for c in AR_COLUMNS] for r in ar_rows))
    print(ops_md)
    provenance.write_results(args.out, COLUMNS, rows, facts)
    table = Path(args.out) / "table.md"
    summary_md = "Ratios model / measured:\n\n```\n" + "\n".join(lines) + "\n```\n\nNot scored:\n\n"
    summary_md += "".join(f"- {line}\n" for line in skipped)
    operators_md = "\nVidur's operator medians (model / measured; fp16; calibration):\n\n" + ops_md
    grid_md = (
        f"\nThe NIM grid ({fidelity_grid.SOURCE}; A100 runs and H100 runs at 1-25 in flight calibration, "
        "H100 runs at 50-250 in flight held out; "
        "each run in grid.csv):\n" + grid_md
    )
    static_md = f"\nThe static batches ({fidelity_static.SOURCE}; held out; each run in static.csv):\n" + static_md
    table.write_text(table.read_text() + "\n" + summary_md + operators_md + grid_md + static_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
