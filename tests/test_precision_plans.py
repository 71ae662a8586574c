"""Serving plans in a quantized precision end to end: `plan` records it on the model and every
replica, `show` prints it, `verify` re-derives memory and times with it (and refuses a plan whose
precision was changed), a version-5 plan is still read, and `export` writes the engines'
--quantization, --kv-cache-dtype and --dtype, every flag one the pinned engines define."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_engine_flags import check_against_engine
from test_serving_export import _edited, _flat

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.export.serving import build_engines
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.serving.plan_file import load_serving_plan
from llm_planner.serving.precision_choice import bound_without_plan
from llm_planner.serving.verify import verify_serving_plan
from llm_planner.serving.workload import NoKindRunsError, WorkloadError

# One RTX 4090 (fp8 tensor cores): a plan of one layout, so its bounds are quick to recompute.
ONE_GPU = """
name: one-4090
device_kinds:
  - {name: rtx4090, catalog: rtx-4090}
nodes:
  - {name: box, hostname: localhost, devices: {rtx4090: 1}}
links:
  intra_node_default: {bw_bytes_per_s: 25.6 GB/s, latency_s: 10 us}
"""
INT4_FP8KV = {"weights": "int4-awq:g128", "activations": "fp16", "kv_cache": "fp8"}


def _plan(tmp: Path, name: str, model: str, *precision: str) -> Path:
    out, cluster = tmp / f"{name}.yaml", tmp / "one-4090.yaml"
    cluster.write_text(ONE_GPU)
    argv = ["plan", "--objective", "serving", "--cluster", str(cluster), "--model", model]
    argv += ["--prompt-len", "256", "--output-len", "64", "--tpot-slo", "50 ms", "--time-limit", "20"]
    assert main([*argv, *precision, "--no-baselines", "-o", str(out)]) == 0
    return out


def _gpt2_awq(tmp: Path) -> str:
    """A GPT-2 checkpoint whose config.json declares AWQ, groups of 128, fp16 activations."""
    folder = tmp / "gpt2-awq"
    folder.mkdir()
    config = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024}
    config |= {"vocab_size": 50257, "torch_dtype": "float16"}
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("precision-plans")
    return {
        "int4": _plan(tmp, "int4", "gpt2", "--weights", "int4-awq", "--kv-cache-dtype", "fp8"),
        "fp16": _plan(tmp, "fp16", "gpt2"),
        "checkpoint": _plan(tmp, "ckpt", _gpt2_awq(tmp), "--kv-cache-dtype", "fp8"),
    }


def test_the_plan_records_its_precision_on_the_model_and_every_replica(plans, capsys):
    data = yaml.safe_load(plans["int4"].read_text())
    assert data["version"] == 6 and data["model"]["precision"] == INT4_FP8KV and data["model"]["dtype"] == "fp16"
    assert data["serving"]["replicas"] and all(r["precision"] == INT4_FP8KV for r in data["serving"]["replicas"])
    assert 0 < data["serving"]["tokens_per_s"] <= data["serving"]["upper_bound_tokens_per_s"]  # the bound holds
    assert main(["show", str(plans["int4"])]) == 0
    assert "weights int4-awq:g128, activations fp16, KV cache fp8" in " ".join(capsys.readouterr().out.split())


def test_verify_accepts_the_plan_and_refuses_a_changed_precision(plans, tmp_path):
    assert verify_serving_plan(load_serving_plan(plans["int4"])) == []

    def as_fp16(d):
        p = {"weights": "fp16", "activations": "fp16", "kv_cache": "fp16"}
        d["model"]["precision"] = p
        for rep in d["serving"]["replicas"]:
            rep["precision"] = dict(p)

    problems = verify_serving_plan(load_serving_plan(_edited(plans["int4"], tmp_path, as_fp16)))
    assert any("mem_bytes" in p for p in problems) and any("stage_s" in p for p in problems), problems

    def one_replica(d):
        d["serving"]["replicas"][0]["precision"]["kv_cache"] = "fp16"

    problems = verify_serving_plan(load_serving_plan(_edited(plans["int4"], tmp_path, one_replica)))
    assert any("serving.replicas[0].precision" in p and "model.precision" in p for p in problems), problems


def test_a_version_5_plan_is_read_as_one_dtype_for_everything(plans, tmp_path):
    def as_v5(d):
        d["version"] = 5
        del d["model"]["precision"], d["serving"]["unrestricted"]
        for rep in d["serving"]["replicas"]:
            del rep["precision"]

    plan = load_serving_plan(_edited(plans["fp16"], tmp_path, as_v5))
    assert plan.data["version"] == 5 and plan.data["model"]["precision"]["kv_cache"] == "fp16"
    assert verify_serving_plan(plan) == []


def _scripts(plan: Path) -> tuple[str, str]:
    served = load_serving_plan(plan)
    cluster = load_cluster(served.input_path("cluster"))
    return tuple(
        _flat(f(build_engines(served, cluster, to))) for to, f in (("vllm", vllm_script), ("sglang", sglang_script))
    )


def test_export_writes_the_quantization_and_the_kv_cache_dtype(plans):
    vllm, sglang = _scripts(plans["int4"])
    assert "--dtype float16 --quantization awq --kv-cache-dtype fp8 " in vllm
    assert "--dtype float16 --quantization awq --kv-cache-dtype fp8_e4m3 " in sglang
    assert check_against_engine(vllm, "vllm") >= 1 and check_against_engine(sglang, "sglang") >= 1


def test_export_leaves_the_method_to_a_checkpoint_that_declares_it(plans):
    data = yaml.safe_load(plans["checkpoint"].read_text())
    assert data["model"]["precision"] == INT4_FP8KV  # read from its config.json, planned as what it is
    vllm, sglang = _scripts(plans["checkpoint"])
    assert "--quantization" not in vllm and "--quantization" not in sglang
    assert "--dtype float16 --kv-cache-dtype fp8 " in vllm and "--kv-cache-dtype fp8_e4m3 " in sglang
    assert check_against_engine(vllm, "vllm") >= 1 and check_against_engine(sglang, "sglang") >= 1


def test_verify_refuses_a_weight_format_the_checkpoint_does_not_declare(plans, tmp_path):
    def as_gptq(d):  # the same bytes and rates as AWQ: only the checkpoint tells them apart
        for p in [d["model"]["precision"], *(r["precision"] for r in d["serving"]["replicas"])]:
            p["weights"] = "int4-gptq:g128"

    edited = _edited(plans["checkpoint"], tmp_path, as_gptq)
    problems = verify_serving_plan(load_serving_plan(edited))
    assert len(problems) == 1 and "declares int4-awq:g128" in problems[0], problems


ALLOWED = ("fp16", "fp8")


@pytest.fixture(scope="module")
def chosen(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("precision-auto")
    return _plan(tmp, "auto", "gpt2", "--allow-weights", "fp8", "--allow-kv-cache-dtype", "fp8")


def test_the_search_chooses_among_the_allowed_formats_only(chosen):
    sv = yaml.safe_load(chosen.read_text())["serving"]
    rows = sv["precisions"]
    assert {(r["precision"]["weights"], r["precision"]["kv_cache"]) for r in rows} == {
        (w, k) for w in ALLOWED for k in ALLOWED
    }
    best = max(rows, key=lambda r: r["tokens_per_s"])
    assert sv["tokens_per_s"] == best["tokens_per_s"]
    assert all(r["precision"] == best["precision"] for r in sv["replicas"])
    assert sv["upper_bound_tokens_per_s"] == max(r["upper_bound_tokens_per_s"] for r in rows) >= sv["tokens_per_s"]


@pytest.mark.heavy  # 6-7 s: CI's test command runs it after the default suite
def test_verify_recomputes_every_candidate_bound(chosen, tmp_path):
    assert verify_serving_plan(load_serving_plan(chosen)) == []
    data = yaml.safe_load(chosen.read_text())
    other = next(i for i, r in enumerate(data["serving"]["precisions"]) if r["precision"] != data["model"]["precision"])

    def forged(d):
        d["serving"]["precisions"][other]["upper_bound_tokens_per_s"] *= 1.5

    problems = verify_serving_plan(load_serving_plan(_edited(chosen, tmp_path, forged)))
    assert any(f"serving.precisions[{other}].upper_bound_tokens_per_s" in p for p in problems), problems


def test_a_candidate_no_kind_runs_is_bound_0_and_no_other_refusal_is():
    """bound_without_plan: 0 only when no device kind runs the precision (no plan exists in it); a
    context refused for any other reason says nothing about what plans exist, so it is raised, not
    made a bound of 0 that a plan in that precision could beat."""

    def none_runs():
        raise NoKindRunsError("--weights fp8: no device kind of spec.yaml that may serve runs it")

    def refused():
        raise WorkloadError("profile.yaml: times bf16 weights, not fp8")

    assert bound_without_plan(none_runs) == 0.0
    with pytest.raises(WorkloadError, match="profile.yaml"):
        bound_without_plan(refused)
