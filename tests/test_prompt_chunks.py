"""Prompt tokens in the lumps an engine admits them, and the wait for the prompts ahead
(llm_planner.cost.chunks), by hand and as the serving model uses them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_fixtures import KIND

from llm_planner.cost.chunks import pieces_below, prefill_batch_tokens, prompt_lumps, prompt_wait_s
from llm_planner.cost.iteration import Load, layer_kernels
from llm_planner.cost.layer_pieces import layer_pieces
from llm_planner.cost.roofline import evaluate_pieces
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.serving.layer_time import RooflineLayerTime

CFG = preset_config("llama3-8b")


def test_lumps_by_hand():
    # 64 sequences, 512-token prompts, 128 output tokens: 256 prompt tokens per iteration on
    # average, so half the iterations carry a whole prompt and half none
    assert prompt_lumps(256.0, 512, 2048 - 64) == ((0.5, 0.0), (0.5, 512.0))
    # 1.5 prompts per iteration: one or two whole prompts
    assert prompt_lumps(768.0, 512, 1984) == ((0.5, 512.0), (0.5, 1024.0))
    # a 5000-token prompt goes in chunks of the room, 2000 tokens
    assert prompt_lumps(500.0, 5000, 2000) == ((0.75, 0.0), (0.25, 2000.0))
    # the upper lump is cut at the room, the weights keep the mean
    ((w0, x0), (w1, x1)) = prompt_lumps(1900.0, 512, 2000)
    assert (x0, x1) == (1536.0, 2000.0) and w0 * x0 + w1 * x1 == pytest.approx(1900.0)
    # past the room (no plan runs there) every iteration carries the whole share, as if the budget
    # held it: the price of keeping the sequences in flight, never below the spread load; no prompt: no lump
    assert prompt_lumps(3000.0, 512, 2000) == ((1.0, 3000.0),)
    assert prompt_lumps(0.0, 512, 2000) == ((1.0, 0.0),)
    assert prompt_lumps(1024.0, 512, 2000) == ((1.0, 1024.0),)  # exactly two prompts


@settings(max_examples=200, deadline=None)
@given(mean=st.floats(0.0, 4000.0), prompt=st.integers(1, 8000), room=st.floats(1.0, 4000.0))
def test_lumps_keep_the_mean_within_the_room(mean, prompt, room):
    lumps = prompt_lumps(mean, prompt, room)
    assert sum(w for w, _ in lumps) == pytest.approx(1.0)
    assert all(0 <= w <= 1 and 0 <= x <= max(room, 1.0, mean) for w, x in lumps)
    assert all(x <= max(room, 1.0) for _, x in lumps) or lumps == ((1.0, mean),)  # past the room: the share whole
    assert sum(w * x for w, x in lumps) == pytest.approx(mean, rel=1e-9, abs=1e-9)


def _layer_time(ratio: float, prompt: int, budget: int) -> tuple[RooflineLayerTime, object, Load]:
    ks = layer_kernels(CFG, "fp16", KIND)
    per_seq = Load(decodes=1, decode_keys=600.0, prompt_tokens=ratio, prompt_keys=ratio * (prompt + 1) / 2)
    return RooflineLayerTime(layer_pieces(ks, per_seq), ks, per_seq, prompt, budget), ks, per_seq


def test_an_iteration_carries_a_whole_prompt_or_none_by_hand():
    t, ks, per_seq = _layer_time(ratio=4.0, prompt=512, budget=2048)  # 512 in, 128 out
    b = 64
    decode = Load(decodes=b, decode_keys=b * 600.0)
    chunk = decode.plus(Load(prompt_tokens=512, prompt_keys=512 * 513 / 2))
    assert t(b) == pytest.approx(0.5 * ks.time_s(decode) + 0.5 * ks.time_s(chunk), rel=1e-12)
    # slower than the same prompt tokens spread thin over every iteration (the pieces), which
    # the bounds read: the kernels are convex in the prompt tokens
    assert evaluate_pieces(layer_pieces(ks, per_seq), b) < t(b)
    assert t.lower(b) <= t(b) * (1 + 1e-12) and t.least(b, 10 * b) == t.lower(b)


@settings(max_examples=100, deadline=None)
@given(ratio=st.floats(0.0, 20.0), prompt=st.integers(1, 6000), b=st.integers(1, 1024))
def test_the_pieces_stay_below_the_lumped_time(ratio, prompt, b):
    budget = 2048
    if b * (1 + ratio) > budget:  # past the budget the engine cannot keep b in flight
        return
    t, _, _ = _layer_time(ratio, prompt, budget)
    assert evaluate_pieces(t.pieces, b) <= t(b) * (1 + 1e-9)
    assert t(b) <= t(b + 1) * (1 + 1e-9) or (b + 1) * (1 + ratio) > budget


def test_the_wait_for_the_prompts_ahead_by_hand():
    assert prompt_wait_s(0, 0.4, 10.0) == 0.0  # alone: no one ahead
    # 24 others starting a request every 15 s, each prompt holding the engine 0.375 s: rho 0.6,
    # W = rho S / (2 (1 - rho)) = 0.6 * 0.375 / 0.8
    assert prompt_wait_s(24, 0.375, 15.0) == pytest.approx(0.28125)
    # at or past saturation: every other one's prompt ahead
    assert prompt_wait_s(4, 1.0, 2.0) == 4.0
    assert prompt_wait_s(3, 0.5, 1.55) == pytest.approx(1.5)  # rho 0.97: cut at 3 x 0.5


def test_hull_lines_by_hand():
    # a bumpy increasing function: the lower hull runs (1, 1) -> (3, 3) -> (4, 6), skipping (2, 3)
    # above the chord; its second line, 3 x - 6, has a negative intercept and is left out
    xs, ys = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 3.0, 6.0]
    assert pieces_below(xs, ys) == ((0.0, 1.0),)
    # a convex one: every segment of the hull is a line, all below the points
    xs, ys = [1.0, 2.0, 3.0, 4.0], [2.0, 2.5, 3.5, 5.0]
    lines = pieces_below(xs, ys)
    assert lines == ((1.5, 0.5), (0.5, 1.0))  # the third, 1.5 x - 1, is left out
    assert all(max(f + s * x for f, s in lines) <= y + 1e-12 for x, y in zip(xs, ys))


def test_the_bounds_pieces_are_tighter_than_the_spread_and_below_the_time():
    t, ks, per_seq = _layer_time(ratio=4.0, prompt=512, budget=2048)
    spread = layer_pieces(ks, per_seq)
    top = 2048 // 5
    assert all(evaluate_pieces(t.pieces, b) <= t(b) * (1 + 1e-12) for b in range(1, top + 1))
    assert evaluate_pieces(t.pieces, 64) > evaluate_pieces(spread, 64)  # the chunks' cost is seen by the bounds


def test_whole_prompts_in_iterations_of_their_own_by_hand():
    # under one 512-token prompt per decode iteration: one prompt per prefill iteration
    assert prefill_batch_tokens(256.0, 512, 2048) == 512
    # 2.5 prompts arrive per decode iteration: two go together; the budget holds four
    assert prefill_batch_tokens(1280.0, 512, 2048) == 1024
    # twenty arrive: the budget holds four; a prompt over the budget still runs whole
    assert prefill_batch_tokens(10240.0, 512, 2048) == 2048
    assert prefill_batch_tokens(500.0, 5000, 2048) == 5000
    assert prefill_batch_tokens(0.0, 512, 2048) == 0.0


def test_without_chunked_prefill_an_iteration_pays_its_share_of_prompt_iterations_by_hand():
    ks = layer_kernels(CFG, "fp16", KIND)
    per_seq = Load(decodes=1, decode_keys=600.0, prompt_tokens=4.0, prompt_keys=4.0 * 513 / 2)  # 512 in, 128 out
    chunked = RooflineLayerTime(layer_pieces(ks, per_seq), ks, per_seq, 512, 2048)
    whole = RooflineLayerTime(layer_pieces(ks, per_seq), ks, per_seq, 512, 2048, separate=(512, 2048))
    b = 64  # 256 prompt tokens per decode iteration: half a prefill iteration of one prompt
    decode = Load(decodes=b, decode_keys=b * 600.0)
    prompt = Load(prompt_tokens=512, prompt_keys=512 * 513 / 2)
    assert whole.prefill_iterations(b) == pytest.approx(0.5)
    assert whole(b) == pytest.approx(ks.time_s(decode) + 0.5 * ks.time_s(prompt), rel=1e-12)
    # the prompt's own iteration reads the weights again: slower than carrying it beside the decodes
    assert whole(b) > chunked(b) and chunked.prefill_iterations(b) == 0.0
