"""DeepSeek-V3 (model_type deepseek_v3) planned as what it is: multi-head latent attention (MLA) and
dense first layers before the MoE ones. Parameters exactly as transformers' DeepseekV3ForCausalLM
holds them, the published totals, the latent KV cache (whole on every member of a tensor-parallel
group), its kernels by hand, and serving plans whose first stage holds the dense layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llm_planner.cost.iteration import Load, layer_kernels
from llm_planner.cost.roofline import shard_of
from llm_planner.graph import hf_config
from llm_planner.graph.decoder_graph import build_decoder_graph
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.ir import GraphError
from llm_planner.graph.transformer import count_active_parameters, count_parameters
from llm_planner.serving.tasks import build_serving_tasks
from llm_planner.serving.workload import RequestShape, ServingWorkload

H200_FLEET = Path(__file__).resolve().parents[1] / "cluster_specs" / "h200-2x8.yaml"
TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    n_shared_experts=2,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=12,
    v_head_dim=10,
)


def _read(config):
    return hf_config.config_from_dict(config.to_dict(), "test")


def _hf_params(config, device: str) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"q_lora_rank": None},
        {"attention_bias": True},
        {"tie_word_embeddings": True},
        {"first_k_dense_replace": 0},
        {"first_k_dense_replace": 4},
    ],
    ids=["tiny", "plain-q", "biases", "tied", "all-moe", "all-dense"],
)
def test_tiny_configs_count_exactly_like_transformers(change):
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(**{**TINY, **change})
    cfg = _read(config)
    assert count_parameters(cfg) == _hf_params(config, "cpu")
    assert hf_config.to_hf_config(cfg).to_dict()["first_k_dense_replace"] == min(4, config.first_k_dense_replace)
    graph = build_decoder_graph(cfg, phase="decode", seq_len=8, granularity="block", dtype="fp32")
    assert sum(t.weight_bytes for t in graph.tasks) == 4 * (count_parameters(cfg) + 97 * 64 * cfg.tie_word_embeddings)


def test_deepseek_v3_is_671b_with_37b_multiplied_per_token():
    """DeepseekV3Config's defaults are DeepSeek-V3's (61 layers, the first 3 dense, 256 experts of
    2048, top-8, one shared; MLA ranks 1536 and 512); its report: 671B parameters, 37B activated."""
    from transformers import DeepseekV3Config

    config = DeepseekV3Config()
    cfg = _read(config)
    assert count_parameters(cfg) == _hf_params(config, "meta")
    assert count_parameters(cfg) == pytest.approx(671e9, rel=0.001)
    # the report's 37B activated leaves the embedding (a lookup, 129,280 x 7,168) out
    assert count_active_parameters(cfg) - 129280 * 7168 == pytest.approx(37e9, rel=0.015)
    preset = preset_config("deepseek-v3")
    assert count_parameters(preset) == count_parameters(cfg) and preset.first_dense_layers == 3


def test_the_mla_cache_is_the_latent_and_rope_key_whole_on_every_member():
    cfg = preset_config("deepseek-v3")
    graph = build_decoder_graph(cfg, phase="decode", seq_len=1000, granularity="block", dtype="bf16")
    block = next(t for t in graph.tasks if t.name == "block.10")
    assert block.mem_bytes_per_sample == 1000 * (512 + 64) * 2  # not 2 x 128 heads x 192
    assert shard_of(block, 8).mem_bytes_per_sample == block.mem_bytes_per_sample
    assert shard_of(block, 8).weight_bytes < block.weight_bytes / 7  # the weights do split (but q_a, kv_a)


def test_mla_kernels_by_hand_on_a_tiny_config():
    """One decode token reading 100 cached tokens, on one member of a pair, in fp16: attention FLOPs
    and the latent's bytes as llm_planner.graph.mla states them."""
    from kernel_fixtures import KIND, LINK
    from transformers import DeepseekV3Config

    cfg = _read(DeepseekV3Config(**TINY))
    kernels = layer_kernels(cfg.moe_layer(), "fp16", KIND, 2, LINK)
    by_name = {k.name: k for k in kernels.kernels}
    decode, prefill = by_name["attn_decode"], by_name["attn_prefill"]
    heads = 4 / 2
    assert decode.flops[2] == 2 * heads * (2 * 16 + 8)  # absorbed QK over 16 + 8, AV over 16, per key
    assert decode.bytes[2] == (16 + 8) * 2  # the latent read once for both heads
    assert decode.bytes[1] == 2 * heads * (2 * 16 + 8)  # the absorbed query in, its latent output out
    assert prefill.flops[4] == 2 * heads * (20 + 10)  # decompressed: QK over 12 + 8, AV over 10
    memory = (2 * heads * 40 + 100 * 48) / 1e12  # the kind streams 1 TB/s; the FLOPs are far below
    assert kernels.kernel_s(decode, Load(decodes=1, decode_keys=100)) == pytest.approx(memory)


