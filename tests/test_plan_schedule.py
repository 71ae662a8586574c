"""The plan's schedule as the runtime runs it (llm_planner.runtime.plan_schedule), without MPI:
stages, streams, each rank's order, and that the orders never wait in a cycle."""

from __future__ import annotations

import random
import time

import pytest
from runtime_fixtures import LOCALHOST, decoder_plan, save_config, tiny_gpt2

from llm_planner.core.plan import load_plan
from llm_planner.graph.models import ModelSpec
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.schedule import make_plan
from llm_planner.runtime import plan_schedule as ps
from llm_planner.runtime.decoder_tasks import decoder_tasks

G01 = "localhost/cpu-core:0-1"
RANKS = {f"localhost/cpu-core:{i}": i for i in range(4)}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_config(tiny_gpt2(), tmp_path_factory.mktemp("gpt2"))


def test_a_group_stage_runs_on_its_members_and_the_first_leads(model_dir, tmp_path):
    plan = load_plan(
        decoder_plan(tmp_path / "p.yaml", model_dir, [{"embed": G01, "block.2": 2, "lm_head": 3}], max_tp=2)
    )
    route = ps.shard_stages(plan, 0, decoder_tasks(4), ps.ranks_of_devices(plan, RANKS))
    assert [(s.device, s.ranks, s.tasks) for s in route] == [
        (G01, (0, 1), ("embed", "block.0", "block.1")),
        ("localhost/cpu-core:2", (2,), ("block.2", "block.3", "final_norm")),
        ("localhost/cpu-core:3", (3,), ("lm_head",)),
    ]
    assert route[0].leader == 0
    assert ps.calls_per_step(plan, 1)[(G01, "block.1")] == [1]


def test_streams_follow_the_plans_shards_and_batches(model_dir, tmp_path):
    plan = load_plan(decoder_plan(tmp_path / "p.yaml", model_dir, [{"embed": 0}, {"embed": 1}], shard_sizes=[3, 1]))
    streams = ps.streams_of(plan, 2)
    assert [(s.batch, s.shard, s.requests) for s in streams] == [
        (0, 0, (0, 1, 2)),
        (0, 1, (3,)),
        (1, 0, (4, 5, 6)),
        (1, 1, (7,)),
    ]
    assert ps.calls_per_step(plan, 2)[("localhost/cpu-core:0", "embed")] == [
        3,
        3,
    ]  # one call per stream at the shard's size


def test_latency_plans_run_one_batch_and_throughput_plans_fill_the_pipeline(model_dir, tmp_path):
    layout = [{"embed": 0, "block.2": 1}]
    latency = load_plan(decoder_plan(tmp_path / "l.yaml", model_dir, layout))
    assert ps.in_flight_batches(latency) == 1
    plan = load_plan(decoder_plan(tmp_path / "t.yaml", model_dir, layout, objective="throughput"))
    makespan = max(t.finish_s for t in plan.schedule)
    assert (
        ps.in_flight_batches(plan) == pytest.approx(-(-makespan // plan.max_load_s)) and ps.in_flight_batches(plan) >= 2
    )
    alone = load_plan(
        decoder_plan(tmp_path / "d.yaml", model_dir, [{"embed": 0}, {"embed": 1}], objective="throughput")
    )
    assert ps.in_flight_batches(alone) == 1  # two replicas: nothing to fill


def _simulate(plan, batches: int, steps: int) -> None:
    """Run every rank's order with collectives (a group's stage needs all members there at once); fail on a cycle."""
    chain = decoder_tasks(4)
    ranks_of = ps.ranks_of_devices(plan, RANKS)
    routes = [ps.shard_stages(plan, s, chain, ranks_of) for s in range(len(plan.shard_sizes))]
    streams = ps.streams_of(plan, batches)
    used = sorted({r for route in routes for st in route for r in st.ranks})
    orders = ps.device_orders(streams, routes, steps)
    todo = {r: list(orders[next(st.device for route in routes for st in route if r in st.ranks)]) for r in used}
    done: set = set()
    while any(todo.values()):
        progressed = False
        for r in used:
            if not todo[r]:
                continue
            step, s, k = todo[r][0]
            route = routes[streams[s].shard]
            ready = (step == 0 and k == 0) or (
                (s, step, k - 1) in done if k > 0 else (s, step - 1, len(route) - 1) in done
            )
            if ready and all(todo[m] and todo[m][0] == (step, s, k) for m in route[k].ranks):
                for m in route[k].ranks:
                    todo[m].pop(0)
                done.add((s, step, k))
                progressed = True
        assert progressed, (
            f"the ranks' orders wait on each other: next items {[(r, t[0]) for r, t in todo.items() if t]}"
        )


def test_no_plan_makes_the_ranks_wait_in_a_cycle(model_dir):
    """Random placements (single devices, or group 0-1 beside devices 2 and 3), random shards: every order completes."""
    model = ModelSpec(name=str(model_dir), dtype="fp32", seq_len=16)
    rng = random.Random(7)
    for objective in ("latency", "throughput"):
        problem = problem_from_inputs(
            cluster_path=str(LOCALHOST), model=model, objective=objective, batch_size=4, max_tp=2
        )
        names = [d.name for d in problem.devices]
        layouts = [[n for n in names if n in RANKS], [G01, "localhost/cpu-core:2", "localhost/cpu-core:3"]]
        for _ in range(25):
            shards = rng.choice([[4], [2, 2], [1, 1, 2], [1, 1, 1, 1]])
            usable = rng.choice(layouts)
            rows = [[names.index(rng.choice(usable)) for _ in problem.graph.tasks] for _ in shards]
            plan = make_plan(
                problem,
                shards,
                rows,
                solver="test",
                status="heuristic",
                started_at=time.perf_counter(),
                lower_bound_s=0.0,
            )
            _simulate(plan, ps.in_flight_batches(plan), 3)


def test_a_throughput_pipeline_feeds_the_next_step_before_finishing_the_other_batch(model_dir, tmp_path):
    """embed and the tail on device 1, the middle on device 0, two batches in flight: device 1 starts batch 0's next
    step (its embed) before batch 1's tail, so device 0 never waits a whole stage (the steady state the plan costs)."""
    layout = [{"embed": 1, "block.0": 0, "block.2": 1}]
    plan = load_plan(decoder_plan(tmp_path / "t.yaml", model_dir, layout, objective="throughput", shard_sizes=[2]))
    batches = ps.in_flight_batches(plan)
    assert batches == 2
    streams = ps.streams_of(plan, batches)
    routes = [ps.shard_stages(plan, 0, decoder_tasks(4), ps.ranks_of_devices(plan, RANKS))]
    order = ps.device_orders(streams, routes, 3)["localhost/cpu-core:1"]
    assert order.index((1, 0, 0)) < order.index((0, 1, 2))  # (step, stream, stage): step 1's embed of batch 0 first
    within = [item for item in order if item[0] == 0 and item[1] == 0]
    assert within == [(0, 0, 0), (0, 0, 2)]  # one batch's step keeps the plan's order
