"""`llm-planner launch SERVING_PLAN` without running MPI: the dry run (rank table, command), the
serving spec the ranks read, and every refusal (exit 2, naming the file or flag)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from runtime_fixtures import LOCALHOST, TINY_MIXTRAL, save_config, tiny_gpt2, tiny_llama, tiny_mixtral
from serve_fixtures import dev, serving_plan

from llm_planner.cli import main as cli
from llm_planner.launch.launch_types import LaunchError
from llm_planner.launch.mpiexec_run import PROBE_PORT_ENV, cut_off_message, write_failure
from llm_planner.launch.serve_failure import serving_failure, stage_label
from llm_planner.launch.serve_launch import ServeOptions, launch_serving, prepare_serving
from llm_planner.launch.serve_report import measured, percentile, serving_report
from llm_planner.runtime.serve_spec import ServeSpec
from llm_planner.runtime.table import load_rank_table

MIXED = {"degrees": [2, 1], "layers": [3, 1], "concurrency": 3, "micro_batches": 2}
MISTRAL_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
MISTRAL_KEYS += ("vocab_size", "max_position_embeddings")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return save_config(tiny_gpt2(), tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def plan(gpt2_dir, tmp_path_factory) -> Path:
    single = {"degrees": [1], "layers": [4], "concurrency": 2, "micro_batches": 1, "devices": [[dev(3)]]}
    replicas = [{**MIXED, "devices": [[dev(0), dev(1)], [dev(2)]]}, single]
    return serving_plan(tmp_path_factory.mktemp("plan") / "serve.yaml", gpt2_dir, replicas)


def test_dry_run_prints_the_rank_table_and_command(plan, tmp_path, capsys):
    assert cli.main(["launch", str(plan), "--dry-run", "--workdir", str(tmp_path / "w"), "--max-requests", "3"]) == 0
    out = capsys.readouterr().out
    assert "mpiexec -f" in out and "-n 4" in out and "llm_planner.runtime" in out
    assert "localhost/cpu-core:0 (group localhost/cpu-core:0-1)" in out
    table = load_rank_table(tmp_path / "w" / "rank_table.json")
    assert table.run.workload == "serving" and table.run.dtype == "fp32"
    assert [r.group for r in table.ranks] == [[0, 1], [0, 1], [], []]
    assert table.ranks[2].tasks == {"0": ["block.3", "final_norm", "lm_head"]}
    spec = ServeSpec.from_dict(table.run.serving)
    assert [[s.ranks for s in r.stages] for r in spec.replicas] == [[(0, 1), (2,)], [(3,)]]
    assert [(s.first_layer, s.layers) for s in spec.replicas[0].stages] == [(0, 3), (3, 1)]
    assert spec.context_len == 11 and spec.max_batched_tokens == 8 and spec.max_requests == 3
    assert spec.cuda_graphs  # on where a stage can take them, unless --enforce-eager
    assert abs(sum(spec.shares) - 1) < 1e-12


def test_enforce_eager_reaches_the_ranks(plan, tmp_path):
    workdir = tmp_path / "w"
    argv = ["launch", str(plan), "--dry-run", "--workdir", str(workdir), "--enforce-eager"]
    assert cli.main(argv) == 0
    assert not ServeSpec.from_dict(load_rank_table(workdir / "rank_table.json").run.serving).cuda_graphs


def test_shares_and_predictions_are_the_replica_models(plan):
    prepared = prepare_serving(plan, ServeOptions(dry_run=True))
    rates = [s.ev.tokens_per_s for s in prepared.scores]
    assert prepared.spec.shares == pytest.approx([r / sum(rates) for r in rates])
    replicas = prepared.plan.replicas
    assert [s.ev.tpot_s for s in prepared.scores] == pytest.approx([r["tpot_s"] for r in replicas], rel=1e-9)
    assert prepared.spec.max_requests == 2 * (3 + 2)  # twice the planned concurrency by default


def test_placement_plans_refuse_serving_flags(tmp_path, capsys):
    from runtime_fixtures import decoder_plan

    placement = decoder_plan(tmp_path / "p.yaml", save_config(tiny_gpt2(), tmp_path / "m"), [{"embed": 0}])
    argv = ["launch", str(placement), "--dry-run", "--request-rate", "2", "--enforce-eager", "--workdir", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "--request-rate, --enforce-eager: only serving plans take them" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--request-rate", "0"], "--request-rate: must be a positive number of requests per second"),
        (["--request-rate", "nan"], "--request-rate: must be a positive number"),
        (["--max-requests", "0"], "--max-requests"),
        (["--prompt-ids", "1,2"], "--prompt-ids: "),
        (["--prompt-len", "20"], "exceeds the plan's context of 11 tokens per sequence"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(plan, tmp_path, capsys, flags, message):
    assert cli.main(["launch", str(plan), "--dry-run", "--workdir", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_layout_needing_more_ranks_than_the_spec_gives(gpt2_dir, tmp_path):
    cluster = tmp_path / "two-slots.yaml"
    cluster.write_text(LOCALHOST.read_text().replace("slots: 4", "slots: 2"))
    replicas = [{**MIXED, "devices": [[dev(0), dev(1)], [dev(2)]]}]
    plan = serving_plan(tmp_path / "plan.yaml", gpt2_dir, replicas, cluster=cluster)
    with pytest.raises(LaunchError, match=r"two-slots.yaml: nodes\[0\].slots: node 'localhost' has 2 MPI slots but"):
        launch_serving(plan, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))


def test_a_checkpoint_of_another_shape_is_refused(plan, tmp_path):
    other = save_config(tiny_gpt2(n_embd=32), tmp_path / "ckpt")
    with pytest.raises(
        LaunchError, match=r"serve.yaml: the plan was made for another model than checkpoint .*hidden_size"
    ):
        launch_serving(plan, ServeOptions(dry_run=True, checkpoint=str(other), workdir=str(tmp_path / "w")))


def test_a_mixture_of_experts_plan_launches_and_its_checkpoint_is_checked(tmp_path):
    """A plan of the tiny Mixtral on a tensor-parallel pair: the dry run writes its rank table (the runtime
    builds its MoE layers); a checkpoint of another expert count is refused naming the field."""
    pair = {"degrees": [2], "layers": [4], "concurrency": 2, "micro_batches": 1, "devices": [[dev(0), dev(1)]]}
    plan = serving_plan(tmp_path / "moe.yaml", TINY_MIXTRAL, [pair])
    assert yaml.safe_load(plan.read_text())["model"]["experts"] == {"num_experts": 4, "experts_per_token": 2}
    result, _ = launch_serving(plan, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))
    assert result.ok and [r.group for r in load_rank_table(tmp_path / "w" / "rank_table.json").ranks] == [[0, 1]] * 2
    other = tiny_mixtral()
    other.num_local_experts = 8
    save_config(other, tmp_path / "c")
    with pytest.raises(LaunchError, match=r"moe.yaml: the plan was made for another model than checkpoint .*num_exp"):
        launch_serving(plan, ServeOptions(dry_run=True, checkpoint=str(tmp_path / "c"), workdir=str(tmp_path / "w")))
    windowed = tiny_mixtral()  # a sliding window is part of the model too (llm_planner.graph.attention_window)
    windowed.sliding_window = 8
    save_config(windowed, tmp_path / "sw")
    with pytest.raises(LaunchError, match=r"checkpoint .*sliding_window: plan None vs checkpoint 8"):
        launch_serving(plan, ServeOptions(dry_run=True, checkpoint=str(tmp_path / "sw"), workdir=str(tmp_path / "w")))


def test_a_model_type_the_runtime_does_not_build_is_refused(tmp_path):
    """Mistral is planned (as a llama-family decoder) but not built by the runtime: refused, naming the type."""
    from transformers import MistralConfig

    llama = tiny_llama().to_dict()
    model = save_config(MistralConfig(**{k: llama[k] for k in MISTRAL_KEYS}, sliding_window=None), tmp_path / "m")
    one = {"degrees": [1], "layers": [5], "concurrency": 2, "micro_batches": 1, "devices": [[dev(0)]]}
    plan = serving_plan(tmp_path / "plan.yaml", model, [one])
    served = "gpt2, llama, qwen3, mixtral, qwen2_moe, qwen3_moe"
    with pytest.raises(LaunchError, match=f"plan.yaml: model type 'mistral': the runtime runs {served} decoders"):
        launch_serving(plan, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))


def test_a_device_in_two_stages_is_refused(gpt2_dir, tmp_path):
    replicas = [{**MIXED, "devices": [[dev(0), dev(1)], [dev(1)]]}]
    plan = serving_plan(tmp_path / "plan.yaml", gpt2_dir, replicas)
    said = r"plan.yaml: serving.replicas\[0\].devices\[0\]\[1\]: device localhost/cpu-core:1 serves two stages "
    with pytest.raises(LaunchError, match=said + r"\(it also serves serving.replicas\[0\].devices\[0\]\[0\]\)"):
        launch_serving(plan, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))


def test_a_group_the_cluster_cannot_form_is_refused_naming_the_stage(gpt2_dir, tmp_path):
    cluster = tmp_path / "three.yaml"  # a pair of three devices is no aligned block
    cluster.write_text(LOCALHOST.read_text().replace("cpu-core: 4", "cpu-core: 3"))
    replicas = [{**MIXED, "devices": [[dev(0), dev(1)], [dev(2)]]}]
    plan = serving_plan(tmp_path / "plan.yaml", gpt2_dir, replicas, cluster=cluster)
    with pytest.raises(LaunchError, match=r"serving.replicas\[0\].devices\[0\]\[0\]: group .* is not an aligned block"):
        launch_serving(plan, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))
    assert cli.main(["launch", str(plan), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2


def test_a_changed_input_is_refused_naming_the_plan(gpt2_dir, tmp_path):
    model = save_config(tiny_gpt2(), tmp_path / "m")
    plan = serving_plan(tmp_path / "plan.yaml", model, [{**MIXED, "devices": [[dev(0), dev(1)], [dev(2)]]}])
    save_config(tiny_gpt2(n_layer=2), model)
    with pytest.raises(LaunchError, match=r"plan.yaml: inputs.model_sha256"):
        launch_serving(plan, ServeOptions(dry_run=True, workdir=str(tmp_path / "w")))


def test_measured_figures_of_a_raw_record():
    record = {
        "duration_s": 2.0,
        "requests": [
            {"arrival_s": 0.0, "token_s": [0.5, 0.6, 0.8]},  # TTFT 0.5, TPOT 0.15
            {"arrival_s": 0.2, "token_s": [0.4, 0.9, 1.0]},  # TTFT 0.2, TPOT 0.3
            {"arrival_s": 1.0, "token_s": [1.5]},  # TTFT 0.5, no TPOT
        ],
        "iterations": [[0.0, 0.1, True, 2, 2], [0.1, 0.4, False, 8, 2], [0.4, 0.6, True, 2, 2], [0.6, 1.0, True, 1, 1]],
    }
    m = measured(record, concurrency=2)
    assert m["tokens_per_s"] == pytest.approx(7 / 2.0)
    assert m["tpot_s"] == pytest.approx(0.225) and m["tpot_p50_s"] == pytest.approx(0.225)
    assert m["tpot_p90_s"] == pytest.approx(0.15 + 0.9 * 0.15)
    assert m["ttft_s"] == pytest.approx(0.4) and m["ttft_p50_s"] == pytest.approx(0.5)
    assert m["decode_step_s"] == pytest.approx(0.2)  # median of 0.1, 0.2, 0.4
    assert m["ttft_steady_s"] == pytest.approx(0.5) and m["steady_requests"] == 1  # admitted at 1.0 >= 1.0
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0


def test_steady_ttft_leaves_out_the_opening_burst():
    """A closed loop of 2 slots: both admitted at 0 (TTFTs 0.3 and 0.6, the second waiting behind the
    first's prompt); the burst has drained when its last request's last token is out (2.0). Requests
    admitted before that (one at 1.5) are left out; those at or after it (2.0, 2.1) are steady."""

    def req(admitted, first, last):
        return {"arrival_s": admitted, "admitted_s": admitted, "token_s": [first, last]}

    record = {
        "duration_s": 4.0,
        "requests": [
            req(0.0, 0.3, 1.5),
            req(0.0, 0.6, 2.0),
            req(1.5, 1.7, 3.0),
            req(2.0, 2.1, 3.5),
            req(2.1, 2.3, 3.6),
        ],
        "iterations": [],
    }
    m = measured(record, concurrency=2)
    assert m["steady_requests"] == 2 and m["ttft_steady_s"] == pytest.approx((0.1 + 0.2) / 2)
    assert m["ttft_s"] == pytest.approx((0.3 + 0.6 + 0.2 + 0.1 + 0.2) / 5)
    short = measured({**record, "requests": record["requests"][:1]}, concurrency=2)  # the burst never drained
    assert short["steady_requests"] == 0 and short["ttft_steady_s"] is None


def test_a_serving_dry_run_imports_neither_mpi4py_nor_torch(plan, tmp_path):
    code = (
        "import sys\nfrom llm_planner.launch.serve_launch import ServeOptions, launch_serving\n"
        f"assert launch_serving({str(plan)!r}, ServeOptions(dry_run=True, workdir={str(tmp_path)!r}))[0].ok\n"
        "bad = [m for m in ('mpi4py', 'torch', 'transformers') if m in sys.modules]\nassert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _quantized(plan: Path, path: Path, model: dict, replica: dict) -> Path:
    """The plan with fields of model.precision and of replica 0's precision set as given."""
    data = yaml.safe_load(plan.read_text())
    data["model"]["precision"].update(model)
    data["serving"]["replicas"][0]["precision"].update(replica)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "model, replica, field, stored",
    [
        ({"weights": "int8"}, {"weights": "int8"}, "model.precision", "weights int8, KV cache fp32"),
        ({"kv_cache": "fp8"}, {"kv_cache": "fp8"}, "model.precision", "weights fp32, KV cache fp8"),
        ({}, {"kv_cache": "fp8"}, r"serving.replicas\[0\].precision", "weights fp32, KV cache fp8"),
    ],
)
def test_a_quantized_plan_is_refused_naming_the_plan_and_field(plan, tmp_path, capsys, model, replica, field, stored):
    quantized = _quantized(plan, tmp_path / "quantized.yaml", model, replica)
    assert cli.main(["launch", str(quantized), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"quantized.yaml: {field}: {stored}: the serving runtime runs weights and KV cache", err), err
    assert "activation dtype (fp32) only" in err and not (tmp_path / "w" / "rank_table.json").exists()


def test_a_bad_probe_port_is_refused_before_anything_starts(plan, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(PROBE_PORT_ENV, "ssh")
    assert cli.main(["launch", str(plan), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    assert f"{PROBE_PORT_ENV}='ssh': expected a TCP port" in capsys.readouterr().err
    assert not (tmp_path / "w" / "rank_table.json").exists()


def test_a_failure_names_the_replica_and_stage_of_the_failed_rank_and_of_the_ranks_cut_off(plan, tmp_path):
    """The placement launcher's failure (mpiexec_run.write_failure: a host cut off, then the rank that gave up)
    told in the plan's terms: each rank's replica and stage, in the message and in the failure report."""
    prepared = prepare_serving(plan, ServeOptions(dry_run=True, report_path=str(tmp_path / "run.json")))
    table = prepared.table
    devices = [table.ranks[r].device for r in (0, 1)]
    unreachable = [{"host": "localhost", "ranks": [0, 1], "devices": devices, "probe": "no answer"}]
    cause = "rank 2 (localhost/cpu-core:2): TimeoutError: rank 2: the run exceeded its timeout of 9 s"
    error = f"{cut_off_message(unreachable)}; {cause}"
    write_failure(table, "failed", error, 2, unreachable)
    request = {"arrival_s": 0.0, "token_s": [0.2, 0.3]}
    record = {"replica": 0, "duration_s": 1.0, "requests": [request], "iterations": []}
    served = serving_report(str(plan), prepared, {"replicas": [record]})
    message = serving_failure(error, table.run.report_path, prepared.spec, served)
    assert message == (
        f"{cut_off_message(unreachable)}; the ranks cut off served: rank 0: replica 0 stage 0 of 2, member 0 of 2; "
        f"rank 1: replica 0 stage 0 of 2, member 1 of 2; rank 2 (replica 0 stage 1 of 2) on host localhost failed: "
        f'{cause}; served before the failure: 1 request, 2 output tokens (the report\'s "served")'
    )
    failure = json.loads(Path(table.run.report_path).read_text())
    assert failure["error"] == message and failure["served"] == served
    assert [r["requests_completed"] for r in served["replicas"]] == [1, 0]
    assert served["replicas"][0]["measured"]["tokens_per_s"] == pytest.approx(2.0)
    assert [failure[f"failed_{k}"] for k in ("rank", "replica", "stage", "device")] == [2, 0, 1, table.ranks[2].device]
    assert failure["unreachable_hosts"][0]["stages"] == [
        {"rank": 0, "replica": 0, "stage": 0},
        {"rank": 1, "replica": 0, "stage": 0},
    ]


def test_a_failure_without_a_failed_rank_keeps_the_launchers_message(plan, tmp_path):
    prepared = prepare_serving(plan, ServeOptions(dry_run=True, report_path=str(tmp_path / "run.json")))
    write_failure(prepared.table, "failed", "mpiexec exited with status 7", None)
    assert serving_failure("mpiexec exited with status 7", tmp_path / "run.json", prepared.spec) == (
        "mpiexec exited with status 7"
    )
    assert stage_label(prepared.spec, 3) == "replica 1 stage 0 of 1"


def test_a_second_launch_into_a_busy_workdir_is_refused(plan, gpt2_dir, tmp_path, capsys):
    """A launch holds its workdir's lock while its ranks run: another launch into the same folder
    (a serving plan's or a placement plan's) exits 2 naming the folder and the launcher's pid, and
    starts nothing; the lock goes with its holder."""
    from runtime_fixtures import decoder_plan

    from llm_planner.launch.plan_launch import launch_plan
    from llm_planner.launch.workdir_lock import workdir_lock

    workdir = tmp_path / "w"
    placement = decoder_plan(tmp_path / "p.yaml", gpt2_dir, [{"embed": 0, "block.0": 1, "lm_head": 1}])
    with workdir_lock(workdir):
        assert cli.main(["launch", str(plan), "--workdir", str(workdir), "--max-requests", "3"]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert f"{workdir}: another launch is running in this workdir (launcher pid {os.getpid()})" in said
        assert not (workdir / "rank_table.json").exists()
        with pytest.raises(LaunchError, match="another launch is running"):
            launch_plan(placement, workdir=str(workdir), max_new_tokens=2)
        assert cli.main(["launch", str(plan), "--dry-run", "--workdir", str(workdir)]) == 0  # starts nothing
    with workdir_lock(workdir):  # released
        pass


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--stall-timeout", "1.5"], "--stall-timeout: must be at least 3 s (the ranks send a heartbeat every 1 s)"),
        (["--duration", "60", "--timeout", "15"], "--duration 60 s: --timeout 15 s stops the whole run"),
        (["--duration", "600"], "--duration 600 s: --timeout 600 s stops the whole run"),
    ],
)
def test_run_limits_that_cannot_hold_are_refused_before_anything_starts(plan, tmp_path, capsys, flags, message):
    assert cli.main(["launch", str(plan), "--workdir", str(tmp_path / "w"), *flags]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "w").exists()


def test_a_report_path_naming_one_of_the_plans_inputs_is_refused(plan, gpt2_dir, tmp_path, capsys):
    """--report over the plan's cluster spec or its model's config.json would destroy the input the
    plan's hashes name: refused before anything starts, naming the field."""
    stored = yaml.safe_load(plan.read_text())
    cluster = (plan.parent / stored["inputs"]["cluster"]).resolve()
    before = cluster.read_bytes()
    for path, field in ((cluster, "inputs.cluster"), (gpt2_dir / "config.json", "model.name's config")):
        assert cli.main(["launch", str(plan), "--report", str(path), "--workdir", str(tmp_path / "w")]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert f"{path}: is the input {field}" in said, said
    assert cluster.read_bytes() == before and not (tmp_path / "w").exists()


def test_the_prediction_is_made_at_the_shape_and_dtype_the_run_serves(plan):
    """--prompt-len / --output-len and --dtype change what is served, so the report's prediction
    is scored at them; without them it is the plan's own."""
    own = prepare_serving(plan, ServeOptions(dry_run=True)).scores
    served = prepare_serving(plan, ServeOptions(dry_run=True, prompt_len=2, output_len=3)).scores
    assert [s.ev.ttft_s for s in served] != pytest.approx([s.ev.ttft_s for s in own])
    assert prepare_serving(plan, ServeOptions(dry_run=True, prompt_len=2, output_len=3)).ctx.workload == (
        prepare_serving(plan, ServeOptions(dry_run=True)).ctx.workload
    )  # the plan's context itself is untouched
    halves = prepare_serving(plan, ServeOptions(dry_run=True, dtype="bf16")).scores
    assert all(h.ev.mem_bytes < o.ev.mem_bytes for h, o in zip(halves, own))  # scored in 2-byte elements


def test_an_interrupted_run_keeps_what_was_served_in_its_report(plan, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM: the launcher's 'interrupted' report gains `served` (here nothing yet), as a
    failed run's does, and the interrupt still reaches the caller."""
    import llm_planner.launch.serve_launch as serve_launch

    report = tmp_path / "run.json"

    def interrupted(table, options):
        write_failure(table, "interrupted", "interrupted (SIGTERM): mpiexec and every rank were stopped", None)
        raise KeyboardInterrupt

    monkeypatch.setattr(serve_launch, "run_table", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch_serving(plan, ServeOptions(workdir=str(tmp_path / "w"), report_path=str(report), max_requests=3))
    written = json.loads(report.read_text())
    assert written["status"] == "interrupted" and "SIGTERM" in written["error"]
    assert written["served"]["total"]["requests_completed"] == 0 and len(written["served"]["replicas"]) == 2


def test_a_count_that_does_not_match_the_copies_listed_names_the_copies(plan, tmp_path, capsys):
    data = yaml.safe_load(plan.read_text())
    data["serving"]["replicas"][1]["count"] += 1
    data["inputs"]["cluster"] = str((plan.parent / data["inputs"]["cluster"]).resolve())
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    assert cli.main(["launch", str(edited), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "serving.replicas[1].devices: expected 2 item(s), one per copy (count), got 1" in said, said


def test_a_run_cut_short_below_a_replicas_concurrency_is_predicted_at_what_it_reaches(plan):
    """--max-requests 3 over replicas of concurrency 3 and 2: each is routed its share of the three
    (serve_requests.route) and never has more in flight, so its prediction is made at that many and a
    note says so; a full run keeps the plan's operating point and has no note."""
    from collections import Counter

    from llm_planner.runtime.serve_requests import route

    full = prepare_serving(plan, ServeOptions(dry_run=True))
    assert [s.ev.concurrency for s in full.scores] == [3, 2] and full.notes == ()
    short = prepare_serving(plan, ServeOptions(dry_run=True, max_requests=3))
    routed = Counter(route(short.spec.shares, 3))
    assert [s.ev.concurrency for s in short.scores] == [min(3, routed[0]), min(2, routed[1])]
    below = [i for i, c in enumerate((3, 2)) if routed[i] < c]
    assert below and len(short.notes) == len(below)
    for i, note in zip(below, short.notes):
        assert f"replica {i} " in note and f"routed {routed[i]} of the run's 3 requests, fewer" in note
        assert short.scores[i].ev.tokens_per_s < full.scores[i].ev.tokens_per_s  # fewer in flight, fewer tokens/s
    one = prepare_serving(plan, ServeOptions(dry_run=True, max_requests=1))
    idle = [i for i in range(2) if Counter(route(one.spec.shares, 1))[i] == 0]
    assert len(idle) == 1 and one.scores[idle[0]] is None  # routed nothing: it predicts nothing
    assert any(f"replica {idle[0]} " in n and "routed none of the run's 1 requests" in n for n in one.notes)
    report = serving_report("p.yaml", one, {"replicas": []})
    assert report["replicas"][idle[0]]["predicted"] == {
        "concurrency": 0,
        "tokens_per_s": 0.0,
        "tpot_s": None,
        "ttft_s": None,
        "decode_step_s": None,
    }
