"""Time a decoder layer's linear kernels and a memory copy on this machine's accelerator (or CPU).

The serving model (llm_planner.cost.iteration) times a layer's four projections as one roofline
with a rounded corner, at the device kind's compute_efficiency and mem_efficiency. This script
measures those projections as torch runs them (one matmul each, weights [in, out], bf16 on a
GPU, fp32 on a CPU) for a Llama-3 8B-shaped layer at several token counts, and a device-to-device
copy, and reports what fraction of the kind's catalog peaks they reach:

    achieved FLOP/s = 2 tokens params / t        achieved bytes/s = (weights + activations) / t

Each figure is the median of `--repeats` timed runs after three warm-ups (CUDA events on a GPU).

    python benchmarks/bench_gpu_linear.py --kind h200-sxm-141g [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

# (name, in_features, out_features) of one Llama-3 8B layer: q/k/v fused, o, gate/up fused, down
LLAMA3_8B = (("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096))
TOKENS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _timer(device: torch.device):
    if device.type == "cuda":

        def timed(fn) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3

        return timed

    def timed_cpu(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return timed_cpu


def median_s(fn, device: torch.device, repeats: int) -> float:
    timed = _timer(device)
    for _ in range(3):
        timed(fn)
    return statistics.median(timed(fn) for _ in range(repeats))


def linear_rows(device: torch.device, dtype: torch.dtype, tokens: tuple[int, ...], repeats: int) -> list[dict]:
    weights = {name: torch.randn(n_in, n_out, device=device, dtype=dtype) for name, n_in, n_out in LLAMA3_8B}
    params = sum(n_in * n_out for _, n_in, n_out in LLAMA3_8B)
    elem = torch.finfo(dtype).bits // 8
    rows = []
    for n in tokens:
        xs = {name: torch.randn(n, n_in, device=device, dtype=dtype) for name, n_in, _ in LLAMA3_8B}

        def layer(xs=xs):
            for name, _, _ in LLAMA3_8B:
                torch.matmul(xs[name], weights[name])

        t = median_s(layer, device, repeats)
        io = sum(n * (n_in + n_out) for _, n_in, n_out in LLAMA3_8B)
        rows.append({"tokens": n, "time_s": t, "flops": 2 * n * params, "bytes": elem * (params + io)})
    return rows


def copy_bytes_per_s(device: torch.device, nbytes: int, repeats: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = median_s(lambda: dst.copy_(src), device, repeats)
    return 2 * nbytes / t  # read and write


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", required=True, help="the catalog entry the peaks are read from")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from llm_planner.core.catalog import catalog_entry

    kind = catalog_entry(args.kind)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype, dname = (torch.bfloat16, "bf16") if device.type == "cuda" else (torch.float32, "fp32")
    peak_flops, peak_bw = dict(kind["peak_flops"])[dname], kind["mem_bw_bytes_per_s"]
    tokens = TOKENS if device.type == "cuda" else TOKENS[:4]
    rows = linear_rows(device, dtype, tokens, args.repeats)
    copy_bw = copy_bytes_per_s(device, (4 << 30) if device.type == "cuda" else (64 << 20), args.repeats)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device: {name}; catalog {args.kind}: {dname} {peak_flops / 1e12:.1f} TFLOP/s, {peak_bw / 1e9:.0f} GB/s")
    print(f"copy: {copy_bw / 1e9:.0f} GB/s = {copy_bw / peak_bw:.2f} of peak bandwidth")
    print("| tokens | time | of peak FLOP/s | of peak bytes/s |\n|---|---|---|---|")
    for r in rows:
        r["of_peak_flops"], r["of_peak_bw"] = r["flops"] / r["time_s"] / peak_flops, r["bytes"] / r["time_s"] / peak_bw
        print(f"| {r['tokens']} | {r['time_s'] * 1e6:.1f} us | {r['of_peak_flops']:.3f} | {r['of_peak_bw']:.3f} |")
    if args.out:
        doc = {"device": name, "kind": args.kind, "dtype": dname, "copy_bytes_per_s": copy_bw, "linear": rows}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
