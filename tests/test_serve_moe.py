"""Mixture-of-experts layers of the serving runtime in one process, against transformers' own
classes (MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM) on the same weights: one
layer's MLP on a single device and on a tensor-parallel pair (threads), each member a slice of
every expert; the tensors each member reads; what the runtime refuses. The requests' tokens of
whole stages: tests/test_serve_stage.py; under mpiexec: tests/test_serve_mpi.py."""

from __future__ import annotations

import pytest
import torch
from runtime_fixtures import ThreadGroup, tiny_mixtral, tiny_qwen2_moe, tiny_qwen3_moe
from safetensors import safe_open

from llm_planner.graph import hf_config
from llm_planner.graph.tp_layout import task_layout
from llm_planner.runtime import ep_moe, gpt, moe_layers, tp_layers
from llm_planner.runtime.decoder_tasks import DecoderError

MAKERS = [tiny_mixtral, tiny_qwen2_moe, tiny_qwen3_moe]
IDS = ["mixtral", "qwen2_moe", "qwen3_moe"]
LAYER = 1


def _seeded(hf):
    return gpt.weight_source(hf, checkpoint=None, seed=0)


def _members(hf, k: int, x: torch.Tensor, checkpoint: str | None = None):
    """Each member of a group of k runs block LAYER's MLP on x: (outputs, the group, the sources read)."""
    cfg, family = hf_config.from_hf_config(hf), gpt.family_of(hf)
    group, out, sources = ThreadGroup(k), [None] * k, [None] * k

    def member(i: int) -> None:
        sources[i] = gpt.weight_source(hf, checkpoint=checkpoint, seed=0)
        t = tp_layers.member_tensors(f"block.{LAYER}", cfg, family, k, i, sources[i], dtype=torch.float32, device="cpu")
        block = tp_layers.BlockShard(cfg, LAYER, t, group.member(i), renormalise=moe_layers.renormalises(hf))
        with torch.no_grad():
            out[i] = block.mlp(x.clone())

    group.run(member)
    return out, group, sources


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
@pytest.mark.parametrize("k", [1, 2])
def test_an_moe_mlp_equals_transformers_layer(make, k):
    """Router, top-k, experts (and qwen2_moe's gated shared expert) of one layer, whole or split over two
    members with one all-reduce each: the output of transformers' own sparse MoE block on the same tokens."""
    hf = gpt.prepare_config(make())
    whole = gpt.build_whole_model(hf, _seeded(hf))
    layer = whole.model.layers[LAYER]
    x = torch.randn(9, hf.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        normed = layer.post_attention_layernorm(x)
        expected = layer.mlp(normed[None])[0]
        chosen = layer.mlp.gate(normed)[2]
    assert len(chosen.unique()) == hf_config.from_hf_config(hf).num_experts  # every expert has rows
    out, group, _ = _members(hf, k, x)
    for i in range(k):
        assert torch.allclose(out[i], expected, atol=1e-5, rtol=1e-4), (i, (out[i] - expected).abs().max())
        assert group.counts[i] == {"all_reduce": 1, "all_gather": 0, "reduce_scatter": 0}


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
def test_members_read_their_slice_of_every_expert_from_a_checkpoint(make, tmp_path):
    """The whole model saved by transformers (one tensor per expert, as published checkpoints hold them): each
    member of a pair reads only checkpoint tensors, the declared member shapes, and computes the layer."""
    hf = gpt.prepare_config(make())
    whole = gpt.build_whole_model(hf, _seeded(hf))
    whole.save_pretrained(tmp_path)
    cfg = hf_config.from_hf_config(hf)
    x = torch.randn(5, hf.hidden_size, generator=torch.Generator().manual_seed(4))
    out, _, sources = _members(hf, 2, x, checkpoint=str(tmp_path))
    layout = task_layout(cfg, "block")
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        saved = set(f.keys())
    for source in sources:
        assert len(source.tensors_read) == len(layout.weights) and set(source.tensors_read) <= saved
        assert sum(".experts." in n for n in source.tensors_read) == 3 * cfg.num_experts
    for i in range(2):
        held = tp_layers.member_tensors(
            f"block.{LAYER}", cfg, gpt.family_of(hf), 2, i, _seeded(hf), dtype=torch.float32, device="cpu"
        )
        assert {n: tuple(t.shape) for n, t in held.items()} == {w.name: w.member_shape(2, i) for w in layout.weights}
    layer = whole.model.layers[LAYER]
    with torch.no_grad():
        expected = layer.mlp(layer.post_attention_layernorm(x[None]))[0]
    assert torch.allclose(out[0], expected, atol=1e-5, rtol=1e-4)


def test_routing_follows_the_model_type():
    """Mixtral always renormalises its top-k weights; the Qwen types only with norm_topk_prob."""
    assert moe_layers.renormalises(tiny_mixtral())
    assert not moe_layers.renormalises(tiny_qwen2_moe())
    assert moe_layers.renormalises(tiny_qwen3_moe())
    assert moe_layers.renormalises(tiny_qwen2_moe(norm_topk_prob=True))


def test_the_placement_runtime_refuses_moe_blocks():
    hf = gpt.prepare_config(tiny_mixtral())
    with pytest.raises(DecoderError, match="'mixtral': its MoE blocks run in serving plans only"):
        gpt.DecoderShard(hf, {"block.0"}, device=torch.device("cpu"), dtype=torch.float32, source=_seeded(hf))


def _ep_members(hf, rows: list[torch.Tensor]):
    """Member i of a group of len(rows) with data-parallel attention runs block LAYER's MLP on its own rows[i]."""
    cfg, family, k = hf_config.from_hf_config(hf), gpt.family_of(hf), len(rows)
    group, out, held = ThreadGroup(k), [None] * k, [None] * k

    def member(i: int) -> None:
        keep = ep_moe.holds(cfg, k, i)
        t = tp_layers.member_tensors(
            f"block.{LAYER}", cfg, family, 1, 0, _seeded(hf), dtype=torch.float32, device="cpu", keep=keep
        )
        held[i] = t
        ops, renormalise = tp_layers.Unconnected(1), moe_layers.renormalises(hf)
        block = tp_layers.BlockShard(cfg, LAYER, t, ops, renormalise=renormalise, expert_ops=group.member(i))
        with torch.no_grad():
            out[i] = block.mlp(rows[i].clone())

    group.run(member)
    return out, group, held


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
@pytest.mark.parametrize("counts", [(6, 3), (5, 0), (0, 4)])
def test_experts_split_over_a_data_parallel_pair_equal_transformers_layer(make, counts):
    """Each member of a pair runs its own tokens (some members none): the tokens gathered, each member's
    two of the four experts whole on all of them, the sums scattered back: every member's output is
    transformers' sparse MoE block's on its own tokens, with one gather of the counts, one of the tokens
    and one reduce-scatter per layer, and no all-reduce."""
    hf = gpt.prepare_config(make())
    whole = gpt.build_whole_model(hf, _seeded(hf))
    layer = whole.model.layers[LAYER]
    x = torch.randn(sum(counts), hf.hidden_size, generator=torch.Generator().manual_seed(5))
    rows = list(x.split(list(counts)))
    out, group, held = _ep_members(hf, rows)
    for i in range(2):
        with torch.no_grad():
            expected = layer.mlp(layer.post_attention_layernorm(rows[i])[None])[0] if counts[i] else rows[i]
        assert out[i].shape == rows[i].shape
        assert torch.allclose(out[i], expected, atol=1e-5, rtol=1e-4), (i, (out[i] - expected).abs().max())
        assert group.counts[i] == {"all_reduce": 0, "all_gather": 2, "reduce_scatter": 1}
        experts = {int(n.split(".")[1]) for n in held[i] if n.startswith("experts.")}
        assert experts == {2 * i, 2 * i + 1}  # two whole experts of four
    cfg = hf_config.from_hf_config(hf)
    every = tp_layers.member_tensors(
        f"block.{LAYER}", cfg, gpt.family_of(hf), 1, 0, _seeded(hf), dtype=torch.float32, device="cpu"
    )
    for i in range(2):
        assert all(torch.equal(t, every[n]) for n, t in held[i].items())  # whole tensors, as the model's


def test_experts_that_do_not_split_over_the_group_are_refused():
    cfg = hf_config.from_hf_config(gpt.prepare_config(tiny_mixtral()))
    with pytest.raises(DecoderError, match="its 4 experts do not split over a group of 3"):
        ep_moe.expert_range(cfg, 3, 0)
