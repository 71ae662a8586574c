"""Tensor-parallel groups: their cost by hand, which tasks they run, exclusivity, and every solver
and bound against a brute force that enumerates single devices and groups alike."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from milp_brute_force import brute_force
from planner_instances import kind, make_cluster

from llm_planner.core.spec import LinkSpec
from llm_planner.core.tensor_groups import group_degrees, member_names, tensor_groups
from llm_planner.cost import roofline as cost
from llm_planner.graph.decoder_graph import build_decoder_graph
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.placement.bounds.combined import lower_bound
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import build_problem
from llm_planner.placement.session import SolveSession
from llm_planner.placement.solve import solve
from llm_planner.placement.verify import verify_plan

GB = 1e9
EXACT = {"solver": "milp", "rel_gap": 1e-7, "time_limit_s": 60.0}


def gpu_cluster(count: int, *, mem: float = 100 * GB, cpu: bool = False, bw: float = 50e9, latency_s: float = 2e-6):
    kinds = [kind("g", "gpu", flops=1e14, mem_bytes=mem, mem_bw=1e12, overhead_s=5e-6)]
    devices = {"g": count}
    if cpu:
        kinds.append(kind("c", "cpu", flops=1e12, mem_bytes="unlimited", mem_bw=1e11, overhead_s=2e-5))
        devices["c"] = 1
    return make_cluster(kinds, [devices], bw=bw, latency_s=latency_s)


def tp_chain(seed: int, n: int = 3, divides: int = 4) -> TaskGraph:
    """A chain of n tasks that shard over groups whose size divides `divides`, costs drawn from `seed`."""
    rng = random.Random(seed)
    tasks = tuple(
        Task(
            name=f"t{i}",
            flops_per_sample=rng.uniform(1e9, 5e10),
            bytes_per_sample=rng.uniform(1e6, 5e7),
            weight_bytes=rng.uniform(1e8, 3e9),
            mem_bytes_per_sample=rng.uniform(0, 2e8),
            tp_divides=(divides,),
            tp_replicated_bytes_per_sample=1e5,
            tp_allreduces=rng.choice([1, 2]),
            tp_allreduce_bytes_per_sample=rng.uniform(1e5, 5e6),
        )
        for i in range(n)
    )
    edges = tuple(Edge(src=f"t{i}", dst=f"t{i + 1}", bytes_per_sample=rng.uniform(1e5, 1e7)) for i in range(n - 1))
    return TaskGraph(name=f"tp-chain-{seed}", tasks=tasks, edges=edges).validate()


# -- cost by hand ----------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 4, 8])
def test_ring_collectives_by_hand(k):
    link = LinkSpec(bw_bytes_per_s=100e9, latency_s=3e-6)
    task = Task(
        name="t",
        tp_divides=(8,),
        tp_allreduces=2,
        tp_allreduce_bytes_per_sample=2 * 24_576.0,
        tp_allgathers=1,
        tp_allgather_bytes_per_sample=8.0,
    )
    fixed, slope = cost.collective_pieces(task, k, link)
    # two all-reduces of 24,576 B per sample: each 2 (k-1) alpha + 2 (k-1)/k n / beta;
    # one all-gather of 8 B from each member
    assert fixed == pytest.approx(2 * 2 * (k - 1) * 3e-6 + (k - 1) * 3e-6)
    assert slope == pytest.approx(2 * 2 * (k - 1) / k * 24_576 / 100e9 + (k - 1) * 8 / 100e9)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_group_time_is_a_member_roofline_plus_collectives(k):
    kind_spec = make_cluster(
        [kind("g", "gpu", flops=1e14, mem_bytes=80 * GB, mem_bw=2e12, overhead_s=1e-5)], [{"g": 8}]
    ).kind("g")
    link = LinkSpec(bw_bytes_per_s=400e9, latency_s=2e-6)
    task = Task(
        name="block",
        flops_per_sample=8e9,
        bytes_per_sample=4e6,
        weight_bytes=3.2e9,
        mem_bytes_per_sample=1e8,
        tp_divides=(96, 96),
        tp_replicated_weight_bytes=2e5,
        tp_replicated_bytes_per_sample=1e6,
        tp_allreduces=2,
        tp_allreduce_bytes_per_sample=2 * 24_576.0,
    )
    b = 16
    member_weights = (3.2e9 - 2e5) / k + 2e5
    member_bytes = (4e6 - 1e6) / k + 1e6
    roofline = 1e-5 + max(8e9 / k * b / 1e14, (member_weights + member_bytes * b) / 2e12)
    # each of the two calls: the kind's fixed time per call, 2 (k - 1) link latencies, the ring's bytes
    # at the kind's collective efficiency of the link's bandwidth (a gpu's default 0.61)
    beta = 400e9 * kind_spec.collective_bw_efficiency
    assert kind_spec.collective_bw_efficiency == 0.61
    allreduce = 2 * (kind_spec.collective_call_s + 2 * (k - 1) * 2e-6 + 2 * (k - 1) / k * 24_576 * b / beta)
    assert cost.evaluate_pieces(cost.group_task_time_pieces(task, kind_spec, k, link, "fp16"), b) == pytest.approx(
        roofline + allreduce
    )
    assert cost.shard_of(task, k).mem_bytes_per_sample == pytest.approx(1e8 / k)


def test_decode_embedding_reads_rows_not_the_table():
    graph = build_decoder_graph(
        preset_config("gpt3-175b"), phase="decode", seq_len=2048, granularity="block", dtype="fp16"
    )
    embed = graph.task("embed")
    assert embed.weight_bytes_indexed == pytest.approx((50257 + 2048) * 12288 * 2)  # the token and position tables
    h100 = make_cluster(
        [kind("h", "gpu", flops=989e12, mem_bytes=80 * GB, mem_bw=3.35e12, overhead_s=8e-6)], [{"h": 1}]
    ).kind("h")
    # one decode step of 32 requests reads 32 rows and the position table, not the 1.2 GB vocabulary table
    assert cost.estimate_task_time_s(embed, h100, "fp16", 32) < 1e-4


# -- which groups run what -------------------------------------------------------------


def test_offered_degrees_are_aligned_powers_of_two_and_the_whole_class():
    assert group_degrees(8, 8) == [2, 4, 8]
    assert group_degrees(6, 8) == [2, 6]
    assert group_degrees(3, 8) == [3]
    assert group_degrees(8, 4) == [2, 4]
    names = [g.name for g in tensor_groups(gpu_cluster(4), 4)]
    assert names == ["node0/g:0-1", "node0/g:2-3", "node0/g:0-3"]
    assert member_names("node0/g:2-3") == ["node0/g:2", "node0/g:3"]


def test_heads_that_k_does_not_divide_get_no_group_of_size_k():
    graph = build_decoder_graph(
        preset_config("gpt2"), phase="decode", seq_len=128, granularity="block", dtype="fp16"
    )  # 12 heads
    problem = build_problem(graph, gpu_cluster(8), max_tp=8)
    blocks = [i for i, t in enumerate(graph.tasks) if t.kind == "block"]
    for k, device in enumerate(problem.devices):
        runs = bool(problem.supported[blocks, k].all())
        assert runs == (12 % device.degree == 0), device.name  # 1, 2, 4 divide 12; 8 does not
        assert not problem.supported[blocks, k].any() or runs


def test_grouped_query_attention_limits_the_degree_by_kv_heads():
    graph = build_decoder_graph(
        preset_config("llama2-70b"), phase="decode", seq_len=128, granularity="sublayer", dtype="fp16"
    )
    attn = graph.task("block.0.attn")
    assert attn.shards_over(8) and not attn.shards_over(16)  # 64 heads, 8 KV heads
    assert graph.task("block.0.mlp").shards_over(8)


def test_max_tp_one_offers_no_group():
    problem = build_problem(tp_chain(0), gpu_cluster(4), max_tp=1)
    assert not problem.has_groups and problem.num_devices == 4


# -- solvers and bounds against the brute force -----------------------------------------


def _check_against_brute(problem, *, split_exact: bool):
    from unittest import mock

    from llm_planner.placement.bounds import partition

    best = brute_force(problem)
    assert math.isfinite(best)
    assert lower_bound(problem) <= best * (1 + 1e-9)
    with mock.patch.object(partition, "MAX_PARTITIONS", 0):  # the partition bound's stand-ins per shard count
        assert lower_bound(problem) <= best * (1 + 1e-9)
    milp = solve(problem, SolveOptions(**EXACT))
    assert milp.objective_s == pytest.approx(best, rel=1e-5)
    assert milp.lower_bound_s <= best * (1 + 1e-9)
    split = solve(problem, SolveOptions(solver="milp-split"))
    assert split.lower_bound_s <= best * (1 + 1e-9)
    if split_exact:
        assert split.objective_s == pytest.approx(best, rel=1e-5)
    for name, base in SolveSession(problem).baselines.items():
        if base is not None:
            assert verify_plan(base, problem).ok, name
            assert split.objective_s <= base.objective_s * (1 + 1e-9), name
    return best


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_two_gpus_and_their_group_match_the_brute_force(seed, objective):
    problem = build_problem(
        tp_chain(seed), gpu_cluster(2, cpu=True), objective=objective, batch_size=2, max_shards=2, max_tp=2
    )
    assert problem.has_groups
    _check_against_brute(problem, split_exact=True)


def test_exclusivity_binds_on_these_instances():
    """Without exclusivity a throughput plan would run a GPU alone and in its group at once."""
    problem = build_problem(
        tp_chain(0), gpu_cluster(2, cpu=True), objective="throughput", batch_size=2, max_shards=2, max_tp=2
    )
    assert brute_force(problem, exclusive=False) < brute_force(problem) * (1 - 1e-3)


@pytest.mark.parametrize("seed", range(3))
def test_four_gpus_with_pairs_and_a_quad_match_the_brute_force(seed):
    problem = build_problem(tp_chain(seed), gpu_cluster(4), batch_size=1, max_tp=4)
    assert problem.num_devices == 4 + 2 + 1
    _check_against_brute(
        problem, split_exact=True
    )  # every cut of 4 devices is a layout: (4), (2, 2), (2, 1, 1), (1, 1, 1, 1)


def test_memory_forces_a_group():
    """The task's weights fit only when split over two GPUs: the optimum uses the group."""
    graph = tp_chain(1, n=1)
    tight = (graph.tasks[0].weight_bytes + graph.tasks[0].mem_bytes_per_sample) * 0.6
    problem = build_problem(graph, gpu_cluster(2, mem=tight), max_tp=2)
    plan = solve(problem, SolveOptions(**EXACT))
    assert set(plan.assignment.values()) == {"node0/g:0-1"}
    assert plan.objective_s == pytest.approx(brute_force(problem), rel=1e-6)


