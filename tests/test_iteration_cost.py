"""The serving iteration's cost as the sum of its kernels (llm_planner.cost.iteration), by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_fixtures import KIND, LINK

from llm_planner.cost.iteration import KAPPA, Load, layer_kernels
from llm_planner.cost.layer_pieces import envelope_of_sum, layer_pieces
from llm_planner.cost.roofline import evaluate_pieces
from llm_planner.graph.decoder_presets import preset_config

CFG = preset_config("llama3-8b")  # h 4096, 32 heads of 128, 8 KV heads, MLP 14336, gated


def _kernel(kernels, name):
    return next(k for k in kernels.kernels if k.name == name)


def test_linear_kernel_by_hand():
    ks = layer_kernels(CFG, "fp16", KIND)
    params = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 4096 * 14336 * 3  # q, o, k, v and gate, up, down
    io = (4096 + 6144) + (4096 + 4096) + (4096 + 2 * 14336) + (14336 + 4096)  # in and out of each projection
    lin = _kernel(ks, "linear")
    load = Load(decodes=8)
    c, m = 2 * params * 8 / 100e12, (2 * params + 2 * io * 8) / 1e12
    assert ks.kernel_terms(lin, load.vector()) == pytest.approx((c, m))
    assert ks.kernel_s(lin, load) == pytest.approx(max(c, m, KAPPA * (c + m)))
    big = Load(decodes=8, prompt_tokens=4000)  # compute-bound: the corner's term fades
    c2, m2 = ks.kernel_terms(lin, big.vector())
    assert c2 > m2 and ks.kernel_s(lin, big) == pytest.approx(max(c2, KAPPA * (c2 + m2)))


def test_attention_kernels_by_hand():
    ks = layer_kernels(CFG, "fp16", KIND)
    dec = _kernel(ks, "attn_decode")
    # 4 sequences reading 1000 keys each: 2 * 1024 * 2 bytes per key, 4 * 4096 FLOPs per key
    load = Load(decodes=4, decode_keys=4000)
    c, m = 4 * 4096 * 4000 / 100e12, (4000 * 2 * 1024 * 2 + 4 * (2 * 4096 + 2 * 1024) * 2) / 1e12
    assert ks.kernel_terms(dec, load.vector()) == pytest.approx((c, m))
    pre = _kernel(ks, "attn_prefill")
    # one prompt of 512 tokens in one chunk: 512 * 513 / 2 keys seen
    load = Load(prompt_tokens=512, prompt_keys=512 * 513 / 2)
    c, m = 4 * 4096 * 512 * 513 / 2 / 100e12, 512 * (2 * 4096 + 4 * 1024) * 2 / 1e12
    assert ks.kernel_terms(pre, load.vector()) == pytest.approx((c, m))


def test_all_reduces_pay_a_call_overhead_each():
    ks = layer_kernels(CFG, "fp16", KIND, 4, LINK)
    ar = _kernel(ks, "all_reduce")
    load = Load(decodes=16)
    fixed = 2 * (20e-6 + 2 * 3 * 1e-6)
    size = 2 * 2 * 3 / 4 * 4096 * 2 * 16 / (100e9 * 0.5)  # at the kind's collective efficiency
    assert ks.kernel_s(ar, load) == pytest.approx(fixed + size)
    assert all(k.name != "all_reduce" for k in layer_kernels(CFG, "fp16", KIND).kernels)


def test_layer_time_is_the_kernels_sum_and_a_mixed_iteration_reads_the_weights_once():
    ks = layer_kernels(CFG, "fp16", KIND, 2, LINK)
    decode, prompt = Load(decodes=16, decode_keys=16 * 700), Load(prompt_tokens=32, prompt_keys=32 * 300)
    both = decode.plus(prompt)
    assert ks.time_s(both) == pytest.approx(sum(ks.kernel_s(k, both) for k in ks.kernels) + ks.overhead_s)
    weights = _kernel(ks, "linear").bytes[0] / ks.bytes_per_s
    assert ks.time_s(decode) + ks.time_s(prompt) - ks.time_s(both) >= 0.9 * weights  # not streamed twice
    assert ks.time_s(Load()) == 0.0


@settings(max_examples=40, deadline=None)
@given(
    k=st.sampled_from([1, 2, 4, 8]),
    ratio=st.floats(0.0, 20.0),
    context=st.floats(1.0, 8000.0),
    b=st.floats(0.0, 4096.0),
    floor=st.sampled_from([0.0, 8e-9, 2e-7]),
)
def test_pieces_are_the_exact_layer_time_at_every_batch(k, ratio, context, b, floor):
    kind = dataclasses.replace(KIND, decode_key_s=floor)  # with decode attention's floor per key or not
    ks = layer_kernels(CFG, "fp16", kind, k, LINK if k > 1 else None)
    per_seq = Load(decodes=1, decode_keys=context, prompt_tokens=ratio, prompt_keys=ratio * 200)
    pieces = layer_pieces(ks, per_seq)
    expected = ks.time_s(per_seq.times(b))
    got = max(f + s * b for f, s in pieces) if b > 0 else 0.0
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert all(f >= 0 and s >= 0 for f, s in pieces)


def test_decode_attention_takes_at_least_a_sequences_keys_times_the_kinds_time_per_key():
    """decode_key_s: one sequence of 7,000 keys takes at least 7,000 times it however few bytes that
    is; many sequences' bytes outrun the floor, which stays a sequence's keys (the mean's)."""
    kind = dataclasses.replace(KIND, decode_key_s=8e-9)
    ks, plain = layer_kernels(CFG, "fp16", kind), layer_kernels(CFG, "fp16", KIND)
    dec = _kernel(ks, "attn_decode")
    one = Load(decodes=1, decode_keys=7000)
    assert ks.kernel_s(dec, one) == pytest.approx(7000 * 8e-9)  # 56 us where the bytes take 28.7 us
    c, m = plain.kernel_terms(dec, one.vector())
    assert plain.kernel_s(dec, one) == pytest.approx(max(c, m, KAPPA * (c + m)))
    assert plain.kernel_s(dec, one) < 7000 * 8e-9
    many = Load(decodes=64, decode_keys=64 * 7000)
    assert ks.kernel_s(dec, many) == plain.kernel_s(dec, many) > 7000 * 8e-9
    assert ks.time_s(one) - plain.time_s(one) == pytest.approx(7000 * 8e-9 - plain.kernel_s(dec, one))
    assert ks.kernel_s(dec, Load(prompt_tokens=100, prompt_keys=5000)) == 0.0  # no decodes, no floor


def test_envelope_of_a_sum_by_hand():
    # max(1, b) + max(2 - b, 0.5 b): breakpoints at 1 and 4/3
    pieces = envelope_of_sum([((1.0, 0.0), (0.0, 1.0)), ((2.0, -1.0), (0.0, 0.5))])
    assert len(pieces) == 3
    for b in (0.25, 0.5, 1.0, 1.2, 4 / 3, 2.0, 10.0):
        assert evaluate_pieces(pieces, b) == pytest.approx(max(1, b) + max(2 - b, 0.5 * b))


def test_a_dtype_the_kind_lacks_and_an_unsplittable_group_are_refused():
    from llm_planner.cost.roofline import CostError

    with pytest.raises(CostError, match="no peak_flops for dtype 'fp8'"):
        layer_kernels(CFG, "fp8", KIND)
    with pytest.raises(CostError, match="tensor-parallel group of 3"):
        layer_kernels(CFG, "fp16", KIND, 3, LINK)
    assert math.isfinite(layer_kernels(CFG, "fp16", KIND, 8, LINK).time_s(Load(decodes=1)))
