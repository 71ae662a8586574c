"""An MoE layer's iteration cost (llm_planner.cost.moe_cost, cost.iteration) and memory, by hand."""

from __future__ import annotations

import dataclasses

import pytest
from kernel_fixtures import KIND, LINK

from llm_planner.cost.chunks import prompt_lumps
from llm_planner.cost.iteration import KAPPA, Load, layer_kernels
from llm_planner.cost.layer_pieces import layer_pieces
from llm_planner.cost.roofline import CostError, evaluate_pieces
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.serving.layer_time import KernelLayerTime

# One Mixtral-shaped MoE layer, small: h 1024, 8 experts of 4096, top-2.
MOE = DecoderConfig(
    name="moe",
    model_type="llama",
    hf_model_type="mixtral",
    num_layers=1,
    hidden_size=1024,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=4096,
    vocab_size=1000,
    max_positions=4096,
    tie_word_embeddings=False,
    num_experts=8,
    experts_per_token=2,
    moe_intermediate_size=4096,
)
H, M, E, TOP = 1024, 4096, 8, 2
EXPERT = 3 * H * M  # one expert's weights


def _kernel(kernels, name):
    return next(k for k in kernels.kernels if k.name == name)


def _experts_by_hand(tokens: int, touched: float, k: int = 1, imbalance: float = 1.0) -> float:
    rows = tokens * TOP * imbalance
    c = 2 * EXPERT / k * rows / 100e12
    m = (2 * rows * ((H + 2 * M / k) + (M / k + H)) + 2 * EXPERT / k * touched) / 1e12
    return max(c, m, KAPPA * (c + m))


@pytest.mark.parametrize(
    ("tokens", "touched"),
    [
        (1, 2.0),  # one token reads its two experts
        (8, 8 * (1 - 0.75**8)),  # 7.20 of the 8 experts
        (4096, 8.0),  # every expert, once
    ],
)
def test_the_expert_kernel_by_hand(tokens, touched):
    ks = layer_kernels(MOE, "fp16", KIND)
    experts = _kernel(ks, "experts")
    assert ks.kernel_s(experts, Load(decodes=tokens)) == pytest.approx(_experts_by_hand(tokens, touched))
    # a prompt token is a token like a decode: the same rows and experts
    assert ks.kernel_s(experts, Load(decodes=1, prompt_tokens=tokens - 1)) == pytest.approx(
        _experts_by_hand(tokens, touched)
    )


def test_one_token_is_memory_bound_and_reads_two_experts_of_eight():
    ks = layer_kernels(MOE, "fp16", KIND)
    t1 = ks.kernel_s(_kernel(ks, "experts"), Load(decodes=1))
    assert t1 == pytest.approx(2 * 2 * EXPERT / 1e12, rel=0.01)  # weights dominate: 2 experts x 25 MB
    many = ks.kernel_s(_kernel(ks, "experts"), Load(decodes=4096))
    assert many > 4 * t1  # all 8 experts and compute


def test_router_is_a_linear_layer_replicated_on_a_group():
    ks1, ks2 = layer_kernels(MOE, "fp16", KIND), layer_kernels(MOE, "fp16", KIND, 2, LINK)
    attn = 2 * H * H + 2 * H * 256  # q, o; k, v of two KV heads of 128
    x = Load(decodes=1).vector()
    # linear: attention and router; the router (h E) stays whole on each member of a group
    assert ks1.kernel_terms(_kernel(ks1, "linear"), x)[0] == pytest.approx(2 * (attn + H * E) / 100e12)
    assert ks2.kernel_terms(_kernel(ks2, "linear"), x)[0] == pytest.approx(2 * (attn / 2 + H * E) / 100e12)
    # experts split over the group by their width: half of each expert's weights and FLOPs per member
    assert ks2.kernel_s(_kernel(ks2, "experts"), Load(decodes=4096)) == pytest.approx(_experts_by_hand(4096, 8.0, k=2))
    names = [k.name for k in ks2.kernels]
    assert names.count("all_reduce") == 1 and "experts" in names


def test_imbalance_scales_the_busiest_experts_rows():
    ks = layer_kernels(MOE, "fp16", KIND, imbalance=1.5)
    got = ks.kernel_s(_kernel(ks, "experts"), Load(decodes=4096))
    assert got == pytest.approx(_experts_by_hand(4096, 8.0, imbalance=1.5))
    uniform = layer_kernels(MOE, "fp16", KIND)
    assert got > uniform.kernel_s(_kernel(uniform, "experts"), Load(decodes=4096))
    with pytest.raises(CostError, match="imbalance factor must be a number >= 1"):
        layer_kernels(MOE, "fp16", KIND, imbalance=0.5)


