"""Measured costs: the profile file, its task keys, the cost model preferring profiled values,
`plan --profile` and `verify` of such plans, and real profiling of a tiny GPT with the runtime's code
(locally, and under MPI with the ping-pong of links)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.core.plan import PlanError, save_plan
from llm_planner.core.spec import load_cluster
from llm_planner.cost import measured
from llm_planner.cost import profile as prof
from llm_planner.graph.ir import Edge, Task, TaskGraph
from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.placement.inputs import problem_from_inputs
from llm_planner.placement.problem import build_problem
from llm_planner.placement.schedule import make_plan
from llm_planner.placement.verify_file import verify_plan_file

REPO = Path(__file__).resolve().parents[1]
LOCALHOST = REPO / "cluster_specs" / "localhost-cpu.yaml"
TWO_GPUS = REPO / "cluster_specs" / "cpu-two-gpus.yaml"
GPT2 = ModelSpec(name="gpt2", seq_len=128, dtype="fp32")


def _timing(task: str, fixed: float, slope: float) -> prof.TaskTiming:
    sizes = [1, 2, 4]
    return prof.task_timing(task, sizes, [fixed + slope * b for b in sizes], 5)


def _profile(tasks: dict, links: dict | None = None) -> prof.Profile:
    return prof.Profile(
        cluster="test",
        model={"name": "gpt2"},
        settings={"batch_sizes": [1, 2, 4]},
        devices={k: [f"n/{k}:0"] for k in tasks},
        tasks=tasks,
        links=links or {},
    )


def _key(graph: TaskGraph, name: str) -> str:
    key = measured.task_key(graph, graph.task(name))
    assert key is not None
    return key


# -- fits ---------------------------------------------------------------------------


def test_affine_fit_recovers_exact_line_and_stays_non_negative():
    fixed, slope = prof.fit_affine([1, 2, 4, 8], [0.002 + 0.0005 * b for b in (1, 2, 4, 8)])
    assert fixed == pytest.approx(0.002, rel=1e-9) and slope == pytest.approx(0.0005, rel=1e-9)
    fixed, slope = prof.fit_affine([1, 2, 4], [3.0, 2.0, 1.0])  # falling times: no negative slope
    assert slope == 0.0 and fixed == pytest.approx(2.0)
    fixed, slope = prof.fit_affine([1, 2], [1.0, 3.0])  # a line through a negative intercept: clamped at 0
    assert fixed == 0.0 and slope > 0
    with pytest.raises(ValueError, match="two distinct"):
        prof.fit_affine([2, 2], [1.0, 1.0])


def test_link_fit_gives_latency_and_bandwidth():
    sizes = [1024, 65536, 1 << 20]
    link = prof.link_timing(("a", "b"), sizes, [20e-6 + n / 5e9 for n in sizes], 10)
    assert link.latency_s == pytest.approx(20e-6, rel=1e-6)
    assert link.bw_bytes_per_s == pytest.approx(5e9, rel=1e-6)


# -- the file -----------------------------------------------------------------------


def test_profile_written_and_read_back(tmp_path):
    link = prof.link_timing(("localhost/cpu-core:0", "localhost/cpu-core:1"), [1024, 1 << 20], [3e-5, 4e-4], 20)
    original = _profile(
        {
            "cpu-core": {"k/block": _timing("block.0", 1e-3, 2e-4), "k/embed": _timing("embed", 1e-4, 0.0)},
            "t4": {"k/block": _timing("block.0", 5e-5, 1e-6)},
        },
        {"localhost:cpu-core<->cpu-core": link},
    )
    path = tmp_path / "profile.yaml"
    prof.save_profile(original, path)
    back = prof.load_profile(path)
    assert back == original
    data = yaml.safe_load(path.read_text())
    assert data["format"] == "llm_planner.cost.profile" and data["version"] == 1
    entry = data["device_kinds"]["cpu-core"]["k/block"]
    assert entry["batch_sizes"] == [1, 2, 4] and len(entry["median_s"]) == 3 and entry["repetitions"] == 5
    assert entry["fixed_s"] == pytest.approx(1e-3) and entry["per_sample_s"] == pytest.approx(2e-4)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(format="something"), "not a profile file"),
        (lambda d: d.update(version=7), "version: unsupported profile version 7"),
        (lambda d: d.update(version=1.0), "version: unsupported profile version 1.0"),
        (lambda d: d.update(colour="red"), "colour: unknown key"),
        (
            lambda d: d["device_kinds"]["cpu"]["k"].update(fixed_s=-1.0),
            r"device_kinds\.cpu\.k\.fixed_s: must be a finite number >= 0",
        ),
        (
            lambda d: d["device_kinds"]["cpu"]["k"].update(median_s=[1.0]),
            r"device_kinds\.cpu\.k\.median_s: has 1 values for 3 batch sizes",
        ),
        (
            lambda d: d["device_kinds"]["cpu"]["k"].update(batch_sizes=[1, 0, 2]),
            r"batch_sizes\[1\]: expected a positive int",
        ),
        (
            lambda d: d["device_kinds"]["cpu"]["k"].pop("per_sample_s"),
            r"device_kinds\.cpu\.k\.per_sample_s: missing required field",
        ),
        (lambda d: d["device_kinds"].update(cpu=[1, 2]), r"device_kinds\.cpu: expected a mapping"),
        (
            lambda d: d["links"].update(
                x={
                    "devices": ["a"],
                    "latency_s": 0,
                    "bw_bytes_per_s": 1,
                    "sizes_bytes": [],
                    "median_s": [],
                    "repetitions": 1,
                }
            ),
            r"links\.x\.devices: expected two device names",
        ),
    ],
)
def test_bad_profile_files_name_file_and_field(tmp_path, edit, message):
    data = prof.profile_to_dict(_profile({"cpu": {"k": _timing("block.0", 1e-3, 1e-4)}}))
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(prof.ProfileError, match=message) as info:
        prof.load_profile(path)
    assert str(path) in str(info.value)


def test_unreadable_profile_file_is_a_clear_error(tmp_path):
    with pytest.raises(prof.ProfileError, match="cannot read"):
        prof.load_profile(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(prof.ProfileError, match="not a profile file"):
        prof.load_profile(tmp_path / "list.yaml")


# -- task keys ----------------------------------------------------------------------


def test_decoder_blocks_share_one_key_and_the_key_tracks_what_changes_the_time():
    graph = build_model_graph(GPT2)
    blocks = {_key(graph, f"block.{i}") for i in range(12)}
    assert len(blocks) == 1
    keys = {_key(graph, t.name) for t in graph.tasks}
    assert len(keys) == 4  # embed, block, final_norm, lm_head
    for change in ({"seq_len": 64}, {"phase": "prefill"}, {"dtype": "fp16"}, {"name": "gpt2-medium"}):
        other = build_model_graph(dataclasses.replace(GPT2, **change))
        assert _key(other, "block.0") != _key(graph, "block.0"), change
    sub = build_model_graph(dataclasses.replace(GPT2, granularity="sublayer"))
    assert _key(sub, "block.3.attn").endswith("/attn") and _key(sub, "block.3.mlp").endswith("/mlp")
    assert _key(sub, "block.3.attn") == _key(sub, "block.0.attn")
    assert _key(sub, "embed") == _key(graph, "embed")  # granularity does not change the embedding


def test_graph_builder_tasks_have_one_key_each_and_plain_graphs_none():
    graph = build_model_graph(ModelSpec(name="rwnn-ws-3x32", dtype="fp32"))
    keys = [measured.task_key(graph, t) for t in graph.tasks]
    assert None not in keys and len(set(keys)) == len(keys)
    plain = TaskGraph(name="g", tasks=(Task(name="a"), Task(name="b")), edges=(Edge(src="a", dst="b"),))
    assert measured.task_key(plain, plain.tasks[0]) is None


# -- the cost model prefers profiled values -----------------------------------------


def test_cost_model_prefers_profiled_values_and_falls_back_to_the_roofline():
    graph, cluster = build_model_graph(GPT2), load_cluster(TWO_GPUS)
    roofline = build_problem(graph, cluster, batch_size=4, dtype="fp32")
    block, head = _key(graph, "block.0"), _key(graph, "lm_head")
    profile = _profile(
        {
            "epyc-7543": {block: _timing("block.0", 3e-3, 7e-4), head: _timing("lm_head", 1e-3, 2e-4)},
            "t4": {block: _timing("block.0", 2e-4, 1e-5)},
        }
    )
    problem = build_problem(graph, cluster, batch_size=4, dtype="fp32", profile=profile)
    kinds = [d.kind for d in problem.devices]
    cpu, a100, t4 = kinds.index("epyc-7543"), kinds.index("a100-40g-pcie"), kinds.index("t4")
    for b in (1, 3, 4):
        for i in (graph.index("block.0"), graph.index("block.11")):
            assert problem.task_time(i, cpu, b) == pytest.approx(3e-3 + 7e-4 * b)
            assert problem.task_time(i, t4, b) == pytest.approx(2e-4 + 1e-5 * b)
            assert problem.task_time(i, a100, b) == roofline.task_time(i, a100, b)  # no A100 entry: roofline
        assert problem.task_time(graph.index("lm_head"), cpu, b) == pytest.approx(1e-3 + 2e-4 * b)
        assert problem.task_time(graph.index("embed"), cpu, b) == roofline.task_time(graph.index("embed"), cpu, b)
    assert problem.task_time(graph.index("block.0"), cpu, 0) == 0.0
    coverage = measured.profile_coverage(graph, cluster, profile)
    assert len(coverage.profiled) == 12 + 1 + 12
    fallback = coverage.fallback_tasks()
    assert set(fallback["a100-40g-pcie"]) == {t.name for t in graph.tasks}
    assert set(fallback["epyc-7543"]) == {"embed", "final_norm"} and set(fallback["t4"]) == {
        "embed",
        "final_norm",
        "lm_head",
    }
    assert coverage.links_fallback == (
        "workstation:a100-40g-pcie<->epyc-7543",
        "workstation:a100-40g-pcie<->t4",
        "workstation:epyc-7543<->t4",
    )


def test_measured_links_replace_the_spec_for_their_class_only():
    graph, cluster = build_model_graph(GPT2), load_cluster(TWO_GPUS)
    roofline = build_problem(graph, cluster, batch_size=2, dtype="fp32")
    names = [d.kind for d in roofline.devices]
    cpu, a100, t4 = names.index("epyc-7543"), names.index("a100-40g-pcie"), names.index("t4")
    link = prof.link_timing(("x", "y"), [1000, 2000], [1e-4 + 1000 / 1e9, 1e-4 + 2000 / 1e9], 5)
    problem = build_problem(
        graph, cluster, batch_size=2, dtype="fp32", profile=_profile({}, {"workstation:epyc-7543<->t4": link})
    )
    e = 3
    for k, l in ((cpu, t4), (t4, cpu)):
        assert problem.transfer_time(e, k, l, 2) == pytest.approx(1e-4 + 2 * graph.edges[e].bytes_per_sample / 1e9)
    assert problem.transfer_time(e, cpu, a100, 2) == roofline.transfer_time(e, cpu, a100, 2)
    assert problem.transfer_time(e, t4, t4, 2) == 0.0


# -- plans made with a profile --------------------------------------------------------


def _gpt_profile(tmp_path: Path, fixed: float = 2e-3) -> Path:
    graph = build_model_graph(GPT2)
    tasks = {_key(graph, t.name): _timing(t.name, fixed, 1e-4) for t in graph.tasks}
    path = tmp_path / "profile.yaml"
    prof.save_profile(_profile({"cpu-core": tasks}), path)
    return path


def test_plan_records_the_profile_and_verify_rebuilds_its_costs(tmp_path):
    path = _gpt_profile(tmp_path)
    problem = problem_from_inputs(
        cluster_path=str(LOCALHOST), model=GPT2, batch_size=2, max_shards=1, profile_path=str(path)
    )
    assert problem.inputs.profile == str(path) and len(problem.inputs.profile_sha256) == 64
    plan = make_plan(
        problem, [2], [[0] * problem.num_tasks], solver="test", status="heuristic", started_at=0.0, lower_bound_s=0.0
    )
    assert plan.objective_s == pytest.approx(
        problem.num_tasks * (2e-3 + 2e-4)
    )  # every task from the profile, one device
    save_plan(plan, tmp_path / "plan.yaml")
    assert verify_plan_file(tmp_path / "plan.yaml").ok
    _gpt_profile(tmp_path, fixed=5e-3)  # the profile changed since: the plan no longer matches it
    with pytest.raises(PlanError, match="plan.yaml: inputs: .*profile file changed"):
        verify_plan_file(tmp_path / "plan.yaml")


def test_plan_command_says_which_tasks_fell_back(tmp_path, capsys):
    graph = build_model_graph(GPT2)
    path = tmp_path / "profile.yaml"
    prof.save_profile(_profile({"cpu-core": {_key(graph, "block.0"): _timing("block.0", 1e-3, 1e-4)}}), path)
    out = tmp_path / "plan.yaml"
    args = [
        "plan",
        "--cluster",
        str(LOCALHOST),
        "--model",
        "gpt2",
        "--seq-len",
        "128",
        "--dtype",
        "fp32",
        "--no-baselines",
    ]
    assert main([*args, "--profile", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "measured costs for 12 of 15 (task, device kind) pairs" in printed
    assert "cost model on cpu-core (not in the profile): embed, final_norm, lm_head" in printed
    recorded = yaml.safe_load(out.read_text())["inputs"]["profile"]
    assert (out.parent / recorded).resolve() == path.resolve()  # recorded relative to the plan's folder
    assert main(["verify", str(out)]) == 0
    (tmp_path / "bad.yaml").write_text(
        "format: llm_planner.cost.profile\nversion: 1\ncluster: c\ndevice_kinds: {cpu-core: {k: {task: x}}}\n"
    )
    assert main([*args, "--profile", str(tmp_path / "bad.yaml"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.replace("\n", "")  # rich wraps long lines
    assert "bad.yaml: device_kinds.cpu-core.k.batch_sizes: missing required field" in err


# -- real profiling with the runtime's code -------------------------------------------


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    from runtime_fixtures import save_config, tiny_gpt2

    return save_config(tiny_gpt2(), tmp_path_factory.mktemp("model") / "gpt2")


def test_profile_device_times_every_distinct_decoder_task(tiny_gpt2_dir):
    import torch

    from llm_planner.runtime.profile_rank import ProfileOptions, profile_device

    options = ProfileOptions(batch_sizes=(1, 2), repetitions=2, warmup=1)
    runs: list[int] = []
    for granularity, roles in (
        ("block", {"embed", "block", "final_norm", "lm_head"}),
        ("sublayer", {"embed", "attn", "mlp", "final_norm", "lm_head"}),
    ):
        spec = ModelSpec(name=str(tiny_gpt2_dir), dtype="fp32", seq_len=16, granularity=granularity)
        graph = build_model_graph(spec)
        timings = profile_device(spec, graph, torch.device("cpu"), options, lambda what, n: runs.append(n))
        assert {key.rsplit("/", 1)[1] for key in timings} == roles
        assert set(timings) == {measured.task_key(graph, t) for t in graph.tasks}
        for t in timings.values():
            assert t.batch_sizes == (1, 2) and t.repetitions == 2
            assert all(0 < m < 1.0 for m in t.median_s)
            assert t.fixed_s + t.per_sample_s * 2 == pytest.approx(t.time_s(2)) and t.time_s(1) > 0
    assert sum(runs) == 2 * options.runs_per_device()


def test_prefill_profile_and_bad_options(tiny_gpt2_dir):
    import torch

    from llm_planner.runtime.profile_rank import (
        ProfileOptions,
        ProfileRunError,
        profile_device,
    )

    spec = ModelSpec(name=str(tiny_gpt2_dir), dtype="fp32", seq_len=8, phase="prefill")
    timings = profile_device(
        spec,
        build_model_graph(spec),
        torch.device("cpu"),
        ProfileOptions(batch_sizes=(1, 2), repetitions=1, warmup=0),
        lambda what, n: None,
    )
    assert all("/prefill:8/" in key for key in timings) and len(timings) == 4
    with pytest.raises(ProfileRunError, match="at least two distinct"):
        ProfileOptions(batch_sizes=(2, 2)).check()
    with pytest.raises(ProfileRunError, match="repetitions must be from 1 to 1,000"):
        ProfileOptions(repetitions=0).check()
    one = ModelSpec(name=str(tiny_gpt2_dir), dtype="fp32", seq_len=1)
    with pytest.raises(ProfileRunError, match="at least 2 tokens"):
        profile_device(one, build_model_graph(one), torch.device("cpu"), ProfileOptions(), lambda what, n: None)


def test_profile_command_writes_a_profile_that_plan_uses_entirely(tiny_gpt2_dir, tmp_path, capsys):
    out = tmp_path / "profile.yaml"
    model = ["--cluster", str(LOCALHOST), "--model", str(tiny_gpt2_dir), "--seq-len", "16", "--dtype", "fp32"]
    assert main(["profile", *model, "--batch-sizes", "1,2", "--repetitions", "2", "--warmup", "1", "-o", str(out)]) == 0
    assert "profile written to" in capsys.readouterr().out
    profile = prof.load_profile(out)
    assert profile.cluster == "localhost-cpu" and profile.devices == {"cpu-core": ["localhost/cpu-core:0"]}
    # the whole tasks, and a member's share on groups of 2 and 4 (the four cores of localhost-cpu)
    assert sorted(k.split("/")[-1] for k in profile.tasks["cpu-core"]) == sorted(
        f"{role}{tp}" for role in ("embed", "block", "final_norm", "lm_head") for tp in ("", "@tp2", "@tp4")
    )
    assert profile.settings["batch_sizes"] == [1, 2]
    assert main(["plan", *model, "--profile", str(out), "--no-baselines", "-o", str(tmp_path / "plan.yaml")]) == 0
    printed = capsys.readouterr().out
    assert "measured costs for 7 of 7 (task, device kind) pairs" in printed and "cost model on" not in printed
    assert main(["profile", *model, "--batch-sizes", "1,x", "-o", str(out)]) == 2
    assert main(["profile", "--model", "gpt2", "-o", str(out)]) == 2  # no cluster
    assert "profile needs --cluster" in capsys.readouterr().err
    for flag, value, says in (
        ("--batch-sizes", "1,99999999999", "sizes from 1 to 4,096"),
        ("--threads", "100000", "threads must be from 1 to 256"),
        ("--repetitions", "999999999999", "repetitions must be from 1 to 1,000"),
        ("--workdir", str(tmp_path / "w"), "--workdir applies to --mpi runs"),
    ):
        assert main(["profile", *model, flag, value, "-o", str(out)]) == 2, flag
        assert says in capsys.readouterr().err, flag


def test_local_profile_needs_a_node_on_this_host(tmp_path):
    from llm_planner.runtime.profile_rank import ProfileRunError, local_devices

    cluster = load_cluster(REPO / "cluster_specs" / "gpt3-six-servers.yaml")
    with pytest.raises(ProfileRunError, match="no node of cluster"):
        local_devices(cluster)
    first = cluster.devices()[0].node
    assert {d.node for d in local_devices(cluster, first)} == {first}
    with pytest.raises(ProfileRunError, match="no node named 'nowhere'"):
        local_devices(cluster, "nowhere")
    devices = local_devices(load_cluster(TWO_GPUS))
    assert [d.kind for d in devices] == ["epyc-7543", "a100-40g-pcie", "t4"]


@pytest.mark.mpi
def test_profile_under_mpi_measures_every_rank_and_the_link(tiny_gpt2_dir, tmp_path):
    from llm_planner.launch.profile_run import ProfileJob, spawn_mpi
    from llm_planner.runtime.profile_rank import ProfileOptions

    spec = (
        LOCALHOST.read_text()
        .replace("devices: {cpu-core: 4}", "devices: {cpu-core: 2}")
        .replace("slots: 4", "slots: 2")
    )
    cluster = tmp_path / "two-cores.yaml"
    cluster.write_text(spec)
    options = ProfileOptions(
        batch_sizes=(1, 2), repetitions=1, warmup=1, link_sizes_bytes=(1024, 1 << 16), link_repetitions=3
    )
    job = ProfileJob(
        cluster_path=str(cluster),
        model={"name": str(tiny_gpt2_dir), "dtype": "fp32", "seq_len": 16},
        output_path=str(tmp_path / "profile.yaml"),
        options=options,
    )
    profile = spawn_mpi(job, tmp_path / "work", timeout_s=150)
    assert profile.devices == {"cpu-core": ["localhost/cpu-core:0", "localhost/cpu-core:1"]}
    # the four tasks whole, a member's share alone, and the group of two as it runs them (collectives included)
    assert sorted(k.split("/")[-1] for k in profile.tasks["cpu-core"]) == sorted(
        f"{role}{tp}" for role in ("embed", "block", "final_norm", "lm_head") for tp in ("", "@tp2", "@group2")
    )
    link = profile.links["localhost:cpu-core<->cpu-core"]
    assert link.devices == ("localhost/cpu-core:0", "localhost/cpu-core:1") and link.sizes_bytes == (1024, 65536)
    assert all(0 < t < 1.0 for t in link.median_s) and link.bw_bytes_per_s > 0 and math.isfinite(link.latency_s)
    problem = problem_from_inputs(
        cluster_path=str(cluster),
        model=ModelSpec(name=str(tiny_gpt2_dir), dtype="fp32", seq_len=16),
        profile_path=job.output_path,
    )
    assert problem.transfer_time(0, 0, 1, 1) == pytest.approx(
        link.latency_s + problem.graph.edges[0].bytes_per_sample / link.bw_bytes_per_s
    )
    # the group of two: a member's measured share plus the measured all-reduces (one per block sublayer)
    reduce = profile.links["localhost:cpu-core<->cpu-core@all_reduce2"]
    grouped = problem_from_inputs(
        cluster_path=str(cluster),
        model=ModelSpec(name=str(tiny_gpt2_dir), dtype="fp32", seq_len=16),
        profile_path=job.output_path,
        max_tp=2,
    )
    block = next(i for i, t in enumerate(grouped.graph.tasks) if t.name == "block.0")
    task = grouped.graph.tasks[block]
    per_call = task.tp_allreduce_bytes_per_sample / 2  # the hidden states of one sample
    assert reduce.sizes_bytes == (per_call, 2 * per_call, 16 * per_call)  # at batch sizes 1 and 2, and 8x the largest
    assert [d.name for d in grouped.devices][2] == "localhost/cpu-core:0-1"
    joint = profile.tasks["cpu-core"][next(k for k in profile.tasks["cpu-core"] if k.endswith("/block@group2"))]
    assert grouped.task_time(block, 2, 1) == pytest.approx(joint.time_s(1))  # the group as it ran
    del profile.tasks["cpu-core"][next(k for k in profile.tasks["cpu-core"] if k.endswith("/block@group2"))]
    prof.save_profile(
        profile, tmp_path / "alone.yaml"
    )  # without it: the share timed alone, plus the measured all-reduces
    alone = problem_from_inputs(
        cluster_path=str(cluster),
        model=ModelSpec(name=str(tiny_gpt2_dir), dtype="fp32", seq_len=16),
        profile_path=str(tmp_path / "alone.yaml"),
        max_tp=2,
    )
    share = profile.tasks["cpu-core"][next(k for k in profile.tasks["cpu-core"] if k.endswith("/block@tp2"))]
    expected = share.time_s(1) + 2 * reduce.latency_s + task.tp_allreduce_bytes_per_sample / reduce.bw_bytes_per_s
    assert alone.task_time(block, 2, 1) == pytest.approx(expected)


def test_profile_module_imports_without_torch_or_mpi():
    import subprocess
    import sys

    code = (
        "import sys, llm_planner.cost.profile, llm_planner.runtime.profile_rank, llm_planner.launch.profile_run\n"
        "bad = [m for m in ('torch', 'mpi4py', 'transformers') if m in sys.modules]\nassert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_gpus_without_cuda_are_skipped_not_measured_on_the_cpu(tiny_gpt2_dir, capsys):
    import torch

    from llm_planner.launch.profile_run import ProfileJob, planned_runs, profile_local
    from llm_planner.runtime.profile_rank import ProfileOptions, torch_device_of

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: its GPUs would be measured")
    cluster = load_cluster(TWO_GPUS)
    assert [str(torch_device_of(cluster, d)) for d in cluster.devices()] == ["cpu", "None", "None"]
    options = ProfileOptions(batch_sizes=(1, 2), repetitions=1, warmup=0)
    job = ProfileJob(
        cluster_path=str(TWO_GPUS),
        model={"name": str(tiny_gpt2_dir), "dtype": "fp32", "seq_len": 8},
        output_path="unused",
        options=options,
    )
    runs: list[int] = []
    profile, skipped = profile_local(job, lambda what, n: runs.append(n))
    assert skipped == ["workstation/a100-40g-pcie:0", "workstation/t4:0"]
    assert set(profile.tasks) == {"epyc-7543"} and profile.environment["torch_devices"] == {
        "workstation/epyc-7543:0": "cpu"
    }
    assert sum(runs) == planned_runs(job) == 3 * options.runs_per_device()  # the bar reaches its end


def test_profiling_past_its_timeout_stops_mpiexec_and_every_process_it_started(tmp_path, monkeypatch):
    """A stand-in mpiexec that starts a child and hangs: past the timeout the profiler stops its
    whole process group (the plan launcher's start_mpiexec and stop_group), not mpiexec alone."""
    import stat
    import time

    from conftest import alive

    from llm_planner.launch import profile_run
    from llm_planner.launch.profile_run import ProfileJob, ProfileRunError, spawn_mpi

    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {tmp_path / 'child.pid'}\nwait\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(profile_run, "mpiexec_path", lambda: fake)
    job = ProfileJob(cluster_path=str(LOCALHOST), model={"name": "gpt2"}, output_path=str(tmp_path / "p.yaml"))
    with pytest.raises(ProfileRunError, match="exceeded its timeout of 1 s"):
        spawn_mpi(job, tmp_path / "work", timeout_s=1)
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 30  # a guard, not a speed check
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the process mpiexec started outlived the profiler's timeout"
