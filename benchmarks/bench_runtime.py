"""Benchmark: the MPI decoder pipeline against one process running the same model.

    .venv/bin/python benchmarks/bench_runtime.py [--ranks 2] [--layers 8] [--hidden 256] [--batch 4]
                                                 [--prompt-len 16] [--new-tokens 32] [--repeats 3] [--out DIR]

A small GPT-2 (seeded weights) is planned on the localhost cluster with its
blocks split evenly over `--ranks` CPU devices (embed with the first blocks,
final norm and LM head with the last), then generated greedily for a batch of
`--batch` prompts:

- `generate (1 process)`: transformers' `model.generate` on the whole model,
  torch limited to one thread (a rank has one core);
- `stages (1 process)`: the runtime's own decoder code with every task in one
  stage, no MPI (what the pipeline costs before communication);
- `mpi, M micro-batch(es)`: `llm-planner launch` of the plan on `--ranks`
  localhost ranks, once with the batch in one shard and once cut into one
  shard per rank on the same stages (the plan's pipelined micro-batches).

Reported per row: tokens/s (generated tokens of the batch over the wall time
of generation, model building excluded), per-token latency (time of one
generation step for the whole batch), the compute time summed over ranks
(the model's work; it grows when ranks share cores with each other or with
other processes) and, for MPI runs, the runtime's overhead: the share of rank
time spent outside compute, transfers and waiting for messages (target: at
most 10%). Tokens of every run are checked equal; the exit status is 1 if
they differ or the overhead exceeds 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]


def _plan(workdir: Path, args, micro: int) -> tuple[Path, object]:
    """The even split of the blocks over the ranks, the batch cut into `micro` shards on the same stages."""
    from transformers import GPT2Config

    from llm_planner.core.plan import save_plan
    from llm_planner.graph.models import ModelSpec
    from llm_planner.placement.inputs import problem_from_inputs
    from llm_planner.placement.schedule import make_plan

    config = GPT2Config(
        n_layer=args.layers,
        n_embd=args.hidden,
        n_head=args.heads,
        vocab_size=args.vocab,
        n_positions=args.prompt_len + args.new_tokens,
        bos_token_id=0,
        eos_token_id=args.vocab - 1,
    )
    if not (workdir / "model").is_dir():
        config.save_pretrained(workdir / "model")
    model = ModelSpec(name=str(workdir / "model"), dtype="fp32", seq_len=args.prompt_len + args.new_tokens)
    problem = problem_from_inputs(
        cluster_path=str(REPO / "cluster_specs" / "localhost-cpu.yaml"),
        model=model,
        objective="latency",
        batch_size=args.batch,
        max_shards=micro,
    )
    row, layer = [], 0
    for task in problem.graph.tasks:
        if task.name.startswith("block."):
            layer = int(task.name.split(".")[1])
        row.append(min(args.ranks - 1, layer * args.ranks // args.layers))
    sizes = [args.batch // micro + (1 if s < args.batch % micro else 0) for s in range(micro)]
    plan = make_plan(
        problem,
        sizes,
        [row] * micro,
        solver="even-split (benchmark)",
        status="heuristic",
        started_at=time.perf_counter(),
        lower_bound_s=0.0,
    )
    save_plan(plan, workdir / f"plan{micro}.yaml")
    return workdir / f"plan{micro}.yaml", config


def _single_process(config, prompts: list[list[int]], steps: int, repeats: int) -> list[dict]:
    import torch

    from llm_planner.runtime import gpt

    torch.set_num_threads(1)
    config = gpt.prepare_config(config)
    source = gpt.weight_source(config, checkpoint=None, seed=0)
    model = gpt.build_whole_model(config, source)
    gpt.generate_whole(model, config, prompts, 2)  # warm-up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = gpt.generate_whole(model, config, prompts, steps)
        runs.append(_row("generate (1 process)", time.perf_counter() - start, tokens, steps))
    rows = [_median(runs)]
    shard = gpt.DecoderShard(
        config,
        set(gpt.decoder_tasks(config.num_hidden_layers)),
        device=torch.device("cpu"),
        dtype=torch.float32,
        source=source,
    )
    eos, pad = gpt.special_tokens(config)
    runs = []
    for _ in range(repeats + 1):  # the first is a warm-up
        ids, mask = gpt.pad_prompts(prompts, gpt.prompt_pad_id(config))
        stream = shard.new_stream(
            requests=list(range(len(prompts))), prompt_ids=ids, prompt_mask=mask, eos_ids=eos, pad_id=pad
        )
        tasks, value = gpt.decoder_tasks(config.num_hidden_layers), ids
        start = time.perf_counter()
        with torch.no_grad():
            for step in range(steps):
                value = shard.run_stage(tasks, value, stream, step)
        runs.append(_row("stages (1 process)", time.perf_counter() - start, stream.tokens(), steps))
    rows.append(_median(runs[1:]))
    return rows


def _median(runs: list[dict]) -> dict:
    """The run of median wall time (the machine may be shared: single runs are noisy)."""
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def _row(
    label: str,
    seconds: float,
    tokens: list[list[int]],
    steps: int,
    *,
    compute_s: float | None = None,
    overhead: float | None = None,
) -> dict:
    return {
        "run": label,
        "seconds": seconds,
        "tokens_per_s": sum(map(len, tokens)) / seconds,
        "per_token_ms": 1e3 * seconds / steps,
        "compute_s": seconds if compute_s is None else compute_s,
        "overhead": overhead,
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--ranks", type=int, default=2, help="localhost ranks (at most 4, the devices of localhost-cpu.yaml)"
    )
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="runs per row; the row shows the run of median time")
    p.add_argument(
        "--out",
        default=str(REPO / "benchmarks" / "results" / "runtime"),
        help="folder for results.json, table.md and meta.json (default: benchmarks/results/runtime)",
    )
    args = p.parse_args(argv)
    facts = provenance.start(sys.argv if argv is None else [sys.argv[0], *argv])
    if not 1 <= args.ranks <= 4 or args.ranks > args.layers:
        p.error("--ranks must be in 1..4 and at most --layers")
    import random

    from llm_planner.launch.plan_launch import launch_plan

    rng = random.Random(0)
    prompts = [[rng.randrange(args.vocab - 1) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        _, config = _plan(Path(tmp), args, 1)
        rows = _single_process(config, prompts, args.new_tokens, args.repeats)
        for micro in sorted({1, args.ranks}):
            plan, _ = _plan(Path(tmp), args, micro)
            runs = []
            for _ in range(args.repeats):
                result = launch_plan(
                    plan,
                    prompt_ids=prompts,
                    max_new_tokens=args.new_tokens,
                    workdir=str(Path(tmp) / f"run{micro}"),
                    timeout_s=600,
                )
                if not result.ok:
                    print(f"launch failed: {result.error}", file=sys.stderr)
                    return 1
                r = result.report
                runs.append(
                    _row(
                        f"mpi, {args.ranks} ranks, {micro} micro-batch(es)",
                        r["wall_s"],
                        r["tokens"],
                        args.new_tokens,
                        compute_s=sum(rank["compute_s"] for rank in r["ranks"]),
                        overhead=r["overhead_fraction"],
                    )
                )
            rows.append(_median(runs))
    same = all(row["tokens"] == rows[0]["tokens"] for row in rows)
    lines = [
        f"GPT-2 {args.layers} layers x {args.hidden} wide, vocab {args.vocab}; "
        f"batch {args.batch} x {args.prompt_len} prompt "
        f"tokens, {args.new_tokens} new tokens; tokens identical in every run: {same}",
        "",
        "| run | tokens/s | per-token latency (ms) | compute, all ranks (s) | runtime overhead |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        overhead = "" if row["overhead"] is None else f"{100 * row['overhead']:.1f}%"
        lines.append(
            f"| {row['run']} | {row['tokens_per_s']:.1f} | {row['per_token_ms']:.2f} | "
            f"{row['compute_s']:.3f} | {overhead} |"
        )
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    shown = {
        **vars(args),
        "out": str(out.resolve().relative_to(REPO)) if out.resolve().is_relative_to(REPO) else str(out),
    }
    (out / "results.json").write_text(
        json.dumps(
            {
                "args": shown,
                "tokens_identical": same,
                "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
            },
            indent=1,
        )
    )
    provenance.record(out, facts)
    worst = max((r["overhead"] for r in rows if r["overhead"] is not None), default=0.0)
    return 0 if same and worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
