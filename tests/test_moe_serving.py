"""Mixture-of-experts models served end to end: planned, scored, verified, shown, exported and
launched as what they are (experts held in memory, tensor-parallel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from serving_fixtures import workload, write_fleet

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.serving.context import ServingContext, ServingOptions

SPEC = str(Path(__file__).resolve().parents[1] / "cluster_specs" / "dgx-a100-l4.yaml")
PLAN_ARGS = ["--objective", "serving", "--prompt-len", "512", "--output-len", "128", "--tpot-slo", "50 ms"]


@pytest.fixture(scope="module")
def mixtral_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("moe") / "mixtral.yaml"
    # tensor-parallel experts (what the runtime runs: launch below); data-parallel attention in test_dp_attention.py
    argv = ["plan", "--cluster", SPEC, "--model", "mixtral-8x7b", *PLAN_ARGS, "--no-dp-attention", "--time-limit", "30"]
    rc = main([*argv, "-o", str(out)])
    assert rc == 0
    return out


@pytest.mark.heavy
def test_the_plan_holds_every_expert_and_verifies(mixtral_plan, capsys):
    data = yaml.safe_load(mixtral_plan.read_text())
    assert data["model"]["experts"] == {"num_experts": 8, "experts_per_token": 2}
    assert data["options"]["expert_imbalance"] == 1.0
    # 46.7B parameters in fp16 (93 GB) do not fit on two 40 GB A100s: every replica spans at least
    # three of them, so the 8 L4s (24 GB) join no replica on their own
    for rep in data["serving"]["replicas"]:
        assert sum(len(stage) for stage in rep["devices"][0]) >= 3
    capsys.readouterr()
    assert main(["verify", str(mixtral_plan)]) == 0
    assert "valid:" in capsys.readouterr().out


def _edited(plan: Path, tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(plan.read_text())
    edit(data)
    data["inputs"]["cluster"] = str((plan.parent / data["inputs"]["cluster"]).resolve())
    name = plan.parent / data["model"]["name"]  # a config folder or file is stored relative to the plan too
    if name.is_dir() or name.suffix == ".json":
        data["model"]["name"] = str(name.resolve())
    out = tmp_path / "edited.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@pytest.mark.parametrize(
    ("forge", "message"),
    [
        (lambda d: d["model"]["experts"].update(num_experts=4), "model.experts: {'num_experts': 4"),
        (lambda d: d["model"].pop("experts"), "model.experts: None but mixtral-8x7b"),
        (lambda d: d["options"].update(expert_imbalance=2.0), "tokens_per_s"),  # the figures no longer match
        (lambda d: d["serving"]["replicas"][0].update(concurrency=d["serving"]["replicas"][0]["concurrency"] * 4), ""),
    ],
)
def test_verify_refuses_a_forged_moe_plan(mixtral_plan, tmp_path, capsys, forge, message):
    forged = _edited(mixtral_plan, tmp_path, forge)
    capsys.readouterr()
    assert main(["verify", str(forged)]) == 1
    assert message in capsys.readouterr().out


def test_show_states_the_experts(mixtral_plan, capsys):
    capsys.readouterr()
    assert main(["show", str(mixtral_plan)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "mixture of experts: 8 experts, top-2, tensor-parallel, imbalance 1 (uniform routing)" in first


def test_score_gives_the_plans_figure_for_its_replica(mixtral_plan, capsys):
    rep = yaml.safe_load(mixtral_plan.read_text())["serving"]["replicas"][0]
    capsys.readouterr()
    args = ["score", "--cluster", SPEC, "--model", "mixtral-8x7b", "--replica", rep["pattern"]]
    args += ["--concurrency", str(rep["concurrency"]), "--micro-batches", str(rep["micro_batches"])]
    args += ["--layers", ",".join(map(str, rep["layers"])), "--prompt-len", "512", "--output-len", "128", "--json"]
    assert main(args) == 0
    score = json.loads(capsys.readouterr().out)
    assert score["tokens_per_s"] == pytest.approx(rep["tokens_per_s"])


def test_export_runs_the_experts_tensor_parallel(mixtral_plan, capsys):
    capsys.readouterr()
    assert main(["export", str(mixtral_plan), "--to", "vllm"]) == 0
    script = capsys.readouterr().out
    assert "--tensor-parallel-size" in script and "expert-parallel" not in script


def test_launch_takes_an_moe_plan_and_checks_its_experts(mixtral_plan, tmp_path, capsys):
    """The serving runtime runs Mixtral's layers (tests/test_serve_moe.py): the dry run writes the rank
    table; a plan whose model.experts is not the model's is refused, naming the field."""
    capsys.readouterr()
    assert main(["launch", str(mixtral_plan), "--dry-run", "--workdir", str(tmp_path / "w")]) == 0
    assert (tmp_path / "w" / "rank_table.json").is_file()
    forged = _edited(mixtral_plan, tmp_path, lambda d: d["model"]["experts"].update(experts_per_token=1))
    assert main(["launch", str(forged), "--dry-run", "--workdir", str(tmp_path / "w2")]) == 2
    err = capsys.readouterr().err
    assert "edited.yaml: model.experts: the plan states {'num_experts': 8, 'experts_per_token': 1}" in err, err
    assert "model mixtral-8x7b has {'num_experts': 8, 'experts_per_token': 2}" in err


