"""Data-parallel attention with the experts split over the group (llm_planner.cost.dp_attention):
its kernels and memory by hand, which groups offer it, the notation, and a DeepSeek-V3 plan that
runs it planned, verified, shown, exported and refused where nothing runs it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from serving_fixtures import context, small_deepseek, workload, write_fleet

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.cost.dp_attention import dp_layer_kernels
from llm_planner.cost.iteration import Load, sublayer_kernels
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.serving.context import ServingContext, ServingOptions
from llm_planner.serving.engines import StageForm, engine_refusal
from llm_planner.serving.layout import Segment, describe
from llm_planner.serving.layout_text import LayoutError, parse_layout

QWEN = "qwen1.5-moe-a2.7b"  # 60 experts of 1408, top-4, a shared expert of 5632, 16 heads of 128
H200 = str(Path(__file__).resolve().parents[1] / "cluster_specs" / "h200-2x8.yaml")


def test_a_layer_is_its_own_share_of_attention_and_the_groups_mlp(tmp_path):
    """Per member of dpa2: attention's kernels on one device at half the load (weights read whole),
    the MLP's kernels of a tp2 member on all of it, and an all-gather plus a reduce-scatter in place
    of the MLP's all-reduce: the same bytes, one call more."""
    ctx = context(tmp_path, QWEN)
    sc = ctx.by_name["bigbox/big"]
    kind, link, cfg = sc.kind, sc.intra_link, ctx.config
    load = Load(decodes=6, decode_keys=6 * 300, prompt_tokens=40, prompt_keys=40 * 128)
    attn = sublayer_kernels(cfg, "fp16", kind, "attn", 1)
    mlp = sublayer_kernels(cfg, "fp16", kind, "mlp", 2, link)
    by_hand = kind.overhead_s + kind.collective_call_s
    by_hand += sum(attn.kernel_s(kr, load.times(0.5)) for kr in attn.kernels)
    by_hand += sum(mlp.kernel_s(kr, load) for kr in mlp.kernels)
    dp = dp_layer_kernels(cfg, "fp16", kind, 2, link)
    assert dp.time_s(load) == pytest.approx(by_hand)
    (gather,) = [kr for kr in dp.kernels if kr.collective]
    assert gather.flops[0] == pytest.approx(2 * kind.collective_call_s + 2 * link.latency_s)  # k - 1 = 1 hop each
    assert gather.bytes[1] == pytest.approx(2 * (2 - 1) / 2 * cfg.hidden_size * 2)  # h fp16 bytes per token


def test_a_member_holds_attention_whole_and_half_the_experts(tmp_path):
    """qwen1.5-moe on dpa2: q, k, v, o and their biases whole, the routed and shared experts split,
    router and norms whole; each sequence's whole cache on one member (half of them each)."""
    ctx = context(tmp_path, QWEN)
    h, e, m, s, kv = 2048, 60, 1408, 5632, 2048
    attn = 2 * h * h + 2 * h * kv + (h + 2 * kv)
    mlp = 3 * h * m * e + 3 * h * s
    whole = h * e + h + 2 * h
    costs = ctx.cache.get("bigbox/big", 2, "dp")
    assert costs.weight_bytes["block"] == pytest.approx(2 * (attn + mlp / 2 + whole))
    assert costs.kv_bytes_per_seq == pytest.approx(ctx.cache.get("bigbox/big", 1).kv_bytes_per_seq / 2)


def test_the_latent_cache_is_split_by_sequences_not_replicated(tmp_path):
    """MLA: a tp member holds every sequence's latent, a dpa member its own sequences' only; the
    dense first layers' MLP is split as the experts are."""
    ctx = ServingContext(load_cluster(write_fleet(tmp_path)), small_deepseek(), workload(), "fp16", ServingOptions())
    one, tp, dp = (ctx.cache.get("smallbox/small", k, a) for k, a in ((1, "tp"), (4, "tp"), (4, "dp")))
    assert tp.kv_bytes_per_seq == pytest.approx(one.kv_bytes_per_seq)
    assert dp.kv_bytes_per_seq == pytest.approx(one.kv_bytes_per_seq / 4)
    mlp = 3 * 2048 * 5632 * 2  # the dense layer's gated MLP in fp16
    assert dp.weight_bytes["dense"] == pytest.approx(one.weight_bytes["dense"] - mlp * 3 / 4)


def test_only_a_mixture_of_experts_whose_experts_split_offers_it(tmp_path):
    assert all(sc.dp_degrees == () for sc in context(tmp_path, "llama2-7b").classes)
    moe = context(tmp_path, QWEN)
    assert {sc.name: sc.dp_degrees for sc in moe.classes} == {"bigbox/big": (2,), "smallbox/small": (2, 4)}
    assert all(sc.dp_degrees == () for sc in context(tmp_path, QWEN, dp_attention=False).classes)
    odd = dataclasses.replace(preset_config(QWEN), num_experts=62)  # 62 experts: not over 4
    ctx = ServingContext(load_cluster(write_fleet(tmp_path)), odd, workload(), "fp16", ServingOptions())
    assert ctx.by_name["smallbox/small"].dp_degrees == (2,)


