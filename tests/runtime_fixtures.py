"""Tiny models and hand-made plans for the launcher and runtime tests."""

from __future__ import annotations

import threading
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


# the small llama-family decoder both dense fixtures below share (tiny_qwen3 changes its heads)
_TINY_LLAMA = dict(
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


def tiny_llama(**overrides):
    from transformers import LlamaConfig

    return LlamaConfig(**{**_TINY_LLAMA, **overrides})


def tiny_qwen3(**overrides):
    """Llama's layout with q and k norms on 24-wide heads (heads x head_dim = 96, not the hidden 64)."""
    from transformers import Qwen3Config

    return Qwen3Config(**{**_TINY_LLAMA, "num_hidden_layers": 4, "head_dim": 24, **overrides})


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
    path: Path,
    name: str,
    *,
    batch: int,
    num_devices: int,
    shards: int = 1,
    cluster: Path = LOCALHOST,
    objective: str = "latency",
) -> Path:
    """A plan of a CNN / RWNN preset: the tasks cut into `num_devices` contiguous thirds, with one task
    moved back to the first device (so a device's tasks would form a cycle between ranks); a second
    shard, if any, rotates the devices."""
    problem = problem_from_inputs(
        cluster_path=str(cluster), model=ModelSpec(name=name, dtype="fp32"), batch_size=batch, objective=objective
    )
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


TINY_MIXTRAL = REPO / "cluster_specs" / "localhost-serve-mixtral"  # 4 layers, 64 wide, 4 experts, top-2


def tiny_mixtral():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(TINY_MIXTRAL), local_files_only=True)


def _tiny_moe(config_class, **kw):
    common = dict(
        num_hidden_layers=3,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    )
    return config_class(**{**common, **kw})


def tiny_qwen2_moe(**overrides):
    """A shared expert of width 48 with its sigmoid gate; q, k, v biases; top-k weights not renormalised."""
    from transformers import Qwen2MoeConfig

    return _tiny_moe(Qwen2MoeConfig, shared_expert_intermediate_size=48, **overrides)


def tiny_qwen3_moe(**overrides):
    """q and k norms on 24-wide heads (heads x head_dim = 96, not the hidden 64); top-k weights renormalised."""
    from transformers import Qwen3MoeConfig

    return _tiny_moe(Qwen3MoeConfig, head_dim=24, norm_topk_prob=True, **overrides)


class ThreadGroup:
    """Collectives among k threads (one per member): what GroupComm does over MPI."""

    def __init__(self, k: int):
        self.size, self.slots, self.barrier = k, [None] * k, threading.Barrier(k, timeout=60)
        self.counts = [{"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0} for _ in range(k)]

    def run(self, member) -> None:
        """member(i) for each member i, in a thread each; the first error any raised is raised here
        (a member that fails breaks the barrier, so the others stop too)."""
        errors = []

        def guarded(i: int) -> None:
            try:
                member(i)
            except BaseException as exc:  # noqa: BLE001 (re-raised below, in the caller's thread)
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=guarded, args=(i,)) for i in range(self.size)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]

    def member(self, index: int):
        group = self

        class Member:
            size = group.size

            def __init__(self):
                self.index = index

            def _exchange(self, t):
                group.slots[index] = t.clone()
                group.barrier.wait()
                every = list(group.slots)
                group.barrier.wait()
                return every

            def all_reduce_(self, t):
                group.counts[index]["all_reduce"] += 1
                every = self._exchange(t)
                total = every[0].clone()
                for part in every[1:]:
                    total += part
                return t.copy_(total)

            def all_gather(self, t):
                import torch

                group.counts[index]["all_gather"] += 1
                return torch.stack(self._exchange(t))

            def all_gather_v(self, t, counts):
                import torch

                group.counts[index]["all_gather"] += 1
                every = self._exchange(t)
                assert [len(x) for x in every] == list(counts)
                return torch.cat(every).to(torch.float32)

            def reduce_scatter_v(self, t, counts):
                import torch

                group.counts[index]["reduce_scatter"] += 1
                every = self._exchange(t)
                total = every[0].to(torch.float32).clone()
                for part in every[1:]:
                    total += part.to(torch.float32)
                lo = sum(counts[:index])
                return total[lo : lo + counts[index]].to(t.dtype)

        return Member()