def test_a_config_whose_dense_layers_cover_the_model_needs_no_experts(tmp_path):
    from transformers import DeepseekV3Config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(DeepseekV3Config(**{**TINY, "first_k_dense_replace": 4}).to_dict()))
    cfg = hf_config.load_config_file(path)
    assert not cfg.is_moe and cfg.first_dense_layers == 0
    with pytest.raises(GraphError, match="moe_layer_freq"):
        data = DeepseekV3Config(**TINY).to_dict() | {"moe_layer_freq": 2}
        hf_config.config_from_dict(data, "x.json")


def test_serving_tasks_split_the_moe_layers_and_keep_the_dense_ones_apart():
    cfg = preset_config("deepseek-v3")
    wl = ServingWorkload(requests=(RequestShape(prompt_len=1000, output_len=1000),), tpot_slo_s=0.1)
    tasks = build_serving_tasks(cfg, wl, "bf16")
    assert tasks.num_layers == 58 and tasks.dense_layers == 3
    assert tasks.tasks["dense"].weight_bytes < tasks.tasks["block"].weight_bytes / 10  # 0.6B against 11.9B
    assert tasks.tasks["dense"].mem_bytes_per_sample == tasks.tasks["block"].mem_bytes_per_sample


def test_the_first_stage_holds_the_dense_layers_in_time_and_memory(tmp_path):
    """A replica of two stages of the small DeepSeek: the first stage's iteration and memory are the
    second's (same layers) plus its embedding and its two dense layers, each by its own kernels."""
    from serving_fixtures import small_deepseek, workload, write_fleet

    from llm_planner.core.spec import load_cluster
    from llm_planner.serving.context import ServingContext, ServingOptions
    from llm_planner.serving.layout import Segment

    cfg = small_deepseek()
    ctx = ServingContext(load_cluster(write_fleet(tmp_path)), cfg, workload(256, 128, 0.05), "fp16", ServingOptions())
    big = next(c for c in ctx.classes if c.name.endswith("big"))
    costs = ctx.cache.get(big.name, 1)
    first = costs.stage_s(8, 7, True, False) - costs.stage_s(8, 7, False, False)
    assert first == pytest.approx(costs.part_s("embed", 8) + 2 * float(costs.dense_time(8)))
    dense_bytes = costs.mem_bytes(layers=7, first=True, last=False, concurrency=8, micro_batch=8) - costs.mem_bytes(
        layers=7, first=False, last=False, concurrency=8, micro_batch=8
    )
    held = costs.weight_bytes["embed"] + 2 * (costs.weight_bytes["dense"] + 8 * costs.kv_bytes_per_seq)
    assert dense_bytes == pytest.approx(held, rel=1e-9, abs=costs.workspace_bytes_per_seq["dense"] * 8)
    model = ctx.replica((Segment(big.name, 1, 2),))
    assert sum(model.split_layers(8, 1)) == 14  # the stages split the 14 MoE layers