@pytest.mark.milp
@pytest.mark.parametrize("criterion", ["none", "batch", "task", "time", "first"])
def test_symmetry_criteria_keep_the_optimum_with_groups(criterion):
    problem = build_problem(tp_chain(2, n=3), gpu_cluster(4), batch_size=2, max_shards=2, max_tp=4)
    best = brute_force(problem)
    plan = solve(problem, SolveOptions(**EXACT, symmetry=criterion))
    assert plan.objective_s == pytest.approx(best, rel=1e-5)


@pytest.mark.parametrize("criterion", ["batch", "first"])
def test_symmetry_criteria_keep_the_optimum_with_groups_quick(criterion):
    problem = build_problem(tp_chain(3, n=2), gpu_cluster(4), batch_size=1, max_tp=4)
    best = brute_force(problem)
    plan = solve(problem, SolveOptions(**EXACT, symmetry=criterion))
    assert plan.objective_s == pytest.approx(best, rel=1e-5)


# -- the verifier ---------------------------------------------------------------------


def test_verifier_rejects_a_group_used_beside_its_member():
    problem = build_problem(tp_chain(0), gpu_cluster(2), max_tp=2)
    plan = solve(problem, SolveOptions(solver="milp-split"))
    from dataclasses import replace

    assignment = {"t0": "node0/g:0-1", "t1": "node0/g:0", "t2": "node0/g:0-1"}
    bad = replace(plan, shard_assignments=(assignment,))
    report = verify_plan(bad, problem)
    assert any("share a physical device" in v for v in report.violations)


