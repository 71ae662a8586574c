"""The independent verifier: valid plans pass, each kind of broken plan gets its own message."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_instances import kind, make_cluster, problems, random_assignment

from llm_planner.core.plan import Plan, PlanError, PlanInputs, save_plan
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.problem import build_problem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.verify import VerifyReport, verify_plan
from llm_planner.placement.verify_file import verify_plan_file

GB = 1e9
CPU, FAST, SMALL = "node0/cpu:0", "node0/fast:0", "node0/small:0"


def diamond_problem(*, objective="latency", batch=4, shards=2, small_mem=8 * GB, explicit_hops=False):
    """a -> b, a -> c, b -> d, c -> d on a CPU, a fast GPU and a small slow GPU."""
    cluster = make_cluster(
        [
            kind("cpu", "cpu", flops=2e12, mem_bytes=64 * GB, mem_bw=1e11, overhead_s=2e-5),
            kind("fast", "gpu", flops=1e14, mem_bytes=40 * GB, mem_bw=1.5e12, overhead_s=1e-5),
            kind("small", "gpu", flops=3e13, mem_bytes=small_mem, mem_bw=3e11, overhead_s=1e-5),
        ],
        [{"cpu": 1, "fast": 1, "small": 1}],
        bw=25e9,
        latency_s=1e-5,
    )
    common = {"weight_bytes": 2 * GB, "mem_bytes_per_sample": 0.4 * GB}
    if explicit_hops:
        times = (("cpu", 0.05), ("fast", 0.005), ("small", 0.01))
        tasks = tuple(Task(name=n, time_s_by_kind=times, **common) for n in "abcd")
    else:
        tasks = tuple(
            Task(name=n, flops_per_sample=2e11 * (j + 1), bytes_per_sample=1e8, **common) for j, n in enumerate("abcd")
        )
    hop = 0.002 if explicit_hops else 0.0
    edges = tuple(Edge(src=s, dst=d, bytes_per_sample=5e7, hop_s_per_sample=hop) for s, d in ("ab", "ac", "bd", "cd"))
    graph = TaskGraph(name="diamond", tasks=tasks, edges=edges).validate()
    return build_problem(graph, cluster, objective=objective, batch_size=batch, max_shards=shards)


def plan_for(problem, sizes, assigns, **kw) -> Plan:
    return make_plan(
        problem,
        sizes,
        assigns,
        solver="test",
        status="heuristic",
        started_at=time.perf_counter(),
        lower_bound_s=0.0,
        **kw,
    )


def edit_entry(plan: Plan, task: str, shard: int = 0, **changes) -> Plan:
    schedule = tuple(
        dataclasses.replace(s, **changes) if (s.task, s.shard) == (task, shard) else s for s in plan.schedule
    )
    return dataclasses.replace(plan, schedule=schedule)


def entry(plan: Plan, task: str, shard: int = 0):
    return next(s for s in plan.schedule if (s.task, s.shard) == (task, shard))


def assert_violation(report: VerifyReport, *fragments: str) -> str:
    assert not report.ok
    hits = [v for v in report.violations if all(f in v for f in fragments)]
    assert hits, f"no violation mentions {fragments}; got {report.violations}"
    return hits[0]


# -- valid plans ------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("explicit_hops", [False, True], ids=["direct", "host_staged"])
@pytest.mark.parametrize(
    "sizes, assigns",
    [
        ([4], [[1, 1, 1, 1]]),
        ([4], [[1, 2, 0, 1]]),
        ([2, 2], [[1, 1, 2, 1], [2, 2, 2, 2]]),
        ([3, 1], [[1, 1, 1, 1], [0, 2, 1, 0]]),
    ],
)
def test_plans_from_make_plan_are_accepted(objective, explicit_hops, sizes, assigns):
    problem = diamond_problem(objective=objective, small_mem=40 * GB, explicit_hops=explicit_hops)
    assert problem.throughput_model == ("host_staged" if explicit_hops else "direct")
    plan = plan_for(problem, sizes, assigns)
    report = verify_plan(plan, problem)
    assert report.ok, report.violations
    assert report.simulated_objective_s == pytest.approx(plan.objective_s, rel=1e-9)
    assert set(report.memory_used_bytes) == set(problem.device_names) == set(report.device_busy_s)
    busy = sum(problem.task_time(i, a[i], b) for b, a in zip(sizes, assigns) for i in range(4))
    assert sum(report.device_busy_s.values()) == pytest.approx(busy)


def test_memory_count_by_hand():
    problem = diamond_problem(small_mem=40 * GB)
    plan = plan_for(problem, [3, 1], [[1, 1, 1, 1], [1, 1, 2, 1]])
    report = verify_plan(plan, problem)
    assert report.ok, report.violations
    # fast: weights of a, b, c, d once (8 GB) + 0.4 GB x (4 tasks x 3 + 3 tasks x 1 samples);
    # small: c once (2 GB) + 0.4 GB
    assert report.memory_used_bytes[FAST] == pytest.approx(8 * GB + 0.4 * GB * 15)
    assert report.memory_used_bytes[SMALL] == pytest.approx(2 * GB + 0.4 * GB)
    assert report.memory_used_bytes[CPU] == 0


def test_host_staged_loads_by_hand():
    """a on the fast GPU, b on the CPU, c and d on the small GPU; hop 0.002 s per sample, batch 4."""
    problem = diamond_problem(objective="throughput", small_mem=40 * GB, explicit_hops=True)
    plan = plan_for(problem, [4], [[1, 0, 2, 2]])
    report = verify_plan(plan, problem)
    assert report.ok, report.violations
    hop = 0.002 * 4
    # fast: a (0.005 x 4) + a's output leaves once; CPU: b only (CPUs pay no hops);
    # small: c + d + a's output enters + b's output enters.
    assert report.device_load_s[FAST] == pytest.approx(0.02 + hop)
    assert report.device_load_s[CPU] == pytest.approx(0.2)
    assert report.device_load_s[SMALL] == pytest.approx(0.04 + 0.04 + 2 * hop)
    assert report.simulated_objective_s == pytest.approx(0.2 / 4)


def test_tolerance_accepts_rounding_and_rejects_more():
    problem = diamond_problem()
    plan = plan_for(problem, [4], [[1, 1, 1, 1]])
    assert verify_plan(dataclasses.replace(plan, objective_s=plan.objective_s * (1 + 1e-9)), problem).ok
    assert not verify_plan(dataclasses.replace(plan, objective_s=plan.objective_s * (1 + 1e-4)), problem).ok
    assert verify_plan(dataclasses.replace(plan, objective_s=plan.objective_s * (1 + 1e-4)), problem, rel_tol=1e-3).ok


# -- broken plans, one kind at a time --------------------------------------------------


@pytest.fixture
def problem():
    return diamond_problem(small_mem=40 * GB)


@pytest.fixture
def plan(problem):
    return plan_for(problem, [4], [[1, 1, 1, 1]])  # everything on the fast GPU


def test_overlap(problem, plan):
    b, c = entry(plan, "b"), entry(plan, "c")
    first, second = (b, c) if b.start_s < c.start_s else (c, b)
    shift = second.start_s - first.start_s
    broken = edit_entry(plan, second.task, start_s=first.start_s, finish_s=second.finish_s - shift)
    assert_violation(
        verify_plan(broken, problem),
        f"device '{FAST}' runs task",
        "task 'b' of shard 0",
        "task 'c' of shard 0",
        "runs until",
    )


def test_missing_task(problem, plan):
    broken = dataclasses.replace(plan, schedule=tuple(s for s in plan.schedule if s.task != "d"))
    report = verify_plan(broken, problem)
    assert_violation(report, "task 'd' of shard 0 is missing from the schedule")
    assert math.isnan(report.simulated_objective_s)


def test_memory_overflow():
    problem = diamond_problem(small_mem=8 * GB)
    plan = plan_for(problem, [4], [[2, 2, 2, 2]])  # make_plan does not check memory
    report = verify_plan(plan, problem)
    # 4 x 2 GB weights + 4 tasks x 4 samples x 0.4 GB = 14.4 GB on an 8 GB device
    assert_violation(report, f"device '{SMALL}' needs 14.4 GB of memory but holds 8 GB (over by 6.4 GB)")
    assert report.memory_used_bytes[SMALL] == pytest.approx(14.4 * GB)


def test_memory_that_does_not_count_is_ignored():
    problem = diamond_problem(small_mem=8 * GB)
    tasks = tuple(dataclasses.replace(t, mem_device_types=("cpu",)) for t in problem.graph.tasks)
    graph = dataclasses.replace(problem.graph, tasks=tasks)
    problem = build_problem(graph, problem.cluster, batch_size=4, max_shards=2)
    report = verify_plan(plan_for(problem, [4], [[2, 2, 2, 2]]), problem)
    assert report.ok, report.violations
    assert report.memory_used_bytes[SMALL] == 0


def test_precedence(problem, plan):
    b, d = entry(plan, "b"), entry(plan, "d")
    shift = d.start_s - b.start_s  # d now starts with b
    broken = edit_entry(plan, "d", start_s=d.start_s - shift, finish_s=d.finish_s - shift)
    assert_violation(verify_plan(broken, problem), "task 'd' of shard 0 starts at", "before the output of 'b' arrives")


def test_precedence_counts_the_transfer(problem):
    plan = plan_for(problem, [4], [[1, 2, 1, 1]])  # b on the small GPU: b -> d crosses a link
    b, d = entry(plan, "b"), entry(plan, "d")
    transfer = problem.transfer_time(2, 2, 1, 4)  # edge 2 is b -> d
    assert transfer > 0 and d.start_s >= b.finish_s + transfer * (1 - 1e-9)
    start = b.finish_s + transfer / 2  # after b ends, but before its output arrives
    broken = edit_entry(plan, "d", start_s=start, finish_s=start + (d.finish_s - d.start_s))
    assert_violation(
        verify_plan(broken, problem), "task 'd' of shard 0 starts at", "before the output of 'b' arrives", "+ transfer"
    )


def test_wrong_duration(problem, plan):
    d = entry(plan, "d")
    broken = edit_entry(plan, "d", finish_s=d.finish_s + 0.5 * (d.finish_s - d.start_s))
    assert_violation(verify_plan(broken, problem), f"task 'd' of shard 0 on '{FAST}' lasts", "for 4 samples")


def test_wrong_objective(problem, plan):
    report = verify_plan(dataclasses.replace(plan, objective_s=plan.objective_s * 0.9), problem)
    assert_violation(report, "claims objective", "simulated makespan is")
    assert report.simulated_objective_s == pytest.approx(plan.objective_s)


def test_bound_above_objective(problem, plan):
    broken = dataclasses.replace(plan, lower_bound_s=plan.objective_s * 1.01)
    assert_violation(verify_plan(broken, problem), "lower bound", "exceeds the objective")
    assert verify_plan(dataclasses.replace(plan, lower_bound_s=plan.objective_s), problem).ok


def test_wrong_max_load_for_throughput():
    problem = diamond_problem(objective="throughput", small_mem=40 * GB)
    plan = plan_for(problem, [4], [[1, 1, 2, 1]])
    broken = dataclasses.replace(plan, max_load_s=plan.max_load_s * 2, objective_s=plan.objective_s * 2)
    report = verify_plan(broken, problem)
    assert_violation(report, "max device load")
    assert_violation(report, "claims objective", "max device load / batch size")


def test_unsupported_unknown_and_missing_assignments(problem, plan):
    gpu_only = dataclasses.replace(problem.graph.tasks[0], device_types=("gpu",))
    graph = dataclasses.replace(problem.graph, tasks=(gpu_only, *problem.graph.tasks[1:]))
    strict = build_problem(graph, problem.cluster, batch_size=4, max_shards=2)
    on_cpu = dataclasses.replace(plan, shard_assignments=({**plan.assignment, "a": CPU},))
    assert_violation(
        verify_plan(on_cpu, strict), f"shard 0 puts task 'a' on device '{CPU}' (kind 'cpu'), which cannot run it"
    )
    unknown = dataclasses.replace(plan, shard_assignments=({**plan.assignment, "a": "nowhere/gpu:9"},))
    assert_violation(verify_plan(unknown, problem), "unknown device 'nowhere/gpu:9'")
    extra = dataclasses.replace(plan, shard_assignments=({**plan.assignment, "zz": FAST},))
    assert_violation(verify_plan(extra, problem), "assigns 'zz', which is not a task")
    missing = dataclasses.replace(plan, shard_assignments=({k: v for k, v in plan.assignment.items() if k != "c"},))
    assert_violation(verify_plan(missing, problem), "shard 0 assigns no device to task 'c'")


def test_schedule_device_differs_from_assignment(problem, plan):
    broken = edit_entry(plan, "c", device=SMALL)
    assert_violation(
        verify_plan(broken, problem), f"task 'c' of shard 0 is scheduled on '{SMALL}' but assigned to '{FAST}'"
    )


def test_duplicate_and_unknown_schedule_entries(problem, plan):
    dup = dataclasses.replace(plan, schedule=(*plan.schedule, plan.schedule[-1]))
    assert_violation(verify_plan(dup, problem), "is scheduled more than once")
    ghost = dataclasses.replace(plan, schedule=(*plan.schedule, dataclasses.replace(plan.schedule[0], shard=5)))
    assert_violation(verify_plan(ghost, problem), "shard 5, which the plan does not have")


def test_shard_sizes(problem):
    plan = plan_for(problem, [2, 2], [[1, 1, 1, 1], [2, 2, 2, 2]])
    assert verify_plan(plan, problem).ok
    assert_violation(
        verify_plan(dataclasses.replace(plan, shard_sizes=(2, 1)), problem), "sum to 3, not the batch size 4"
    )
    too_many = diamond_problem(small_mem=40 * GB, shards=1)
    assert_violation(verify_plan(plan, too_many), "the plan has 2 shards but at most 1 are allowed")
    empty = dataclasses.replace(plan, shard_sizes=(4, 0))
    assert_violation(verify_plan(empty, problem), "shard 1 has 0 samples")


def test_colocation_split(problem, plan):
    tasks = tuple(dataclasses.replace(t, colocate_group="pair") if t.name in "bc" else t for t in problem.graph.tasks)
    grouped = build_problem(
        dataclasses.replace(problem.graph, tasks=tasks), problem.cluster, batch_size=4, max_shards=2
    )
    split = plan_for(grouped, [4], [[1, 1, 2, 1]])
    assert_violation(verify_plan(split, grouped), "colocated tasks 'b', 'c' are split over devices")
    assert verify_plan(plan_for(grouped, [4], [[1, 2, 2, 1]]), grouped).ok


def test_objective_kind_mismatch(problem, plan):
    assert_violation(
        verify_plan(dataclasses.replace(plan, objective="throughput"), problem), "the plan optimises 'throughput'"
    )


def test_deadlock_on_one_device_is_reported(problem, plan):
    a, b = entry(plan, "a"), entry(plan, "b")
    swapped = edit_entry(
        edit_entry(plan, "b", start_s=a.start_s, finish_s=a.start_s + (b.finish_s - b.start_s)),
        "a",
        start_s=b.start_s,
        finish_s=b.start_s + (a.finish_s - a.start_s),
    )
    report = verify_plan(swapped, problem)
    assert_violation(report, "simulation deadlock", f"'{FAST}' waits to run task 'b' of shard 0")
    assert math.isnan(report.simulated_objective_s)


def test_deadlock_across_devices_is_reported():
    """a -> b and c -> d; device X runs d then a, device Y runs b then c: a cycle through both."""
    problem = diamond_problem(small_mem=40 * GB)
    graph = TaskGraph(
        name="two-chains",
        tasks=problem.graph.tasks,
        edges=(Edge(src="a", dst="b", bytes_per_sample=1e6), Edge(src="c", dst="d", bytes_per_sample=1e6)),
    ).validate()
    problem = build_problem(graph, problem.cluster, batch_size=1, max_shards=1)
    plan = plan_for(problem, [1], [[1, 2, 2, 1]])  # a, d on fast; b, c on small
    times = {"d": 0.0, "a": 1.0, "b": 0.0, "c": 1.0}
    schedule = tuple(
        dataclasses.replace(s, start_s=times[s.task], finish_s=times[s.task] + s.finish_s - s.start_s)
        for s in plan.schedule
    )
    report = verify_plan(dataclasses.replace(plan, schedule=schedule), problem)
    assert_violation(report, "simulation deadlock", "whose inputs ['a'] never finish")
    assert_violation(report, "simulation deadlock", "whose inputs ['c'] never finish")


def test_bad_rel_tol(problem, plan):
    with pytest.raises(ValueError, match="rel_tol"):
        verify_plan(plan, problem, rel_tol=-1)


# -- files ---------------------------------------------------------------------------


def test_verify_plan_file_rejects_a_non_plan(tmp_path):
    path = tmp_path / "nope.yaml"
    path.write_text(yaml.safe_dump({"format": "something-else"}))
    with pytest.raises(PlanError, match="not a plan file") as caught:
        verify_plan_file(path)
    assert "or llm_planner.serving_plan for a serving plan, got 'something-else'" in str(caught.value)
    from llm_planner.serving.plan_fields import SERVING_FORMAT

    assert SERVING_FORMAT == "llm_planner.serving_plan"  # the name core.plan's message gives


def test_verify_plan_file_uses_the_rebuilt_problem(tmp_path, monkeypatch, problem, plan):
    import llm_planner.placement.verify_file as verify_file

    seen = []
    monkeypatch.setattr(
        verify_file, "problem_from_plan_inputs", lambda inputs, check_hashes=True: seen.append(inputs) or problem
    )
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    save_plan(plan, good)
    save_plan(dataclasses.replace(plan, objective_s=plan.objective_s / 2), bad)
    assert verify_plan_file(good).ok
    assert_violation(verify_plan_file(bad), "claims objective")
    assert seen and seen[0].graph_sha256 == problem.graph.sha256()


def test_verify_plan_file_end_to_end(tmp_path, problem):
    from llm_planner.placement.inputs import problem_from_inputs

    graph_path, cluster_path = tmp_path / "g.json", tmp_path / "c.yaml"
    graph_path.write_text(problem.graph.to_json())
    cluster_path.write_text(yaml.safe_dump(cluster_dict(problem)))
    real = problem_from_inputs(cluster_path=str(cluster_path), graph_path=str(graph_path), batch_size=4, max_shards=2)
    plan = plan_for(real, [4], [[1, 1, 2, 1]])
    assert isinstance(plan.inputs, PlanInputs) and plan.inputs.cluster == str(cluster_path)
    path = tmp_path / "plan.yaml"
    save_plan(plan, path)
    assert verify_plan_file(path).ok
    save_plan(edit_entry(plan, "d", start_s=0.0), path)
    assert not verify_plan_file(path).ok


def cluster_dict(problem) -> dict:
    c = problem.cluster
    return {
        "name": c.name,
        "device_kinds": [
            {
                "name": k.name,
                "type": k.type,
                "peak_flops": dict(k.peak_flops),
                "mem_bytes": k.mem_bytes,
                "mem_bw_bytes_per_s": k.mem_bw_bytes_per_s,
                "overhead_s": k.overhead_s,
            }
            for k in c.device_kinds
        ],
        "nodes": [{"name": n.name, "devices": dict(n.devices)} for n in c.nodes],
        "links": {
            "intra_node_default": {
                "bw_bytes_per_s": c.intra_node_default.bw_bytes_per_s,
                "latency_s": c.intra_node_default.latency_s,
            }
        },
    }


# -- properties ----------------------------------------------------------------------


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_plans_verify_and_perturbed_ones_do_not(data):
    problem = data.draw(problems())
    sizes, assigns = random_assignment(data.draw, problem)
    plan = plan_for(problem, sizes, assigns)
    report = verify_plan(plan, problem)
    structural = [v for v in report.violations if "of memory but holds" not in v]  # random placements may overflow
    assert not structural, structural
    assert report.simulated_objective_s == pytest.approx(plan.objective_s, rel=1e-9)
    # a task made longer than its cost model says is always caught
    victim = data.draw(st.sampled_from(plan.schedule))
    longer = edit_entry(
        plan, victim.task, victim.shard, finish_s=victim.finish_s + 1e-3 + (victim.finish_s - victim.start_s)
    )
    assert_violation(verify_plan(longer, problem), f"task '{victim.task}' of shard {victim.shard}", "lasts")


def test_verify_imports_no_scheduler_torch_or_mpi():
    code = (
        "import sys, llm_planner.placement.verify\n"
        "bad = [m for m in ('llm_planner.placement.schedule', 'torch', 'mpi4py') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "key, value, said", [("seq_len", "64", "expected an integer"), ("name", 5, "expected a string")]
)
def test_an_edited_model_field_of_the_wrong_type_is_named(tmp_path, capsys, key, value, said):
    """inputs.model.seq_len as a string, or a number as the name: show and verify exit 2 naming the
    field, where show used to end in a Python traceback."""
    from llm_planner.cli.main import main

    plan = tmp_path / "p.yaml"
    argv = ["plan", "--cluster", "cluster_specs/localhost-2cpu.yaml", "--model", "gpt2", "--dtype", "fp32"]
    assert main([*argv, "--seq-len", "64", "--batch", "2", "--no-baselines", "-o", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    data["inputs"]["model"][key] = value
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    for command in ("show", "verify"):
        assert main([command, str(plan)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"inputs.model.{key}: {said}" in err and "Traceback" not in err, err
