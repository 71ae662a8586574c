"""The launcher without running MPI: dry runs, the rank table and hostfile, and every refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from runtime_fixtures import LOCALHOST, REPO, decoder_plan, graph_plan, save_config, tiny_gpt2

from llm_planner.launch.launch_text import describe_result, format_rank_table
from llm_planner.launch.launch_types import LaunchError
from llm_planner.launch.plan_launch import hostfile_text, launch_plan, parse_prompt_ids
from llm_planner.runtime.table import RankTableError, load_rank_table

UNEVEN = {"embed": 0, "block.0": 1, "block.3": 2, "lm_head": 3}  # embed | block.0-2 | block.3 + final_norm | lm_head


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return save_config(tiny_gpt2(), tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def plan4(gpt2_dir, tmp_path_factory) -> Path:
    return decoder_plan(tmp_path_factory.mktemp("plan") / "plan.yaml", gpt2_dir, [UNEVEN])


def test_dry_run_writes_hostfile_and_rank_table_and_builds_the_command(plan4, tmp_path):
    result = launch_plan(plan4, dry_run=True, workdir=str(tmp_path / "w"), prompt_ids=[[1, 2, 3]], max_new_tokens=4)
    assert result.ok and result.returncode is None and result.report is None
    mpiexec = Path(sys.executable).parent / "mpiexec"
    assert result.command[:5] == (str(mpiexec), "-f", result.hostfile_path, "-n", "4")
    assert result.command[5:] == (sys.executable, "-m", "mpi4py", "-m", "llm_planner.runtime", result.rank_table_path)
    assert Path(result.hostfile_path).read_text() == "localhost:4\n"
    table = load_rank_table(result.rank_table_path)
    assert table == result.rank_table
    assert [(r.rank, r.device, r.tasks["0"]) for r in table.ranks] == [
        (0, "localhost/cpu-core:0", ["embed"]),
        (1, "localhost/cpu-core:1", ["block.0", "block.1", "block.2"]),
        (2, "localhost/cpu-core:2", ["block.3", "final_norm"]),
        (3, "localhost/cpu-core:3", ["lm_head"]),
    ]
    assert table.run.workload == "decoder" and table.run.prompt_ids == [[1, 2, 3]] and table.run.max_new_tokens == 4
    assert Path(table.run.report_path) == (tmp_path / "w" / "run.json").resolve()
    text = format_rank_table(table)
    assert "block.0, block.1, block.2" in text.splitlines()[2]
    assert (tmp_path / "w" / "command.txt").read_text().strip() == result.command_line
    assert describe_result(result) == f"{result.command_line}\n\n{text}"


def test_workdir_defaults_next_to_the_report(plan4, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = launch_plan(plan4, dry_run=True, report_path="out/run.json")
    assert Path(result.workdir) == (tmp_path / "out" / "plan.launch").resolve()
    assert Path(result.report_path) == (tmp_path / "out" / "run.json").resolve()
    assert Path(launch_plan(plan4, dry_run=True).workdir) == (tmp_path / "launch" / "plan").resolve()


def test_default_prompts_are_one_per_planned_sample_and_seeded(plan4, tmp_path):
    a = launch_plan(plan4, dry_run=True, workdir=str(tmp_path / "a")).rank_table.run.prompt_ids
    b = launch_plan(plan4, dry_run=True, workdir=str(tmp_path / "b")).rank_table.run.prompt_ids
    assert a == b and len(a) == 1 and len(a[0]) == 8 and all(0 <= t < 128 for t in a[0])


def test_a_rank_count_other_than_the_devices_used_is_refused_before_start(plan4, tmp_path):
    with pytest.raises(LaunchError, match="the plan uses 4 devices, so it runs on 4 ranks, not 3"):
        launch_plan(plan4, num_ranks=3, workdir=str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_a_node_without_hostname_is_refused(gpt2_dir, tmp_path):
    data = yaml.safe_load(LOCALHOST.read_text())
    del data["nodes"][0]["hostname"]
    cluster = tmp_path / "nohost.yaml"
    cluster.write_text(yaml.safe_dump(data))
    plan = decoder_plan(tmp_path / "p.yaml", gpt2_dir, [UNEVEN], cluster=cluster)
    with pytest.raises(LaunchError, match=r"nohost.yaml: nodes\[0\].hostname: missing for node 'localhost'"):
        launch_plan(plan, dry_run=True, workdir=str(tmp_path / "w"))


def test_more_ranks_than_slots_is_refused(gpt2_dir, tmp_path):
    data = yaml.safe_load(LOCALHOST.read_text())
    data["nodes"][0]["slots"] = 2
    cluster = tmp_path / "slots.yaml"
    cluster.write_text(yaml.safe_dump(data))
    plan = decoder_plan(tmp_path / "p.yaml", gpt2_dir, [UNEVEN], cluster=cluster)
    with pytest.raises(
        LaunchError, match=r"nodes\[0\].slots: node 'localhost' has 2 MPI slots but the plan puts 4 ranks on it"
    ):
        launch_plan(plan, dry_run=True, workdir=str(tmp_path / "w"))


def test_two_nodes_give_one_hostfile_line_each_and_ranks_grouped_by_host(gpt2_dir, tmp_path):
    data = yaml.safe_load(LOCALHOST.read_text())
    data["nodes"] = [{"name": "srv", "count": 2, "hostname": "srv{i}.example", "devices": {"cpu-core": 2}}]
    data["links"]["inter_node"] = {"bw_bytes_per_s": "1 GB/s"}
    cluster = tmp_path / "two.yaml"
    cluster.write_text(yaml.safe_dump(data))
    layout = {"embed": 2, "block.0": 0, "block.2": 3, "lm_head": 1}  # srv-1, srv-0, srv-1, srv-0
    plan = decoder_plan(tmp_path / "p.yaml", gpt2_dir, [layout], cluster=cluster)
    table = launch_plan(plan, dry_run=True, workdir=str(tmp_path / "w")).rank_table
    assert hostfile_text(table) == "srv0.example:2\nsrv1.example:2\n"
    assert [(r.rank, r.hostname, r.device) for r in table.ranks] == [
        (0, "srv0.example", "srv-0/cpu-core:0"),
        (1, "srv0.example", "srv-0/cpu-core:1"),
        (2, "srv1.example", "srv-1/cpu-core:0"),
        (3, "srv1.example", "srv-1/cpu-core:1"),
    ]


def test_gpu_devices_map_to_cuda_indices_in_node_order(gpt2_dir, tmp_path):
    cluster = REPO / "cluster_specs" / "cpu-two-gpus.yaml"
    plan = decoder_plan(tmp_path / "p.yaml", gpt2_dir, [{"embed": 0, "block.1": 2, "block.3": 1}], cluster=cluster)
    table = launch_plan(plan, dry_run=True, workdir=str(tmp_path / "w")).rank_table
    assert [(r.device, r.device_type, r.gpu_index) for r in table.ranks] == [
        ("workstation/epyc-7543:0", "cpu", None),
        ("workstation/a100-40g-pcie:0", "gpu", 0),
        ("workstation/t4:0", "gpu", 1),
    ]
    assert "cuda:1" in format_rank_table(table)


def test_a_checkpoint_of_another_model_is_refused(plan4, tmp_path):
    other = save_config(tiny_gpt2(n_layer=6), tmp_path / "other")
    with pytest.raises(LaunchError, match=f"another model than checkpoint {other}: num_layers: plan 4 vs checkpoint 6"):
        launch_plan(plan4, dry_run=True, checkpoint=str(other), workdir=str(tmp_path / "w"))
    with pytest.raises(LaunchError, match="has no config.json"):
        launch_plan(plan4, dry_run=True, checkpoint=str(tmp_path), workdir=str(tmp_path / "w"))


def test_a_plan_whose_tasks_are_not_the_models_is_refused(plan4, gpt2_dir, tmp_path):
    bad = yaml.safe_load(plan4.read_text())
    bad["inputs"]["model"]["name"] = str(
        save_config(tiny_gpt2(n_layer=5), tmp_path / "five")
    )  # a model with one more block
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(
        LaunchError,
        match=r"shards\[0\]: the plan does not match the model \(5 decoder blocks\): missing tasks \['block.4'\]",
    ):
        launch_plan(path, dry_run=True, workdir=str(tmp_path / "w"))
    sub = decoder_plan(tmp_path / "sub.yaml", gpt2_dir, [{"embed": 0}], granularity="sublayer")
    with pytest.raises(LaunchError, match="'block' granularity plans only"):
        launch_plan(sub, dry_run=True, workdir=str(tmp_path / "w"))


def test_decoder_families_the_runtime_cannot_build_are_refused(tmp_path):
    from transformers import OPTConfig

    opt = save_config(
        OPTConfig(
            num_hidden_layers=2,
            hidden_size=32,
            ffn_dim=64,
            num_attention_heads=4,
            vocab_size=128,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
        ),
        tmp_path / "opt",
    )
    plan = decoder_plan(tmp_path / "p.yaml", opt, [{"embed": 0}])
    with pytest.raises(LaunchError, match="model type 'opt': the runtime runs gpt2, llama, qwen3 decoders"):
        launch_plan(plan, dry_run=True, workdir=str(tmp_path / "w"))


def test_graph_plans_run_the_graph_workload_and_must_name_the_models_tasks(tmp_path):
    plan = graph_plan(tmp_path / "rwnn.yaml", "rwnn-ws-2x6", batch=3, num_devices=3, shards=2)
    table = launch_plan(plan, dry_run=True, workdir=str(tmp_path / "w")).rank_table
    assert table.run.workload == "graph" and table.world_size == 3 and table.run.prompt_ids == []
    assert [sorted(r.tasks) for r in table.ranks] == [["0", "1"]] * 3
    bad = yaml.safe_load(plan.read_text())
    bad["shards"][1]["assignment"]["s0_n9"] = bad["shards"][1]["assignment"].pop("s0_n5")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(
        LaunchError,
        match=r"shards\[1\]: the plan's tasks are not the model's \(missing \['s0_n5'\], unknown \['s0_n9'\]\)",
    ):
        launch_plan(path, dry_run=True, workdir=str(tmp_path / "w"))
    for flags in ({"checkpoint": str(tmp_path)}, {"prompt_ids": [[5, 6]]}, {"max_new_tokens": 4}):
        with pytest.raises(LaunchError, match=r"a decoder's; .* plans 'rwnn-ws-2x6'"):
            launch_plan(plan, dry_run=True, workdir=str(tmp_path / "w"), **flags)


def test_plans_from_graph_files_cannot_be_launched(plan4, tmp_path):
    data = yaml.safe_load(plan4.read_text())
    data["inputs"]["model"] = {"graph": "some.json"}
    path = tmp_path / "graph.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        LaunchError, match=r"inputs.model: plans made from a graph file \(\S*/some.json\) describe no runnable model"
    ):
        launch_plan(path, dry_run=True, workdir=str(tmp_path / "w"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt_ids": [[1, 200]]}, r"prompt_ids\[0\]: token ids \[200\] are outside the vocabulary \[0, 128\)"),
        ({"prompt_ids": [[]]}, r"prompt_ids\[0\]: empty prompt"),
        ({"prompt_ids": [[1] * 60], "max_new_tokens": 8}, "60 prompt \\+ 8 new tokens exceed the model's 64 positions"),
        ({"max_new_tokens": 0}, "--max-new-tokens must be >= 1"),
        ({"timeout_s": 0}, "timeout must be > 0"),
        ({"prompt_ids": [[1], [2], [3]]}, r"prompt_ids: 3 prompts, but the plan runs a batch of 1: give 1 prompts"),
        ({"fail_rank": 4}, r"fail_rank 4 is not a rank of this run \(0..3\)"),
        ({"warmup": -1}, "warmup must be >= 0 untimed runs, got -1"),
    ],
)
def test_bad_run_options_are_refused(plan4, tmp_path, kwargs, message):
    with pytest.raises(LaunchError, match=message):
        launch_plan(plan4, dry_run=True, workdir=str(tmp_path / "w"), **kwargs)


def test_warmup_runs_go_into_the_rank_table_and_default_to_none_without_measure(plan4, tmp_path):
    from llm_planner.cli import main as cli

    assert launch_plan(plan4, dry_run=True, workdir=str(tmp_path / "a")).rank_table.run.warmup == 0
    assert (
        load_rank_table(
            launch_plan(plan4, dry_run=True, workdir=str(tmp_path / "b"), warmup=3).rank_table_path
        ).run.warmup
        == 3
    )
    assert cli.main(["launch", str(plan4), "--dry-run", "--warmup", "2", "--workdir", str(tmp_path / "c")]) == 0
    assert load_rank_table(tmp_path / "c" / "rank_table.json").run.warmup == 2
    assert cli.main(["launch", str(plan4), "--dry-run", "--workdir", str(tmp_path / "d")]) == 0
    assert load_rank_table(tmp_path / "d" / "rank_table.json").run.warmup == 0
    data = json.loads((tmp_path / "d" / "rank_table.json").read_text())
    data["run"]["warmup"] = -2
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(RankTableError, match=r"bad.json: run.warmup: expected a whole number of runs >= 0, got -2"):
        load_rank_table(tmp_path / "bad.json")


def test_parse_prompt_ids():
    assert parse_prompt_ids("464,3290,318") == [464, 3290, 318]
    with pytest.raises(LaunchError, match="expected comma-separated token ids"):
        parse_prompt_ids("464;3290")
    with pytest.raises(LaunchError, match="no token ids"):
        parse_prompt_ids(",")


def test_rank_table_errors_name_the_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "llm_planner.rank_table", "version": 1, "ranks": [{"rank": 1}], "run": {}}))
    with pytest.raises(RankTableError, match="t.json: malformed rank table"):
        load_rank_table(path)
    path.write_text("{}")
    with pytest.raises(RankTableError, match="t.json: not a rank table"):
        load_rank_table(path)


def test_a_decoder_dry_run_imports_neither_mpi4py_nor_torch(plan4, tmp_path):
    code = (
        "import sys\nfrom llm_planner.launch.plan_launch import launch_plan\n"
        f"assert launch_plan({str(plan4)!r}, dry_run=True, workdir={str(tmp_path)!r}).ok\n"
        "bad = [m for m in ('mpi4py', 'torch', 'transformers') if m in sys.modules]\nassert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_run_with_more_ranks_than_cores_on_a_host_is_flagged():
    from llm_planner.launch.launch_text import oversubscription_notes

    def rank(i, host, wait, sharing, cores):
        return {
            "rank": i,
            "device": f"{host}/cpu-core:{i}",
            "wait": wait,
            "ranks_on_host": sharing,
            "host_cores": cores,
        }

    ranks = [rank(0, "a", "sleep", 4, 2), rank(1, "a", "sleep", 4, 2), rank(2, "b", "spin", 1, 8)]
    notes = oversubscription_notes(ranks)
    assert len(notes) == 1 and notes[0].startswith("warning: node a ran 4 ranks on 2 cores")
    assert oversubscription_notes([rank(0, "b", "spin", 1, 8)]) == []
    assert (
        oversubscription_notes([{"rank": 0, "device": "a/cpu:0"}]) == []
    )  # reports written before ranks said how they waited


def test_a_graph_run_that_held_more_batches_than_the_plan_keeps_in_flight_says_so():
    from llm_planner.launch.launch_text import held_batches_notes

    ranks = [{"rank": 0, "most_batches_held": 3}, {"rank": 1, "most_batches_held": 5}]
    (note,) = held_batches_notes({"plan_batches_in_flight": 2, "ranks": ranks})
    assert note.startswith("note: a rank held the values of 5 batches at once, more than the 2 in flight")
    assert held_batches_notes({"plan_batches_in_flight": 5, "ranks": ranks}) == []
    assert held_batches_notes({"ranks": ranks}) == []  # a decoder run, or a report from before the count


def test_an_error_file_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """Both ranks' watchdogs fire at once and one's MPI_Abort can kill the other mid-write: the
    launcher then must not find an empty error file and report it as the run's error."""
    from types import SimpleNamespace

    from llm_planner.runtime import rank as rank_module

    table = SimpleNamespace(
        world_size=1, ranks=[SimpleNamespace(device="localhost/cpu-core:0")], run=SimpleNamespace(workdir=str(tmp_path))
    )

    def killed(src, dst):
        raise OSError("killed before the rename")

    with monkeypatch.context() as patch:
        patch.setattr(rank_module.os, "replace", killed)
        rank_module._write_error(table, 0, RuntimeError("boom"))
    assert not rank_module.error_path(tmp_path, 0).exists()
    rank_module._write_error(table, 0, RuntimeError("boom"))
    assert (
        rank_module.error_path(tmp_path, 0).read_text().startswith("rank 0 (localhost/cpu-core:0): RuntimeError: boom")
    )