def test_verifier_checks_each_members_memory():
    graph = tp_chain(1)
    problem = build_problem(graph, gpu_cluster(2), max_tp=2)
    plan = solve(problem, SolveOptions(**EXACT))
    from dataclasses import replace

    small = replace(
        problem, mem_capacity=np.full(problem.num_devices, 1e15), cluster=gpu_cluster(2, mem=1e6)
    )  # members may hold 1 MB: nothing fits
    on_group = replace(plan, shard_assignments=({t.name: "node0/g:0-1" for t in graph.tasks},))
    report = verify_plan(on_group, small)
    assert any("each member of group" in v for v in report.violations)


# -- plan files and the command line ------------------------------------------------------

FOUR = ["--cluster", "cluster_specs/four-gpus.yaml", "--model", "llama2-70b", "--batch", "8"]


@pytest.mark.heavy
def test_group_plan_file_lists_members_reads_back_and_verifies(tmp_path, capsys):
    import yaml

    from llm_planner.cli.main import main
    from llm_planner.core.plan import load_plan

    out = tmp_path / "plan.yaml"
    assert main(["plan", *FOUR, "--solver", "megatron", "--no-baselines", "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    groups = [d for d in data["assignment"].values() if isinstance(d, list)]
    assert groups and all(len(g) == 4 and g[0].endswith(":0") for g in groups)
    assert data["inputs"]["max_tp"] == 4
    plan = load_plan(out)
    assert set(plan.assignment.values()) == {"server/a100-80g:0-3"}
    assert main(["verify", str(out)]) == 0
    assert main(["show", str(out)]) == 0
    assert "server/a100-80g:0-3" in capsys.readouterr().out


def test_max_tp_below_one_is_an_input_error(tmp_path, capsys):
    from llm_planner.cli.main import main

    assert main(["plan", *FOUR, "--max-tp", "0", "-o", str(tmp_path / "p.yaml")]) == 2
    assert "--max-tp" in capsys.readouterr().err


def test_max_tp_one_plans_without_groups(tmp_path):
    import yaml

    from llm_planner.cli.main import main

    out = tmp_path / "p.yaml"
    assert main(["plan", *FOUR, "--max-tp", "1", "--solver", "heft", "--no-baselines", "-o", str(out)]) == 0
    assert not any(isinstance(d, list) for d in yaml.safe_load(out.read_text())["assignment"].values())


@pytest.mark.heavy
def test_export_writes_the_regular_form_and_refuses_the_rest(tmp_path, capsys):
    import json

    from llm_planner.cli.main import main

    out = tmp_path / "p.yaml"
    assert main(["plan", *FOUR, "--solver", "megatron", "--no-baselines", "-o", str(out), "--export", "vllm"]) == 0
    config = json.loads((tmp_path / "p.vllm.json").read_text())
    assert (config["tensor_parallel_size"], config["pipeline_parallel_size"], config["data_parallel_size"]) == (4, 1, 1)
    assert config["pp_layer_partition"] == "80"
    # 5 requests over three single-A100 replicas: 2, 2, 1, which Megatron's data parallelism cannot give
    capsys.readouterr()
    small = ["--cluster", "cluster_specs/four-gpus.yaml", "--model", "llama3-8b", "--batch", "5"]
    assert (
        main(["plan", *small, "--solver", "tp-replicas", "--no-baselines", "-o", str(out), "--export", "megatron"]) == 2
    )
    said = " ".join(capsys.readouterr().err.split())
    assert "no megatron form" in said and f"the plan itself is written to {out}, no megatron configuration" in said
    assert out.exists() and not (tmp_path / "p.megatron.json").exists()


def test_export_names_the_rule_a_plan_breaks():
    from dataclasses import replace

    from llm_planner.export.placement import ExportError, export_plan

    graph = tp_chain(0)
    problem = build_problem(graph, gpu_cluster(4), max_tp=4)
    plan = solve(problem, SolveOptions(solver="milp-split"))
    topo, layers = graph.topological_order(), {t.name: i for i, t in enumerate(graph.tasks)}
    mixed = replace(plan, shard_assignments=({"t0": "node0/g:0-1", "t1": "node0/g:2", "t2": "node0/g:3"},))
    with pytest.raises(ExportError, match="different tensor-parallel degrees"):
        export_plan(mixed, "vllm", topo, layers)
    back = replace(plan, shard_assignments=({"t0": "node0/g:0", "t1": "node0/g:1", "t2": "node0/g:0"},))
    with pytest.raises(ExportError, match="after leaving it"):
        export_plan(back, "vllm", topo, layers)
    staged = replace(plan, shard_assignments=({"t0": "node0/g:0", "t1": "node0/g:1", "t2": "node0/g:2"},))
    assert export_plan(staged, "vllm", topo, layers)["pipeline_parallel_size"] == 3
    for framework in ("vllm", "megatron"):  # the same stages with the last on a CPU: no framework runs it
        with pytest.raises(ExportError, match="a stage runs on CPU device node0/g:2: the frameworks run GPU stages"):
            export_plan(staged, framework, topo, layers, frozenset({"node0/g:2"}))


def test_device_map_refuses_group_plans_and_launch_runs_them_on_the_members():
    from llm_planner.core.plan import PlanError, hf_device_map
    from llm_planner.launch.launch_types import LaunchError
    from llm_planner.launch.ranks import rank_entries

    problem = build_problem(tp_chain(0), gpu_cluster(2), max_tp=2)
    plan = solve(problem, SolveOptions(**EXACT))
    on_group = plan if any("-" in d.split(":")[-1] for d in plan.assignment.values()) else None
    from dataclasses import replace

    on_group = on_group or replace(plan, shard_assignments=({t: "node0/g:0-1" for t in plan.assignment},))
    with pytest.raises(PlanError, match="tensor-parallel groups"):
        hf_device_map(on_group, {t: t for t in plan.assignment}, set())
    # launch runs a group on its members' ranks (tests/test_runtime_tp_mpi.py), so it needs their hosts
    with pytest.raises(LaunchError, match=r"nodes\[0\].hostname: missing .* \(device node0/g:0\)"):
        rank_entries(on_group, problem.cluster, "plan.yaml")


# -- activation workspace -------------------------------------------------------------------


def test_workspace_is_reserved_and_checked():
    """A task with a large workspace: the solver leaves room for it, the verifier counts what runs."""
    from dataclasses import replace

    base = tp_chain(0, n=2)
    big = replace(base.tasks[1], workspace_bytes_per_sample=5 * GB)
    graph = TaskGraph(name="ws", tasks=(base.tasks[0], big), edges=base.edges).validate()
    problem = build_problem(graph, gpu_cluster(1, mem=20 * GB, cpu=True), batch_size=2)
    gpu = problem.device_names.index("node0/g:0")
    assert problem.usable[gpu] - problem.mem_capacity[gpu] == pytest.approx(10 * GB)  # 5 GB x 2 samples
    plan = solve(problem, SolveOptions(**EXACT))
    report = verify_plan(plan, problem)
    assert report.ok
    on_gpu = [t for t, d in plan.assignment.items() if d == "node0/g:0"]
    if "t1" in on_gpu:
        assert report.memory_per_device_bytes["node0/g:0"] >= 10 * GB
    squeezed = replace(problem, mem_usable=problem.usable.copy())
    squeezed.mem_usable[gpu] = 1 * GB
    all_gpu = replace(plan, shard_assignments=({"t0": "node0/g:0", "t1": "node0/g:0"},))
    assert any("needs" in v and "node0/g:0" in v for v in verify_plan(all_gpu, squeezed).violations)


def test_decoder_workspace_is_the_widest_point():
    graph = build_decoder_graph(
        preset_config("gpt3-175b"), phase="prefill", seq_len=2048, granularity="sublayer", dtype="fp16"
    )
    h = 12288
    assert graph.task("block.0.mlp").workspace_bytes_per_sample == pytest.approx(2048 * (h + 4 * h + 4 * h) * 2)
    assert graph.task("block.0.attn").workspace_bytes_per_sample == pytest.approx(2048 * (h + 2 * h + 2 * h) * 2)


def test_verifier_names_a_group_the_cluster_cannot_form():
    from dataclasses import replace

    problem = build_problem(tp_chain(0), gpu_cluster(4), max_tp=4)
    plan = solve(problem, SolveOptions(solver="milp-split"))
    misaligned = replace(plan, shard_assignments=({"t0": "node0/g:1-2", "t1": "node0/g:1-2", "t2": "node0/g:1-2"},))
    report = verify_plan(misaligned, problem)
    assert any("cannot form" in v and "aligned" in v for v in report.violations)


def test_a_plan_file_with_a_group_the_cluster_cannot_form_is_bad_input(tmp_path, capsys):
    import yaml

    from llm_planner.cli.main import main

    out = tmp_path / "plan.yaml"
    assert main(["plan", *FOUR, "--solver", "megatron", "--no-baselines", "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    for shard in data["shards"]:
        shard["assignment"]["lm_head"] = ["server/a100-80g:1", "server/a100-80g:2"]  # consecutive, not aligned
    data["assignment"]["lm_head"] = data["shards"][0]["assignment"]["lm_head"]  # the top-level one is shard 0's
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 2
    err = capsys.readouterr().err
    assert "shards[0].assignment.lm_head" in err and "aligned" in err
