"""Throughput plans whose steady state fits: every batch in flight holds its per-sample memory.

The hand-solved instance: a chain a -> b on two identical GPUs of 10 GB (all usable), batch
Q = 4, one shard, free transfers, each task 0.25 s per sample (1 s per batch). Task a holds
2 GB of weights and 1.5 GB per sample (6 GB for the batch), b 1 GB of weights and nothing per
sample.

- both tasks on one GPU: load 2 s, makespan 2 s, 1 batch in flight; memory 2 + 1 + 6 = 9 GB:
  fits; 2 s / 4 = 0.5 s per sample;
- a and b on different GPUs (a pipeline): load 1 s on each, makespan 2 s, so 2 batches in
  flight; a's GPU holds 2 + 6 = 8 GB for one batch (it fits one) but 2 + 2 * 6 = 14 GB for
  the two the steady state keeps: it does not fit. Its 0.25 s per sample does not exist.

So the optimum among plans that fit is 0.5 s per sample, and the one-batch optimum 0.25 s
per sample is not one of them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from llm_planner.core.plan import PlanError, batches_in_flight, load_plan, save_plan
from llm_planner.core.spec import parse_cluster
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.fit import fits_steady_state, steady_state_memory, steady_state_shortfall
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.session import SolveSession
from llm_planner.placement.solve import solve
from llm_planner.placement.verify import verify_plan
from llm_planner.placement.verify_file import verify_plan_file
from llm_planner.runtime.plan_schedule import in_flight_batches

GB = 1e9
CLUSTER = {
    "name": "two-gpus",
    "device_kinds": [
        {
            "name": "g",
            "type": "gpu",
            "peak_flops": {"fp16": 1e14},
            "mem_bytes": 10 * GB,
            "mem_bw_bytes_per_s": 1e12,
            "usable_mem_fraction": 1.0,
        }
    ],
    "nodes": [{"name": "node0", "devices": {"g": 2}}],
    "links": {"intra_node_default": {"bw_bytes_per_s": 10e9, "latency_s": 0.0}},
}
GRAPH = TaskGraph(
    name="chain",
    tasks=(
        Task(name="a", time_s_by_kind=(("g", 0.25),), weight_bytes=2 * GB, mem_bytes_per_sample=1.5 * GB),
        Task(name="b", time_s_by_kind=(("g", 0.25),), weight_bytes=1 * GB),
    ),
    edges=(Edge(src="a", dst="b", bytes_per_sample=0.0),),
).validate()


def chain_problem(objective: str = "throughput"):
    return build_problem(GRAPH, parse_cluster(CLUSTER), objective=objective, batch_size=4, max_shards=1)


def pipeline_plan(problem):
    """a on the first GPU, b on the second: fits one batch, not the two it keeps in flight."""
    return make_plan(
        problem, [4], [[0, 1]], solver="test", status="heuristic", started_at=time.perf_counter(), lower_bound_s=0.0
    )


def test_the_pipeline_needs_two_batches_whose_memory_does_not_fit():
    problem = chain_problem()
    plan = pipeline_plan(problem)
    assert plan.objective_s == pytest.approx(0.25) and plan.max_load_s == pytest.approx(1.0)
    assert plan.makespan_s == pytest.approx(2.0) and plan.batches_in_flight == 2
    assert in_flight_batches(plan) == 2  # the launcher's count is the plan's
    assert list(steady_state_memory(problem, plan)) == pytest.approx([14 * GB, 1 * GB])
    assert problem.device_memory_used([4], [[0, 1]]).tolist() == pytest.approx([8 * GB, 1 * GB])  # one batch fits
    assert "node0/g:0" in steady_state_shortfall(problem, plan) and not fits_steady_state(problem, plan)
    report = verify_plan(plan, problem)
    assert not report.ok and report.batches_in_flight == 2
    assert report.violations == (
        "device 'node0/g:0' needs 14 GB of memory but holds 10 GB (over by 4 GB, with 2 batches in flight)",
    )
    # the same placement for latency runs one batch: it fits
    latency = chain_problem("latency")
    assert verify_plan(pipeline_plan(latency), latency).ok and pipeline_plan(latency).batches_in_flight == 1


def test_batches_in_flight_rounds_up_and_is_one_for_latency():
    assert batches_in_flight("throughput", 2.0, 1.0) == 2
    assert batches_in_flight("throughput", 2.0 + 1e-12, 1.0) == 2  # float noise does not add a batch
    assert batches_in_flight("throughput", 2.5, 1.0) == 3
    assert batches_in_flight("throughput", 0.5, 1.0) == 1
    assert batches_in_flight("throughput", 2.0, 0.0) == 1
    assert batches_in_flight("latency", 5.0, 1.0) == 1


@pytest.mark.parametrize("solver", ["milp-split", "milp", "best-baseline", "heft", "single-device"])
def test_the_solvers_return_the_plan_that_fits(solver):
    problem = chain_problem()
    plan = solve(problem, SolveOptions(solver=solver, time_limit_s=20))
    assert plan.objective_s == pytest.approx(0.5)  # both tasks on one GPU: the optimum among plans that fit
    assert plan.batches_in_flight == 1 and fits_steady_state(problem, plan)
    assert plan.lower_bound_s <= plan.objective_s
    assert verify_plan(plan, problem).ok


def test_a_baseline_with_no_plan_that_fits_says_so():
    from llm_planner.placement.errors import SolveError

    with pytest.raises(SolveError, match="even-split.*every batch its steady state keeps in flight"):
        solve(chain_problem(), SolveOptions(solver="even-split"))  # one stage per GPU: the pipeline, which does not fit


def test_every_baseline_plan_fits_its_steady_state():
    problem = chain_problem()
    plans = {name: plan for name, plan in SolveSession(problem).baselines.items() if plan is not None}
    assert plans
    for name, plan in plans.items():
        assert fits_steady_state(problem, plan), name


def write_chain_inputs(folder: Path):
    graph_path, cluster_path = folder / "g.json", folder / "c.yaml"
    graph_path.write_text(GRAPH.to_json())
    cluster_path.write_text(yaml.safe_dump(CLUSTER))
    return problem_from_inputs(
        cluster_path=str(cluster_path), graph_path=str(graph_path), objective="throughput", batch_size=4, max_shards=1
    )


def test_verify_refuses_a_plan_file_whose_steady_state_does_not_fit(tmp_path):
    from plan_files import verify_outcome

    problem = write_chain_inputs(tmp_path)
    path = tmp_path / "plan.yaml"
    save_plan(pipeline_plan(problem), path)
    assert yaml.safe_load(path.read_text())["batches_in_flight"] == 2
    code, messages = verify_outcome(path)
    assert code == 1 and len(messages) == 1
    assert (
        "'node0/g:0' needs 14 GB" in messages[0]
        and "holds 10 GB" in messages[0]
        and "2 batches in flight" in messages[0]
    )
    fitting = tmp_path / "fits.yaml"
    save_plan(
        make_plan(
            problem, [4], [[0, 0]], solver="test", status="heuristic", started_at=time.perf_counter(), lower_bound_s=0.0
        ),
        fitting,
    )
    assert verify_outcome(fitting) == (0, []) and verify_plan_file(fitting).batches_in_flight == 1


def test_a_hand_edited_batches_in_flight_is_refused(tmp_path):
    from plan_files import verify_outcome

    problem = write_chain_inputs(tmp_path)
    path = tmp_path / "plan.yaml"
    save_plan(pipeline_plan(problem), path)
    data = yaml.safe_load(path.read_text())
    data["batches_in_flight"] = 1
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(
        PlanError, match=r"batches_in_flight: the file says 1, but ceil\(makespan / max_load_s\).* is 2"
    ):
        load_plan(path)
    code, messages = verify_outcome(path)
    assert code == 2 and "batches_in_flight" in messages[0]
    del data["batches_in_flight"]  # a throughput plan must say it
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PlanError, match="batches_in_flight: missing required field"):
        load_plan(path)


def test_show_prints_the_steady_state(tmp_path):
    from llm_planner.placement.views import steady_state_text

    problem = write_chain_inputs(tmp_path)
    text = steady_state_text(pipeline_plan(problem))
    assert text.startswith("steady state: 2 batch(es) of 4 in flight") and "per-token" not in text  # not a decoder
    latency = chain_problem("latency")
    assert steady_state_text(pipeline_plan(latency)) is None


@pytest.mark.slow
def test_gpt3_on_six_servers_at_batch_32_fits_its_steady_state():
    """The defect a user found: MILP-SPLIT's throughput plan was a 12-stage pipeline that needs 12
    batches in flight, whose KV cache the H100 stages cannot hold (about 137 GB per GPU)."""
    from llm_planner.graph.models import ModelSpec

    problem = problem_from_inputs(
        cluster_path="cluster_specs/gpt3-six-servers.yaml",
        model=ModelSpec(name="gpt3-175b"),
        objective="throughput",
        batch_size=32,
        max_tp=None,
    )
    plan = solve(problem, SolveOptions(solver="milp-split"))
    report = verify_plan(plan, problem)
    assert report.ok, report.violations
    assert fits_steady_state(problem, plan) and report.batches_in_flight == plan.batches_in_flight > 1
    assert plan.lower_bound_s <= plan.objective_s