def test_an_engine_without_it_for_the_model_is_not_offered_it(tmp_path):
    """SGLang runs data-parallel attention for DeepSeek and Qwen MoE, not Mixtral: --exportable
    sglang offers it to the first only; vLLM's takes any mixture of experts."""
    cluster = load_cluster(write_fleet(tmp_path))

    def offered(model: str, engine: str) -> bool:
        ctx = ServingContext(cluster, preset_config(model), workload(), "fp16", ServingOptions(exportable=engine))
        return any(sc.dp_degrees for sc in ctx.classes)

    assert offered(QWEN, "sglang") and offered("mixtral-8x7b", "vllm")
    assert not offered("mixtral-8x7b", "sglang")


def test_the_notation_reads_and_writes_dpa(tmp_path):
    ctx = context(tmp_path, QWEN)
    layout = (Segment("smallbox/small", 4, 1, "dp"), Segment("bigbox/big", 2, 1))
    text = describe(layout, ctx.by_name)
    assert text == "smallbox/small: 1 stage x dpa4 in 1 server -> bigbox/big: 1 stage x tp2 in 1 server"
    assert parse_layout(text, ctx.by_name) == layout
    assert parse_layout("1 x smallbox/small[dpa4]", ctx.by_name) == layout[:1]
    dense = context(tmp_path, "llama2-7b")
    with pytest.raises(LayoutError, match="forms no group of 2 devices with data-parallel attention; those it forms"):
        parse_layout("1 x bigbox/big[dpa2]", dense.by_name)


def test_engines_run_it_as_one_whole_stage():
    dp = StageForm(degree=4, kind="h200", cpu=False, host="a", attention="dp")
    assert engine_refusal("vllm", [dp], 1) is None
    two = engine_refusal("sglang", [dp, dp], 2)
    assert "stage 0 runs data-parallel attention in a pipeline of 2 stages: SGLang runs it only" in two
    assert "runs tensor-parallel groups only (plan with --no-dp-attention)" in engine_refusal("megatron", [dp], None)


@pytest.fixture(scope="module")
def deepseek_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dpa") / "deepseek.yaml"
    args = ["plan", "--cluster", H200, "--model", "deepseek-v3", "--objective", "serving", "--dtype", "bf16"]
    args += ["--weights", "fp8", "--kv-cache-dtype", "fp8", "--prompt-len", "1000", "--output-len", "1000"]
    assert main([*args, "--tpot-slo", "50 ms", "--exportable", "vllm", "-o", str(out)]) == 0
    return out


def test_deepseek_serves_with_data_parallel_attention_and_verifies(deepseek_plan, capsys):
    """At 50 ms one dpa8 group a server, each member its own sequences' latent cache: more in flight
    than tp8's every-member copy, so more tokens/s than megatron's tp8."""
    data = yaml.safe_load(deepseek_plan.read_text())
    (rep,) = data["serving"]["replicas"]
    assert rep["segments"] == [{"class": "hgx/h200", "degree": 8, "stages": 1, "attention": "dp"}]
    assert data["serving"]["tokens_per_s"] > 1.2 * data["baselines"]["megatron"]["tokens_per_s"]
    capsys.readouterr()
    assert main(["verify", str(deepseek_plan)]) == 0
    assert main(["show", str(deepseek_plan)]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "256 experts, top-8, split over each group (tpK: tensor-parallel; dpaK: data-parallel attention)" in flat
    assert "hgx-0/h200:0 .. hgx-0/h200:7 (dpa8)" in out


def test_deepseek_exports_the_engines_data_parallel_flags(deepseek_plan, capsys):
    rep = yaml.safe_load(deepseek_plan.read_text())["serving"]["replicas"][0]
    capsys.readouterr()
    assert main(["export", str(deepseek_plan), "--to", "vllm"]) == 0
    vllm = capsys.readouterr().out
    assert "--tensor-parallel-size 1 --data-parallel-size 8 --enable-expert-parallel" in vllm
    assert f"--max-num-seqs {-(-rep['concurrency'] // 8)}" in vllm  # per data-parallel rank
    assert main(["export", str(deepseek_plan), "--to", "sglang"]) == 0
    assert "--tp-size 8 --dp-size 8 --enable-dp-attention --ep-size 8" in capsys.readouterr().out
    assert main(["export", str(deepseek_plan), "--to", "megatron"]) == 2
    assert "Megatron-LM runs tensor-parallel groups only" in capsys.readouterr().err


def test_launch_refuses_data_parallel_attention_naming_the_field(deepseek_plan, tmp_path, capsys):
    assert main(["launch", str(deepseek_plan), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "serving.replicas[0].segments[0].attention: 'dp': the runtime runs tensor-parallel groups only" in err
