"""The profiler times a decoder step through the very calls the run makes (llm_planner.runtime.gpt_run.run_step
on a gpt_run.new_state stream), with the same arguments: the same tasks, input, step, modules, KV cache shapes
and collectives, for a tensor-parallel member's share as for a single device. In one process, no MPI: both sides
get the same stand-in group (identity collectives that count their calls); the run is rank 0 of a plan that puts
every task on a group of two."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runtime_fixtures import decoder_plan, save_config, tiny_gpt2, tiny_llama

from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.launch.launch_types import LaunchOptions
from llm_planner.launch.plan_launch import build_rank_table
from llm_planner.runtime import gpt_run, profile_rank
from llm_planner.runtime.rank import RankContext
from llm_planner.runtime.run_report import RankStats
from llm_planner.runtime.tp_layers import Unconnected

SEQ_LEN = 16  # the profiled context: the run's first decode step after a prompt of SEQ_LEN - 1 tokens
G01 = "localhost/cpu-core:0-1"
RUN_STEP = gpt_run.run_step


class CountingGroup(Unconnected):
    """Member 0 of a group of two whose collectives do nothing but are counted (kind, bytes)."""

    def __init__(self, size: int = 2):
        super().__init__(size)
        self.calls: list[tuple[str, int]] = []

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        self.calls.append(("all_reduce", t.numel() * t.element_size()))
        return super().all_reduce_(t)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        self.calls.append(("all_gather", t.numel() * t.element_size()))
        return super().all_gather(t)


class LocalComm:
    """Rank 0 of a world of two, in one process: sends are dropped (rank 0 leads every stage here)."""

    rank, size = 0, 2

    def __init__(self):
        from llm_planner.runtime.comm import CommStats

        self.stats = CommStats()

    def check_tag(self, tag: int, what: str) -> int:
        return tag

    def isend(self, t: torch.Tensor, dest: int, tag: int) -> None:
        pass

    def wait_sends(self) -> None:
        pass

    def barrier(self) -> None:
        pass


def _cache(state) -> tuple:
    """(layer, keys' shape, values' shape, both contiguous) of the stream's KV cache, as the step finds it."""
    if state.shard_cache:
        items = sorted(state.shard_cache.items())
    else:
        items = [(i, (layer.keys, layer.values)) for i, layer in enumerate(state.cache.layers) if layer.is_initialized]
    return tuple((i, tuple(k.shape), tuple(v.shape), k.is_contiguous() and v.is_contiguous()) for i, (k, v) in items)


def _record(monkeypatch) -> list[dict]:
    """Every gpt_run.run_step call, with what determines its work, and the collectives it made."""
    calls: list[dict] = []

    def spy(shard, tasks, value, state, step, on_task=None):
        group = shard.group
        before = len(group.calls) if group is not None else 0
        entry = {
            "tasks": tuple(tasks),
            "value": (tuple(value.shape), value.dtype),
            "step": step,
            "timed": on_task is not None,
            "cache": _cache(state),
            "mask": state.attention_mask(step) is None,
            "modules": {t: type(m).__name__ for t, m in {**shard.modules, **shard.parts}.items()},
            "group": None if group is None else (type(group).__name__, group.size, group.index),
        }
        out = RUN_STEP(shard, tasks, value, state, step, on_task=on_task)
        entry["collectives"] = tuple(group.calls[before:]) if group is not None else ()
        calls.append(entry)
        return out

    monkeypatch.setattr(gpt_run, "run_step", spy)
    return calls


def _profile_calls(model_dir: Path, group, monkeypatch) -> list[dict]:
    spec = ModelSpec(name=str(model_dir), dtype="fp32", seq_len=SEQ_LEN, phase="decode")
    options = profile_rank.ProfileOptions(batch_sizes=(1, 2), repetitions=1, warmup=1)
    calls = _record(monkeypatch)
    degree = 1 if group is None else group.size
    profile_rank.time_decoder(
        spec, build_model_graph(spec), torch.device("cpu"), torch.float32, options, lambda w, n: None, degree, group
    )
    return calls


def _run_calls(model_dir: Path, group, tmp_path: Path, monkeypatch) -> list[dict]:
    """Rank 0 of the plan's run, generating 2 tokens (the prefill, then the first decode step)."""
    layout = {"embed": G01} if group is not None else {"embed": 0}
    plan_path = decoder_plan(tmp_path / "plan.yaml", model_dir, [layout], max_tp=2)
    prompt = tuple(range(3, 3 + SEQ_LEN - 1))
    options = LaunchOptions(prompt_ids=(prompt,), max_new_tokens=2, workdir=str(tmp_path / "w"))
    table, plan = build_rank_table(plan_path, options)
    entry = table.ranks[0]
    ctx = RankContext(
        table=table,
        entry=entry,
        plan=plan,
        comm=LocalComm(),
        device=torch.device("cpu"),
        dtype=torch.float32,
        stats=RankStats(rank=0, device=entry.device, torch_device="cpu"),
        group=group,
    )
    calls = _record(monkeypatch)
    with torch.no_grad():
        gpt_run.DecoderRun(ctx).run()
    return calls


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_llama])
@pytest.mark.parametrize("grouped", [True, False], ids=["tp-group", "single-device"])
def test_profiled_step_is_the_runs_first_decode_step(make, grouped, tmp_path, monkeypatch):
    model_dir = save_config(make(), tmp_path / "model")
    profiled = _profile_calls(model_dir, CountingGroup() if grouped else None, monkeypatch)
    run = _run_calls(model_dir, CountingGroup() if grouped else None, tmp_path, monkeypatch)
    assert [c["step"] for c in run] == [0, 1]  # the prompt's prefill, then one decode step
    # per batch size (1, then 2): an untimed prefill and a timed step, for the warm-up run and the timed one
    assert [(c["value"][0][0], c["step"], c["timed"]) for c in profiled] == [
        (b, step, step == 1) for b in (1, 2) for _ in range(2) for step in (0, 1)
    ]
    batch_one = profiled[:4]
    prefill, step = batch_one[-2], batch_one[-1]
    assert step == {**run[1], "timed": True}  # the step the profile times is the run's decode step, call for call
    assert {**prefill, "timed": False} == {**run[0], "timed": False}  # and the cache came from the same prefill
    assert step["cache"] and all(len(c[1]) == 4 and c[1][2] == SEQ_LEN - 1 for c in step["cache"])
    if grouped:  # a member's share: its part of the heads, and the block's two all-reduces per layer
        heads = make().num_attention_heads if make is tiny_gpt2 else make().num_key_value_heads
        assert all(c[1][1] == heads // 2 for c in step["cache"])
        assert {m for t, m in step["modules"].items() if t.startswith("block.")} == {"BlockShard"}
        kinds = [kind for kind, _ in step["collectives"]]
        assert kinds.count("all_reduce") == 1 + 2 * make().num_hidden_layers and kinds.count("all_gather") == 1
