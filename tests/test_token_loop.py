"""The decode loop's token hand-off: each decode step's sampled ids go from lm_head's device back
to embed's, charged once per step in every plan's objective (latency) and load (throughput), and
re-derived by the verifier."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llm_planner.core.spec import parse_cluster
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import TOKEN_BYTES, build_problem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.solve import solve
from llm_planner.placement.verify import verify_plan

LATENCY_S, BW = 10e-6, 12.5e9  # the network between the two servers
US = 1e-6


def _cluster():
    kind = {"peak_flops": {"fp16": "100 TFLOP/s"}, "mem_bytes": "80 GiB", "mem_bw_bytes_per_s": "2 TB/s"}
    return parse_cluster(
        {
            "name": "two-servers",
            "device_kinds": [{"name": "a", "type": "gpu", **kind}, {"name": "b", "type": "gpu", **kind}],
            "nodes": [{"name": "s0", "devices": {"a": 1}}, {"name": "s1", "devices": {"b": 1}}],
            "links": {"inter_node": {"bw_bytes_per_s": BW, "latency_s": LATENCY_S}},
        },
        "two.yaml",
    )


def _graph(phase: str) -> TaskGraph:
    """embed -> block -> lm_head, with explicit times: the embedding is 4 us faster on server 1
    than the 10 us network hop it costs to send its output there and back it costs 10 us more."""
    times = {"embed": (15 * US, 1 * US), "block.0": (100 * US, 1000 * US), "lm_head": (10 * US, 1000 * US)}
    tasks = tuple(
        Task(name=n, time_s_by_kind=(("a", a), ("b", b)), labels=(("role", n.split(".")[0]),))
        for n, (a, b) in times.items()
    )
    edges = (Edge(src="embed", dst="block.0"), Edge(src="block.0", dst="lm_head"))
    return TaskGraph(name="tiny", tasks=tasks, edges=edges, meta=(("phase", phase),)).validate()


def _plan(problem, embed_device: int):
    return make_plan(
        problem, [1], [[embed_device, 0, 0]], solver="hand", status="feasible", started_at=0.0, lower_bound_s=0.0
    )


def test_moving_the_embedding_across_the_network_is_charged_the_token_hop():
    """The issue's example: with the embedding on the other server, each step also pays the
    token's trip back, in the plan's objective and in verify's re-derivation."""
    decode = build_problem(_graph("decode"), _cluster())
    moved = _plan(decode, 1)
    end = max(t.finish_s for t in moved.schedule)
    assert end == pytest.approx((1 + 10 + 100 + 10) * US)  # embed, hop out, block, lm_head
    assert moved.objective_s - end == pytest.approx(LATENCY_S + TOKEN_BYTES / BW)
    assert verify_plan(moved, decode).ok
    assert verify_plan(moved, decode).simulated_objective_s == pytest.approx(moved.objective_s)
    free = replace(moved, objective_s=end)  # the hop left out, as before
    assert any("simulated makespan" in v for v in verify_plan(free, decode).violations)
    kept = _plan(decode, 0)
    assert kept.objective_s == pytest.approx(125 * US)  # all on server 0: no hop
    prefill = build_problem(_graph("prefill"), _cluster())  # no decode loop
    assert _plan(prefill, 1).objective_s == pytest.approx(end)


@pytest.mark.parametrize("solver", ["milp", "milp-split"])
def test_the_solvers_keep_the_embedding_where_the_token_comes_back(solver):
    """Without the charge the embedding moved to server 1 (121 us); with it, that costs 131 us and
    the exact MILP and MILP-SPLIT keep it on server 0 (125 us)."""
    plan = solve(build_problem(_graph("decode"), _cluster()), SolveOptions(solver=solver, time_limit_s=20))
    assert plan.assignment["embed"] == "s0/a:0"
    assert plan.objective_s == pytest.approx(125 * US)


def test_throughput_loads_charge_the_token_to_both_ends():
    problem = build_problem(_graph("decode"), _cluster(), objective="throughput")
    moved = _plan(problem, 1)
    hop_out = LATENCY_S  # the edge embed -> block carries no bytes
    token = LATENCY_S + TOKEN_BYTES / BW
    assert moved.max_load_s == pytest.approx(110 * US + hop_out + token)  # server 0: block, lm_head, both hops
    report = verify_plan(moved, problem)
    assert report.ok and report.device_load_s["s1/b:0"] == pytest.approx(1 * US + hop_out + token)