def test_the_summary_names_units_the_weights_and_a_gpu_that_ran_on_the_cpu(plan4, tmp_path):
    dry = launch_plan(plan4, dry_run=True, workdir=str(tmp_path / "w"))
    report = {
        "status": "ok",
        "predicted_s": 0.002,
        "measured_s": 0.0025,
        "unit": "s/sample",
        "measured_what": "seconds per sample: ...",
        "wall_s": 1.5,
        "tokens_per_s": 10.0,
        "tokens": [[1, 2]],
        "weights": "seeded random",
        "batches": 2,
        "predicted_samples_per_s": 500.0,
        "measured_samples_per_s": 400.0,
        "gpu_fell_back_to_cpu": ["n/a100:0"],
        "ranks": [],
    }
    text = describe_result(replace(dry, dry_run=False, returncode=0, report=report, duration_s=2.0))
    assert "ran 4 ranks in 2.0 s" in text
    assert "measured 2.5 ms per sample, predicted 2 ms per sample (+25.0%)" in text
    assert "400.0 samples/s" in text and "(predicted 500.0), 2 batches in flight" in text
    assert "whole generation: 1.5 s" in text and "weights: seeded random, not a checkpoint" in text
    assert "warning: n/a100:0 is a GPU but CUDA is not available on its host: its rank ran on the CPU" in text
    one = replace(
        dry,
        dry_run=False,
        returncode=0,
        report={**report, "unit": "s"},
        rank_table=replace(dry.rank_table, ranks=dry.rank_table.ranks[:1]),
    )
    assert "ran 1 rank in" in describe_result(one) and "measured 2.5 ms, predicted 2 ms (+25.0%)" in describe_result(
        one
    )
