"""A layer's parts measured on a GPU (`llm-planner profile-serving --raw`) against the kernel model.

Reads the raw timings that `profile-serving --raw FILE` wrote on a GPU (committed under
benchmarks/results/gpu_parts/, with the command that made them) and, for each model and
tensor-parallel degree, prints and writes:

- the four projections (cuBLAS GEMMs in a CUDA graph, L2 flushed) against the kernel model's
  `linear` kernel (llm_planner.cost.iteration) at the device kind's catalog factors, at each token
  count;
- an affine fit over every degree's small-token points (tokens <= 64, where the GEMMs stream their
  weights): t = a + weight bytes / bw, a the fixed time of a layer's four GEMMs, bw the bandwidth
  they reach (and its share of the kind's peak);
- decode attention (torch's flash kernel, query heads packed per key/value head) against the
  kernel model's `attn_decode` at a few batches and contexts, where the raw file has it.

    .venv/bin/python benchmarks/bench_gpu_parts.py [--kind-spec cluster_specs/localhost-h200.yaml]

Writes benchmarks/results/gpu_parts/{table.md,results.json}. Nothing here needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import provenance
import yaml

from llm_planner.core.catalog import catalog_entry
from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.spec import load_cluster
from llm_planner.core.spec_links import LinkSpec
from llm_planner.cost.iteration import Load, layer_kernels
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.transformer import matmul_parameters

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "gpu_parts"
SHOW_TOKENS = (1, 64, 128, 256, 512, 1024, 4096)
SMALL_TOKENS = 64  # the fits' points: decode sizes, where the GEMMs stream their weights
VIDUR = HERE / "data" / "vidur_operators.yaml"
VIDUR_MODELS = {
    "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama3-70b",
    "meta-llama/Llama-2-70b-hf": "llama2-70b",
}
PROJECTIONS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
SHOW_ATTN = ((1, 512), (16, 2048), (64, 2048), (256, 512), (256, 8192))
NVLINK = LinkSpec(bw_bytes_per_s=450e9, latency_s=1e-6)


def kernel_model(model: str, dtype: str, kind, k: int):
    kernels = layer_kernels(preset_config(model), dtype, kind, k, NVLINK if k > 1 else None)
    by_name = {kern.name: kern for kern in kernels.kernels}
    return lambda name, load: kernels.kernel_s(by_name[name], load)


def linear_rows(doc: dict, kind) -> list[dict]:
    rows, model, dtype = [], doc["model"], doc["dtype"]
    for k, tables in sorted(doc["tp"].items(), key=lambda kv: int(kv[0])):
        time_of = kernel_model(model, dtype, kind, int(k))
        for tokens, measured in tables["linear_layer_s"]:
            if tokens in SHOW_TOKENS:
                predicted = time_of("linear", Load(decodes=tokens))
                rows.append(
                    dict(model=model, dtype=dtype, tp=int(k), tokens=tokens, measured_s=measured, model_s=predicted)
                )
    return rows


def affine_fit(docs: list[dict], kind) -> dict:
    """t = a + bytes / bw over every model's and degree's points of at most 64 tokens (one dtype)."""
    xs, ys = [], []
    for doc in docs:
        weights = layer_weight_bytes(doc["model"], DTYPE_BYTES[doc["dtype"]])
        for k, tables in doc["tp"].items():
            for tokens, seconds in tables["linear_layer_s"]:
                if tokens <= SMALL_TOKENS:
                    xs.append(weights / int(k))
                    ys.append(seconds)
    return dict(source=f"{kind.name}, {docs[0]['dtype']}", **_fit(xs, ys, kind.mem_bw_bytes_per_s))


def layer_weight_bytes(model: str, dtype_bytes: int) -> float:
    """One layer's linear weights in bytes: what its four projections stream."""
    params = matmul_parameters(preset_config(model))
    return (params["attn"] + params["mlp"]) * dtype_bytes


def _fit(xs: list[float], ys: list[float], peak_bw: float) -> dict:
    slope, intercept = np.polyfit(np.array(xs), np.array(ys), 1)
    fitted = intercept + slope * np.array(xs)
    return dict(
        points=len(xs),
        fixed_s=float(intercept),
        bw_bytes_per_s=float(1 / slope),
        bw_share_of_peak=float(1 / slope / peak_bw),
        worst_rel_error=float(np.max(np.abs(fitted / np.array(ys) - 1))),
    )


