"""The tensor-parallel layout declared once (llm_planner.graph.tp_layout): it lists every tensor of
each task, and the cost model's per-member weights, tables and collectives are the declaration's.
(The runtime's side, that members hold and send what it declares: tests/test_tp_layers.py.)"""

from __future__ import annotations

import math

import pytest

from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.spec import LinkSpec
from llm_planner.cost import roofline as cost
from llm_planner.graph import tp_layout
from llm_planner.graph.decoder_graph import build_decoder_graph
from llm_planner.graph.decoder_presets import preset_config, preset_descriptions
from llm_planner.graph.tp_layout import TPWeight, even_range, task_layout
from llm_planner.graph.transformer import part_parameters

PRESETS = [name for name, _ in preset_descriptions()]
# GPT-2 (fused biases, learned positions), GQA llama, OPT with a narrow embedding (project_in/out)
FAMILIES = ["gpt2", "llama3-8b", "llama2-70b", "opt-350m", "opt-125m"]
LINK = LinkSpec(bw_bytes_per_s=300e9, latency_s=2e-6)


@pytest.mark.parametrize("name", PRESETS)
def test_the_layouts_declare_every_parameter_once(name):
    cfg = preset_config(name)
    params = part_parameters(cfg)
    for kind in ("embed", "attn", "mlp", "final_norm", "lm_head"):
        assert task_layout(cfg, kind).elements() == params[kind], kind
    block = task_layout(cfg, "block")
    assert block.elements() == params["attn"] + params["mlp"]
    assert block.divides == task_layout(cfg, "attn").divides + task_layout(cfg, "mlp").divides


def _member_mean(layout, k: int, *, indexed: bool | None = None) -> float:
    """Elements a member holds, averaged over the k members (the cost model's share of an uneven split)."""
    weights = [w for w in layout.weights if indexed is None or w.indexed == indexed]
    return sum(math.prod(w.member_shape(k, i)) for w in weights for i in range(k)) / k


def _ring_pieces(layout, k: int, positions: int, dtype_bytes: int) -> tuple[float, float]:
    """The declared collectives' ring time (fixed, per sample) over LINK, computed here on its own."""
    fixed = per_sample = 0.0
    for c in layout.collectives:
        n = c.bytes_per_position(dtype_bytes) * positions
        steps = 2 * (k - 1) if c.op == "all_reduce" else k - 1
        fixed += steps * LINK.latency_s
        per_sample += (2 * (k - 1) / k * n if c.op == "all_reduce" else (k - 1) * n) / LINK.bw_bytes_per_s
    return fixed, per_sample


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("phase, granularity", [("decode", "block"), ("prefill", "sublayer")])
def test_a_members_costs_are_the_declared_shares(name, phase, granularity):
    """cost.shard_of (what a group's roofline reads) holds the declared member shapes' weights and tables,
    and cost.collective_pieces charges the declared collectives, for every task and degree it shards over."""
    cfg, dtype = preset_config(name), "fp16"
    b, tokens = DTYPE_BYTES[dtype], 1 if phase == "decode" else 64
    graph = build_decoder_graph(cfg, phase=phase, seq_len=64, granularity=granularity, dtype=dtype)
    checked = 0
    for task in graph.tasks:
        layout = task_layout(cfg, dict(task.labels)["role"])
        assert task.tp_divides == layout.divides
        for k in (2, 4, 8):
            assert task.shards_over(k) == (not layout.cannot_split(k))
            if not task.shards_over(k):
                continue
            member = cost.shard_of(task, k)
            assert member.weight_bytes == pytest.approx(_member_mean(layout, k) * b, rel=1e-12)
            assert member.weight_bytes_indexed == pytest.approx(_member_mean(layout, k, indexed=True) * b, rel=1e-12)
            positions = 1 if layout.last_position_only else tokens
            assert cost.collective_pieces(task, k, LINK) == pytest.approx(_ring_pieces(layout, k, positions, b))
            checked += 1
    assert checked >= len(graph.tasks)  # every task on at least one degree


def test_the_cost_fields_follow_a_changed_declaration(monkeypatch):
    """Declaring the attention's output projection replicated (not row-parallel, no all-reduce) changes what
    a member of a group holds and sends by exactly that, in the graph the planner builds."""
    cfg, k = preset_config("gpt2"), 4
    before = build_decoder_graph(cfg, phase="decode", seq_len=64, granularity="block", dtype="fp16").tasks[1]
    declared = tp_layout.attn_layout

    def replicated_o(c):
        layout = declared(c)
        weights = tuple(
            TPWeight(name=w.name, shape=w.shape, split="replicated") if w.name == "o" else w for w in layout.weights
        )
        return tp_layout.TaskLayout(
            kind="attn", weights=weights, units=layout.units, replicated_traffic=layout.replicated_traffic
        )

    monkeypatch.setattr(tp_layout, "attn_layout", replicated_o)
    after = build_decoder_graph(cfg, phase="decode", seq_len=64, granularity="block", dtype="fp16").tasks[1]
    o = cfg.hidden_size * cfg.hidden_size * 2  # fp16 bytes of the output projection
    grown = cost.shard_of(after, k).weight_bytes - cost.shard_of(before, k).weight_bytes
    assert grown == pytest.approx(o * (k - 1) / k)
    assert cost.shard_of(after, k).weight_bytes == pytest.approx(_member_mean(task_layout(cfg, "block"), k) * 2)
    assert (before.tp_allreduces, after.tp_allreduces) == (2, 1)
    assert after.tp_allreduce_bytes_per_sample == before.tp_allreduce_bytes_per_sample / 2


@pytest.mark.parametrize("total, k", [(50257, 2), (50257, 8), (127, 4), (12, 4), (3, 4)])
def test_member_ranges_cover_a_split_dimension_once_in_order(total, k):
    ranges = [even_range(total, k, i) for i in range(k)]
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1


def test_split_dimensions_and_collectives_of_a_gqa_block():
    """llama2-70b: q by its 64 heads, k and v by the 8 KV heads (columns), o by rows; one all-reduce after o
    and one after down, each of the hidden state."""
    cfg = preset_config("llama2-70b")
    block = task_layout(cfg, "block")
    shapes = {w.name: (w.split, w.member_shape(8, 3)) for w in block.weights}
    assert shapes["q"] == ("column", (8 * 128, 8192))
    assert shapes["k"] == shapes["v"] == ("column", (128, 8192))
    assert shapes["o"] == ("row", (8192, 8 * 128))
    assert shapes["gate"] == shapes["up"] == ("column", (28672 // 8, 8192))
    assert shapes["down"] == ("row", (8192, 28672 // 8))
    assert shapes["attn_norm.weight"] == ("replicated", (8192,))
    assert [(c.op, c.after, c.width) for c in block.collectives] == [
        ("all_reduce", "o", 8192),
        ("all_reduce", "down", 8192),
    ]
    assert block.cannot_split(16) == ["KV heads 8"]
