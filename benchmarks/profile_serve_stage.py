"""Time one decode iteration of a serving stage (llm_planner.runtime.serve_stage) in one process,
and show where its time goes (torch's profiler: host time per op, and device time on a GPU).

The stage holds the last `--layers` decoder layers of `--model` with the final norm and LM head,
seeded weights, and a slot KV cache of `--batch` sequences; every iteration decodes one token of
each, at `--start` keys (with `--prompt N`, also an iteration where slot 0 runs a prompt chunk of
N tokens instead). The median of 20 iterations after 3 warm-ups is printed, eagerly and, with
`--graphs`, as the piecewise CUDA graphs of llm_planner.runtime.serve_graphs (plain calls on a
CPU) with how many of their tokens equal the eager ones; then the profiler's tables of 3 more.

    .venv/bin/python benchmarks/profile_serve_stage.py --model llama3-8b --batch 65 --start 100 --layers 4
    .venv/bin/python benchmarks/profile_serve_stage.py --batch 65 --start 100 --layers 4 --prompt 32 --graphs
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from llm_planner.runtime import gpt, serve_stage
from llm_planner.runtime.serve_graphs import Pieces
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


GROW_STEPS = 30  # the most iterations one timing runs (3 warm-ups and 20 timed)


def median_ms(once, repeats: int = 20) -> float:
    """The median wall time of `once` over `repeats` calls after 3 warm-ups, in ms."""
    for _ in range(3):
        once()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def iterations(batch: int, start: int, prompt: int) -> dict[str, tuple[Entry, ...]]:
    """A decode of each sequence; with `prompt`, also one whose slot 0 runs a prompt chunk of that many tokens."""
    decodes = tuple(Entry(s, start, 1, True) for s in range(batch))
    out = {f"decode x{batch}": decodes}
    if prompt:
        out[f"decode x{batch - 1} + prompt {prompt}"] = (Entry(0, 0, prompt, True), *decodes[1:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--batch", type=int, default=65)
    ap.add_argument("--start", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=0, help="also time an iteration with a prompt chunk of this many")
    ap.add_argument("--graphs", action="store_true", help="also the piecewise CUDA graphs (serve_graphs)")
    ap.add_argument("--grow", action="store_true", help="each timed iteration one key longer, as decoding goes")
    ap.add_argument("--cudnn-attention", action="store_true", help="leave torch's cuDNN attention on (serve_stage)")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiler's tables")
    args = ap.parse_args()
    serve_stage.CUDNN_ATTENTION_OFF = not args.cudnn_attention
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    stage = build(args.model, args.batch, args.start + args.prompt + 2 * GROW_STEPS, args.layers, device, dtype)
    print(f"built {args.layers} layers + head in {time.perf_counter() - t0:.1f} s")
    runners = {"eager": stage}
    if args.graphs:
        runners["graphs"] = Pieces(stage, max(args.batch, args.batch - 1 + args.prompt), capture=device.type == "cuda")
    keys = f"from {args.start} keys, one more each iteration" if args.grow else f"at {args.start} keys"
    for name, entries in iterations(args.batch, args.start, args.prompt).items():
        tokens = sum(e.tokens for e in entries)
        hidden = torch.randn(tokens, stage.config.hidden_size, dtype=dtype, device=device)
        outs = {}
        for label, runner in runners.items():
            step = iter(range(GROW_STEPS))

            def once(runner=runner, label=label, name=name, hidden=hidden, outs=outs, step=step) -> None:
                at = args.start + (next(step) if args.grow else 0)
                outs[label] = runner.run(iterations(args.batch, at, args.prompt)[name], hidden)
                if device.type == "cuda":
                    torch.cuda.synchronize()

            ms = median_ms(once)
            print(f"{name}, {keys}, {args.layers} layers + head, {label}: {ms:.2f} ms")
        if "graphs" in outs:
            same = (outs["graphs"] == outs["eager"]).float().mean().item()
            print(f"  tokens equal between eager and graphs: {same:.1%} of {len(outs['eager'])}")
    if args.no_profile:
        return
    entries = next(iter(iterations(args.batch, args.start, 0).values()))
    hidden = torch.randn(args.batch, stage.config.hidden_size, dtype=dtype, device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    runner = runners["graphs" if args.graphs else "eager"]
    with profile(activities=activities) as prof:
        for _ in range(3):
            runner.run(entries, hidden)
            if device.type == "cuda":
                torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))
    if device.type == "cuda":
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=40))


if __name__ == "__main__":
    main()