def vidur_fits() -> list[dict]:
    """The same fit on Vidur's A100 and H100 operator medians (fp16, vLLM's kernels; the four
    projections of mlp.csv at up to 64 tokens), and the median of the layer's other operators there
    (norms, rotary, activation, add: vLLM's fused elementwise kernels)."""
    refs = yaml.safe_load(VIDUR.read_text())["mlp"]
    out = []
    for gpu in sorted({r["gpu"] for r in refs}):
        rows = [r for r in refs if r["gpu"] == gpu and r["num_tokens"] <= SMALL_TOKENS]
        xs = [layer_weight_bytes(VIDUR_MODELS[r["model"]], 2) / r["tp"] for r in rows]
        ys = [sum(r["time_s"][op] for op in PROJECTIONS) for r in rows]
        rest = [sum(r["time_s"].values()) - y for r, y in zip(rows, ys)]
        fit = _fit(xs, ys, catalog_entry(gpu)["mem_bw_bytes_per_s"])
        out.append(dict(source=f"{gpu}, fp16 (Vidur)", elementwise_median_s=float(np.median(rest)), **fit))
    return out


def attention_rows(doc: dict, kind) -> list[dict]:
    rows, model = [], doc["model"]
    for k, tables in sorted(doc["tp"].items(), key=lambda kv: int(kv[0])):
        time_of = kernel_model(model, doc["dtype"], kind, int(k))
        for batch, context, measured in tables.get("attn_decode_s", []):
            if (batch, context) in SHOW_ATTN:
                predicted = time_of("attn_decode", Load(decodes=batch, decode_keys=batch * context))
                rows.append(
                    dict(model=model, tp=int(k), batch=batch, context=context, measured_s=measured, model_s=predicted)
                )
    return rows


def markdown(linear: list[dict], fits: list[dict], attention: list[dict], kind, sources: list[str]) -> str:
    out = [
        f"Device kind `{kind.name}` (catalog factors: mem_efficiency {kind.mem_efficiency}, "
        f"compute_efficiency {kind.compute_efficiency}); raw timings: {', '.join(sources)}.",
        "",
        "| model | dtype | tp | tokens | measured | kernel model | model / measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in linear:
        out.append(
            f"| {r['model']} | {r['dtype']} | {r['tp']} | {r['tokens']} | {r['measured_s'] * 1e6:.1f} us | "
            f"{r['model_s'] * 1e6:.1f} us | {r['model_s'] / r['measured_s']:.2f} |"
        )
    out.append("")
    for fit in fits:
        rest = fit.get("elementwise_median_s")
        out.append(
            f"Affine fit, {fit['source']}, over {fit['points']} points of at most 64 tokens: a layer's four "
            f"projections take {fit['fixed_s'] * 1e6:.1f} us + weight bytes / {fit['bw_bytes_per_s'] / 1e12:.2f} TB/s "
            f"({fit['bw_share_of_peak']:.2f} of the peak); worst point {fit['worst_rel_error'] * 100:.1f}% off"
            + (f"; the layer's other operators, median {rest * 1e6:.1f} us" if rest is not None else "")
            + ".\n"
        )
    if attention:
        out += [
            "| model | tp | batch | context | measured | kernel model | model / measured |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in attention:
            out.append(
                f"| {r['model']} | {r['tp']} | {r['batch']} | {r['context']} | {r['measured_s'] * 1e6:.1f} us | "
                f"{r['model_s'] * 1e6:.1f} us | {r['model_s'] / r['measured_s']:.2f} |"
            )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind-spec", default=str(HERE.parent / "cluster_specs" / "localhost-h200.yaml"))
    ap.add_argument("--raw", nargs="+", default=sorted(str(p) for p in RESULTS.glob("*.raw.json")))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    kind = load_cluster(args.kind_spec).device_kinds[0]
    docs = [json.loads(Path(p).read_text()) for p in args.raw]
    linear = [r for d in docs for r in linear_rows(d, kind)]
    attention = [r for d in docs for r in attention_rows(d, kind)]
    fits = [affine_fit([d for d in docs if d["dtype"] == dtype], kind) for dtype in sorted({d["dtype"] for d in docs})]
    fits += vidur_fits()
    text = markdown(linear, fits, attention, kind, [Path(p).name for p in args.raw])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "table.md").write_text(text)
    (RESULTS / "results.json").write_text(json.dumps(dict(linear=linear, fits=fits, attention=attention), indent=1))
    provenance.record(RESULTS, facts)
    print(text)


if __name__ == "__main__":
    main()