@pytest.mark.heavy
def test_deepseek_v3_plans_verifies_and_exports_with_its_dense_layers_first(tmp_path, capsys):
    from llm_planner.cli.main import main

    spec = H200_FLEET
    out = tmp_path / "ds.yaml"
    argv = ["plan", "--objective", "serving", "--cluster", str(spec), "--model", "deepseek-v3", "--weights", "fp8"]
    argv += ["--kv-cache-dtype", "fp8", "--prompt-len", "1000", "--output-len", "1000", "--tpot-slo", "100 ms"]
    # tensor-parallel groups of at most 4: two pipeline stages of tp4, whose vLLM partition counts the
    # dense layers (and whose bounds take a second: every larger group left out)
    assert main([*argv, "--no-dp-attention", "--max-tp", "4", "-o", str(out)]) == 0, capsys.readouterr().err
    plan = yaml.safe_load(out.read_text())
    assert plan["model"]["num_layers"] == 58 and plan["model"]["dense_layers"] == 3
    assert all(sum(r["layers"]) == 58 for r in plan["serving"]["replicas"])
    assert main(["verify", str(out)]) == 0, capsys.readouterr().out
    script = tmp_path / "serve.sh"
    assert main(["export", str(out), "--to", "vllm", "-o", str(script)]) == 0, capsys.readouterr().err
    replica = plan["serving"]["replicas"][0]
    if len(replica["layers"]) > 1:  # vLLM counts the dense layers in the first stage
        engine = [replica["layers"][0] + 3, *replica["layers"][1:]]
        assert f"VLLM_PP_LAYER_PARTITION={','.join(map(str, engine))}" in script.read_text()


ONE_BIG_SERVER = """
name: one-server
device_kinds:
  - {name: big, type: gpu, peak_flops: {fp16: 300 TFLOP/s}, mem_bytes: 16 GB, mem_bw_bytes_per_s: 2000 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us, step_overhead_s: 0.5 ms}
nodes:
  - {name: bigbox, devices: {big: 2}, links: [{between: [big, big], bw_bytes_per_s: 300 GB/s, latency_s: 2 us}]}
"""