def test_the_latency_objective_refuses_a_mixture_of_experts(capsys):
    assert main(["plan", "--cluster", SPEC, "--model", "mixtral-8x7b"]) == 2
    err = capsys.readouterr()
    assert "only --objective serving plans it" in err.out + err.err


def test_a_relabelled_mixtral_is_refused_by_plan(tmp_path, capsys):
    from test_moe_config import MIXTRAL_JSON

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MIXTRAL_JSON, "model_type": "mistral"}))
    assert main(["plan", "--cluster", SPEC, "--model", str(path), *PLAN_ARGS]) == 2
    err = capsys.readouterr()
    assert "num_local_experts" in err.out + err.err


def test_a_group_holds_its_share_of_every_expert(tmp_path):
    """Per member of a tp2 group, a layer holds half of every expert, the router and norms whole."""
    ctx = ServingContext(
        load_cluster(write_fleet(tmp_path)),
        preset_config("qwen1.5-moe-a2.7b"),
        workload(256, 128, 0.05),
        "fp16",
        ServingOptions(),
    )
    h, e, m, s, kv = 2048, 60, 1408, 5632, 2048
    attn = 2 * h * h + 2 * h * kv + (h + 2 * kv)  # q, o, k, v and the q/k/v biases (qwen2 family)
    mlp = 3 * h * m * e + 3 * h * s  # routed and shared experts: split over the group
    whole = h * e + h + 2 * h  # router, shared expert gate, the two norms: on each member
    costs = ctx.cache.get("bigbox/big", 2)
    assert costs.weight_bytes["block"] == pytest.approx(2 * ((attn + mlp) / 2 + whole))
    assert ctx.cache.get("bigbox/big", 1).weight_bytes["block"] == 2 * (attn + mlp + whole)


@pytest.mark.slow  # plan and verify each compute the bounds: about 40 s on 2 loaded cores
def test_a_config_json_of_an_moe_model_plans_and_verifies(tmp_path, capsys):
    """A qwen2_moe checkpoint's config.json (written by transformers) on the small fleet."""
    from test_moe_config import _tiny_moe

    from llm_planner.graph.hf_config import to_hf_config

    cfg = _tiny_moe("qwen2_moe", num_layers=4, hidden_size=256, max_positions=2048)
    to_hf_config(cfg).save_pretrained(tmp_path / "tiny-moe")
    out = tmp_path / "plan.yaml"
    args = ["plan", "--cluster", str(write_fleet(tmp_path)), "--model", str(tmp_path / "tiny-moe"), *PLAN_ARGS]
    assert main([*args, "--time-limit", "20", "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    assert data["model"]["experts"] == {"num_experts": 4, "experts_per_token": 2}
    assert data["inputs"]["model_sha256"] is not None
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0


def test_expert_flags_and_profiles_are_refused_where_they_do_not_apply(tmp_path, capsys):
    dense = ["plan", "--cluster", SPEC, "--model", "llama3-8b", *PLAN_ARGS, "--expert-imbalance", "1.5"]
    assert main(dense) == 2
    assert "--expert-imbalance 1.5: llama3-8b has no experts" in capsys.readouterr().err
    assert main(["plan", "--cluster", SPEC, "--model", "mixtral-8x7b", *PLAN_ARGS, "--expert-imbalance", "0.9"]) == 2
    assert "--expert-imbalance: must be a finite number of at least 1" in capsys.readouterr().err
    cluster = load_cluster(write_fleet(tmp_path))
    with pytest.raises(ValueError, match="--profile: a measured serving profile times dense layers"):
        ServingContext(
            cluster, preset_config("qwen1.5-moe-a2.7b"), workload(), "fp16", ServingOptions(), profile=object()
        )
