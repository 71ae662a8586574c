"""Layouts with the first class at both ends: what they gain, which layouts are allowed, and
that each of their segments gets devices of its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llm_planner.serving.assign import assign_devices
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.fleet import FleetChoice
from llm_planner.serving.layout import Pattern, Segment, layout_ok
from llm_planner.serving.search import micro_batch_options, with_ends
from llm_planner.serving.verify_claims import check_options
from llm_planner.serving.workload import RequestShape, ServingWorkload

SPEC = Path(__file__).resolve().parents[1] / "cluster_specs" / "a100-l4-t4-cloud.yaml"
A100, L4, T4 = "a100/a100-40g", "l4/l4", "t4/t4"


@pytest.fixture(scope="module")
def ctx():
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.2)
    return build_context(str(SPEC), "llama2-70b", wl, "fp16", ServingOptions())


def _best(ctx, layout):
    model = ctx.replica(layout)
    return model.best(micro_batch_options(ctx, model.p), refine=True)


def test_t4s_at_both_ends_of_the_a100s_keep_more_in_flight():
    """LLaMA-2 70B at 400 ms, where memory rather than the target bounds the sequences in flight:
    with the head on the last A100 the four T4s in front of four A100s keep 213 sequences in
    flight; moving a T4 to the end, past the A100s, takes the head off them and keeps 223 at
    16 layers each, 4.5% more tokens/s (the T4 at the end pays the engine's time per sequence)."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.4)
    ctx = build_context(str(SPEC), "llama2-70b", wl, "fp16", ServingOptions())
    base = (Segment(T4, 1, 4), Segment(A100, 1, 4))
    variants = with_ends(ctx, base)
    assert (Segment(T4, 1, 3), Segment(A100, 1, 4), Segment(T4, 1, 1)) in variants
    assert (Segment(T4, 1, 2), Segment(A100, 1, 4), Segment(T4, 1, 2)) in variants
    before = _best(ctx, base)
    layout, after = max(((v, _best(ctx, v)) for v in variants), key=lambda pair: pair[1].tokens_per_s)
    assert after.tokens_per_s > 1.03 * before.tokens_per_s
    assert after.concurrency > before.concurrency
    assert after.tpot_s <= 0.4
    front = layout[0].stages
    assert after.layers[front : front + 4] == (16, 16, 16, 16)


def test_no_variants_of_one_class_or_of_a_single_first_stage(ctx):
    assert with_ends(ctx, (Segment(A100, 1, 4),)) == []
    assert with_ends(ctx, (Segment(T4, 1, 1), Segment(A100, 1, 4))) == []
    assert with_ends(ctx, (Segment(T4, 1, 2), Segment(A100, 1, 4), Segment(T4, 1, 2))) == []


@pytest.mark.parametrize(
    "layout, ok",
    [
        ((Segment(T4, 1, 2), Segment(A100, 1, 4), Segment(T4, 1, 2)), True),
        ((Segment(T4, 1, 2), Segment(L4, 1, 2), Segment(A100, 1, 4), Segment(T4, 1, 1)), True),
        ((Segment(T4, 1, 2), Segment(T4, 1, 2), Segment(A100, 1, 4)), False),  # neighbours of one class
        ((Segment(A100, 1, 2), Segment(T4, 1, 2), Segment(A100, 1, 1), Segment(L4, 1, 1)), False),  # not at the ends
        ((Segment(T4, 1, 2), Segment(A100, 1, 2), Segment(T4, 1, 1), Segment(A100, 1, 1)), False),
        ((Segment(T4, 1, 8), Segment(A100, 1, 4), Segment(T4, 1, 8)), False),  # 16 T4s of 12
    ],
)
def test_which_layouts_are_allowed(ctx, layout, ok):
    assert layout_ok(layout, ctx.by_name) is ok


def test_each_segment_gets_its_own_devices(ctx):
    layout = (Segment(T4, 1, 2), Segment(A100, 1, 4), Segment(T4, 1, 2))
    fleet = FleetChoice(chosen=((Pattern(layout=layout, ev=_best(ctx, layout)), 1),))
    (copies,) = assign_devices(ctx.cluster, ctx.by_name, fleet)
    (stages,) = copies
    names = [d for stage in stages for d in stage]
    assert len(names) == len(set(names)) == 8
    assert all("t4" in d for d in names[:2] + names[6:]) and all("a100" in d for d in names[2:6])


def test_verify_counts_a_class_at_both_ends_once(ctx):
    """with_ends turns three classes into four segments: still three classes for max_segments."""
    layout = (Segment(T4, 1, 2), Segment(L4, 1, 2), Segment(A100, 1, 4), Segment(T4, 1, 1))
    problems: list[str] = []
    check_options(ctx, layout, 1, "replica 0", problems)
    assert problems == []
    two = dataclasses.replace(ctx.options, max_segments=2)
    original, ctx.options = ctx.options, two
    try:
        check_options(ctx, layout, 1, "replica 0", problems)
    finally:
        ctx.options = original
    assert problems == ["replica 0.segments: 3 classes in one replica, options.max_segments allows 2"]