def test_the_pieces_hold_the_experts_at_one_token_and_lie_below_the_time():
    """At b = 1 the pieces are one sequence's kernels but the experts' reads held at one token's
    (every iteration carries at least a decode); at every b they lie below the layer's time, spread
    evenly or in the lumps an engine admits prompts in (serving.layer_time.KernelLayerTime)."""
    per_sequence = Load(decodes=1, decode_keys=600, prompt_tokens=4, prompt_keys=4 * 257)
    for k, link in ((1, None), (2, LINK)):
        ks = layer_kernels(MOE, "fp16", KIND, k, link)
        assert not ks.exact
        pieces = layer_pieces(ks, per_sequence)
        (experts,) = [kr for kr in ks.kernels if kr.experts is not None]
        held = (experts.expert_bytes(5) - experts.expert_bytes(1)) / ks.bytes_per_s  # 5 tokens' reads against 1's
        assert ks.time_s(per_sequence) - held <= evaluate_pieces(pieces, 1) <= ks.time_s(per_sequence)
        lumped = KernelLayerTime(pieces, ks, per_sequence, 257, 2048)
        chord = layer_pieces(ks, per_sequence, most=409)  # 2048 tokens of budget over 1 + 4 a sequence
        for b in (1, 2, 3, 8, 50, 400, 409):
            spread = ks.time_s(per_sequence.times(b))
            tight = evaluate_pieces(chord, b)
            assert evaluate_pieces(pieces, b) <= tight * (1 + 1e-12) and tight <= min(lumped(b), spread) * (1 + 1e-12)
        assert evaluate_pieces(chord, 50) > evaluate_pieces(pieces, 50)  # the chord's slope: tighter


def test_a_prompt_chunk_reads_the_experts_once_not_every_iteration():
    """Prompts of 2,000 tokens, 8 per output token: spread over every iteration the 4 sequences'
    32 prompt tokens would reach most experts each time; in the engine's whole chunks most
    iterations carry the 4 decodes alone and one in 62 a chunk, so the layer costs less."""
    per_sequence = Load(decodes=1, decode_keys=600, prompt_tokens=8, prompt_keys=8 * 1000)
    ks = layer_kernels(MOE, "fp16", KIND)
    lumped = KernelLayerTime(layer_pieces(ks, per_sequence), ks, per_sequence, 2000, 2048)
    decodes = ks.time_s(Load(decodes=4, decode_keys=4 * 600))
    assert decodes < lumped(4) < ks.time_s(per_sequence.times(4))


def test_a_dense_layer_has_no_expert_kernel_and_exact_pieces():
    ks = layer_kernels(preset_config("llama3-8b"), "fp16", KIND, 2, LINK)
    assert ks.exact and [k.name for k in ks.kernels] == [
        "linear",
        "attn_decode",
        "attn_prefill",
        "elementwise",
        "all_reduce",
    ]


def test_a_group_must_split_the_experts_width():
    odd = dataclasses.replace(MOE, intermediate_size=4100, moe_intermediate_size=4100)
    layer_kernels(odd, "fp16", KIND, 2, LINK)
    with pytest.raises(CostError, match="tensor-parallel group of 8"):
        layer_kernels(odd, "fp16", KIND, 8, LINK)


def test_data_parallel_ranks_admit_their_own_smaller_chunks():
    """Over 8 ranks each admits chunks of its own room, (2048 - 4) / 8 tokens, not one scheduler's
    2,000-token chunks: the iterations' law is the lumps of that chunk (cost.chunks), by hand."""
    per_sequence = Load(decodes=1, decode_keys=600, prompt_tokens=8, prompt_keys=8 * 1000)
    ks = layer_kernels(MOE, "fp16", KIND)
    pieces = layer_pieces(ks, per_sequence)
    one, eight = (KernelLayerTime(pieces, ks, per_sequence, 2000, 2048, ranks=r) for r in (1, 8))
    decode = Load(decodes=4, decode_keys=4 * 600)
    by_hand = sum(
        w * ks.time_s(decode.plus(Load(prompt_tokens=x, prompt_keys=x * 1000)))
        for w, x in prompt_lumps(32, (2048 - 4) / 8, 2048 - 4)
    )
    assert eight(4) == pytest.approx(by_hand) and eight(4) != pytest.approx(one(4))
