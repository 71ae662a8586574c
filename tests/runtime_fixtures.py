"""Tiny models and hand-made plans for the launcher and runtime tests."""

from __future__ import annotations

import time
from pathlib import Path

from llm_planner.core.plan import save_plan
from llm_planner.graph.models import ModelSpec
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.schedule import make_plan

REPO = Path(__file__).resolve().parents[1]
LOCALHOST = REPO / "cluster_specs" / "localhost-cpu.yaml"


def tiny_gpt2(**overrides):
    from transformers import GPT2Config

    kw = dict(
        n_layer=4,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=64,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=127,
    )
    return GPT2Config(**{**kw, **overrides})


def tiny_llama(**overrides):
    from transformers import LlamaConfig

    kw = dict(
        num_hidden_layers=5,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaConfig(**{**kw, **overrides})


def save_config(config, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    return directory


def decoder_plan(
    path: Path,
    model_dir: Path,
    layouts: list[dict[str, int]],
    *,
    shard_sizes: list[int] | None = None,
    objective: str = "latency",
    cluster: Path = LOCALHOST,
    granularity: str = "block",
    max_tp: int = 1,
) -> Path:
    """A plan of the decoder in `model_dir`; layouts[s] maps task -> device index or name, a group's name
    ("localhost/cpu-core:0-1") included (absent tasks: the previous task's)."""
    sizes = shard_sizes or [1] * len(layouts)
    model = ModelSpec(name=str(model_dir), dtype="fp32", seq_len=16, granularity=granularity)
    problem = problem_from_inputs(
        cluster_path=str(cluster), model=model, objective=objective, batch_size=sum(sizes), max_tp=max_tp
    )
    names = [d.name for d in problem.devices]
    assignments = []
    for layout in layouts:
        current, row = 0, []
        for task in problem.graph.tasks:
            chosen = layout.get(task.name, current)
            current = names.index(chosen) if isinstance(chosen, str) else chosen
            row.append(current)
        assignments.append(row)
    plan = make_plan(
        problem,
        sizes,
        assignments,
        solver="test",
        status="heuristic",
        started_at=time.perf_counter(),
        lower_bound_s=0.0,
    )
    save_plan(plan, path)
    return path


def graph_plan(
    path: Path, name: str, *, batch: int, num_devices: int, shards: int = 1, cluster: Path = LOCALHOST
) -> Path:
    """A plan of a CNN / RWNN preset: the tasks cut into `num_devices` contiguous thirds, with one task
    moved back to the first device (so a device's tasks would form a cycle between ranks); a second
    shard, if any, rotates the devices."""
    problem = problem_from_inputs(cluster_path=str(cluster), model=ModelSpec(name=name, dtype="fp32"), batch_size=batch)
    n = problem.num_tasks
    first = [min(num_devices - 1, num_devices * i // n) for i in range(n)]
    first[n // 2] = 0
    assignments = [[(d + s) % num_devices for d in first] for s in range(shards)]
    sizes = [batch // shards + (1 if s < batch % shards else 0) for s in range(shards)]
    plan = make_plan(
        problem,
        sizes,
        assignments,
        solver="test",
        status="heuristic",
        started_at=time.perf_counter(),
        lower_bound_s=0.0,
    )
    save_plan(plan, path)
    return path