@pytest.mark.heavy
def test_launch_refuses_a_deepseek_plan_naming_the_model_type(tmp_path, capsys):
    from serving_fixtures import small_deepseek, write_fleet

    from llm_planner.cli.main import main

    folder = tmp_path / "small-deepseek"
    hf_config.to_hf_config(small_deepseek()).save_pretrained(folder)
    out = tmp_path / "plan.yaml"
    fleet = write_fleet(tmp_path, ONE_BIG_SERVER)  # one class: the plan's bounds take a second
    argv = ["plan", "--objective", "serving", "--cluster", str(fleet), "--model", str(folder)]
    argv += ["--prompt-len", "256", "--output-len", "128", "--tpot-slo", "50 ms", "--no-baselines", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["launch", str(out), "--dry-run"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "model type 'deepseek_v3'" in err and "Traceback" not in err, err


@pytest.mark.parametrize("kv", [None, "fp8"], ids=["bf16-cache", "fp8-cache"])
def test_the_serving_cache_per_member_is_the_whole_latent_at_any_degree(kv):
    """At the workload's full context, in the KV dtype: every member of a group of 1, 4 or 8 holds
    576 values a token and layer (the latent and the rope key); the latent projections, replicated
    too, are held in the weight format."""
    from llm_planner.core.precision import build_precision

    cfg = preset_config("deepseek-v3")
    wl = ServingWorkload(requests=(RequestShape(prompt_len=1000, output_len=1000),), tpot_slo_s=0.1)
    precision = build_precision("bf16", "fp8", kv)
    block = build_serving_tasks(cfg, wl, precision).tasks["block"]
    want = 576 * wl.kv_context * precision.kv_bytes
    for k in (1, 4, 8):
        member = shard_of(block, k) if k > 1 else block
        assert member.mem_bytes_per_sample == pytest.approx(want, rel=1e-3)
    latents = 7168 * (1536 + 512 + 64)  # q_a and kv_a, 1 byte a weight in fp8
    assert shard_of(block, 8).weight_bytes == pytest.approx((block.weight_bytes - latents) / 8 + latents, rel=0.01)


def test_helix_export_refuses_a_model_with_dense_first_layers(tmp_path, capsys):
    from llm_planner.cli.main import main

    spec = H200_FLEET
    out = tmp_path / "ds.yaml"
    argv = ["plan", "--objective", "serving", "--cluster", str(spec), "--model", "deepseek-v3", "--weights", "fp8"]
    argv += ["--prompt-len", "1000", "--output-len", "1000", "--tpot-slo", "50 ms", "--no-baselines", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    helix = ["export", str(out), "--to", "helix", "--helix-cluster", "c.ini", "--helix-profiles", "p", "-o", "x.ini"]
    assert main(helix) == 2
    assert "model.dense_layers" in capsys.readouterr().err


KIMI_K2 = {  # moonshotai/Kimi-K2-Instruct's config.json shapes: DeepSeek-V3's layers, 384 experts, 64 heads
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "first_k_dense_replace": 1,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 131072,
    "moe_intermediate_size": 2048,
    "n_group": 1,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_attention_heads": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 64,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "topk_group": 1,
    "v_head_dim": 128,
    "vocab_size": 163840,
}


def test_kimi_k2_is_read_as_the_deepseek_v3_architecture_it_ships():
    """Kimi K2's config names model_type kimi_k2 and the architecture DeepseekV3ForCausalLM: planned as
    that architecture (1.03T parameters, 32B multiplied per token: "1T total, 32B activated"); a
    kimi_k2 config naming another architecture is refused naming the key."""
    from transformers import DeepseekV3Config

    cfg = hf_config.config_from_dict(KIMI_K2, "kimi.json")
    assert cfg.hf_model_type == "deepseek_v3" and cfg.first_dense_layers == 1 and cfg.num_experts == 384
    shapes = {k: v for k, v in KIMI_K2.items() if k not in ("architectures", "model_type")}
    assert count_parameters(cfg) == _hf_params(DeepseekV3Config(**shapes), "meta")
    assert count_parameters(cfg) == pytest.approx(1.03e12, rel=0.01)
    assert count_active_parameters(cfg) - 163840 * 7168 == pytest.approx(32e9, rel=0.02)
    with pytest.raises(GraphError, match="key 'architectures'.*kimi_k2.*DeepseekV3ForCausalLM"):
        hf_config.config_from_dict({**KIMI_K2, "architectures": ["KimiK2ForCausalLM"]}, "kimi.json")


def test_a_latent_rank_beyond_the_limit_is_refused_naming_the_file_and_key():
    from transformers import DeepseekV3Config

    data = DeepseekV3Config(**TINY).to_dict() | {"kv_lora_rank": 10**9}
    with pytest.raises(GraphError, match=r"x\.json: .*kv_lora_rank 1,000,000,000 is above the limit of 131,072"):
        hf_config.config_from_dict(data, "x.json")


def test_score_states_the_dense_layers_of_the_first_stage(capsys):
    from llm_planner.cli.main import main

    spec = H200_FLEET
    argv = ["score", "--cluster", str(spec), "--model", "deepseek-v3", "--replica", "2xhgx/h200[tp4]"]
    argv += ["--concurrency", "64", "--prompt-len", "1000", "--output-len", "1000", "--weights", "fp8"]
    assert main(argv) == 0, capsys.readouterr().err
    out = " ".join(capsys.readouterr().out.split())
    assert " + 3 dense" in out
