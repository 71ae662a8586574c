"""MILP-SPLIT's stage DP for the throughput objective (llm_planner.placement.split.throughput): the
device orders it tries, and a chain whose best contiguous plan starts on the slower device."""

from __future__ import annotations

import pytest
from test_milp import exact, explicit_problem

from llm_planner.placement.options import SolveOptions
from llm_planner.placement.split.split_context import SplitContext
from llm_planner.placement.split.throughput import _arrangements, _class_sequences, device_orders, throughput_plan
from llm_planner.placement.verify import verify_plan


def test_class_sequences_are_every_distinct_arrangement_once():
    seqs = list(_class_sequences([2, 1, 1]))
    assert len(seqs) == len(set(seqs)) == _arrangements([2, 1, 1]) == 12
    assert all(sorted(s) == [0, 0, 1, 2] for s in seqs)


def test_device_orders_cover_every_order_of_three_kinds():
    times = {"a": {"f": 1.0, "m": 2.0, "s": 3.0}}
    problem = explicit_problem(times, [], {"f": 1, "m": 1, "s": 1}, objective="throughput")
    orders = device_orders(problem, list(range(problem.num_devices)), 1)
    names = [tuple(problem.devices[d].kind for d in order) for order in orders]
    assert names[0] == ("f", "m", "s")  # fastest first, tried first
    assert len(names) == len(set(names)) == 6


# a -> b -> c -> d; s takes twice f's time. Fastest device first, the best contiguous plan is
# f{a, b, c} s{d}: max(3 + 0.1, 6 + 0.1) = 6.1, or f alone: 6. Slow device first: s{a, b} f{c, d}
# = max(4 + 0.1, 4 + 0.1) = 4.1 (the cut edge is charged to both ends), the optimum.
CHAIN = {"a": {"f": 1.0, "s": 2.0}, "b": {"f": 1.0, "s": 2.0}, "c": {"f": 1.0, "s": 2.0}, "d": {"f": 3.0, "s": 6.0}}


def test_the_stage_dp_puts_the_slow_device_first_when_that_is_better():
    problem = explicit_problem(CHAIN, ["ab", "bc", "cd"], {"f": 1, "s": 1}, comm_s=0.1, objective="throughput")
    assert exact(problem).objective_s == pytest.approx(4.1)
    with SplitContext(problem, SolveOptions(solver="milp-split")) as ctx:
        plans = throughput_plan(ctx, 0.0)
    best = min(plans, key=lambda p: p.objective_s)
    assert best.objective_s == pytest.approx(4.1)
    kinds = {t: dev.split("/")[1][0] for t, dev in best.shard_assignments[0].items()}
    assert kinds == {"a": "s", "b": "s", "c": "f", "d": "f"}
    assert verify_plan(best, problem).ok
