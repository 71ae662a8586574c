"""Time one decode iteration of a serving stage (llm_planner.runtime.serve_stage) in one process,
and show where its time goes (torch's profiler: host time per op, and device time on a GPU).

The stage holds the last `--layers` decoder layers of `--model` with the final norm and LM head,
seeded weights, and a slot KV cache of `--batch` sequences; every iteration decodes one token of
each, at `--start` keys. The median of 20 iterations after 3 warm-ups is printed, then the
profiler's tables of 3 more.

    .venv/bin/python benchmarks/profile_serve_stage.py --model llama3-8b --batch 65 --start 100 --layers 4
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from llm_planner.runtime import gpt
from llm_planner.runtime.serve_scheduler import Entry
from llm_planner.runtime.serve_stage import ServeStage


def build(model: str, batch: int, start: int, layers: int, device: torch.device, dtype: torch.dtype) -> ServeStage:
    config = gpt.prepare_config(gpt.load_hf_config({"name": model}, None))
    total = gpt.num_layers_of(config)
    source = gpt.weight_source(config, checkpoint=None, seed=0)
    return ServeStage(
        config,
        first_layer=total - layers,
        num_layers=layers,
        slots=batch,
        context_len=start + 64,
        device=device,
        dtype=dtype,
        source=source,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--batch", type=int, default=65)
    ap.add_argument("--start", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    stage = build(args.model, args.batch, args.start, args.layers, device, dtype)
    print(f"built {args.layers} layers + head in {time.perf_counter() - t0:.1f} s")
    entries = tuple(Entry(s, args.start, 1, True) for s in range(args.batch))
    hidden = torch.randn(args.batch, stage.config.hidden_size, dtype=dtype, device=device)

    def once() -> None:
        stage.run(entries, hidden)
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        once()
    times = []
    for _ in range(20):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    median = statistics.median(times) * 1e3
    print(
        f"decode iteration, {args.batch} sequences at {args.start} keys, {args.layers} layers + head: {median:.2f} ms"
    )
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            once()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))
    if device.type == "cuda":
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=40))


if __name__ == "__main__":
    main()
