"""Small clusters and contexts for the serving tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llm_planner.core.spec import load_cluster
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.serving.context import ServingContext, ServingOptions
from llm_planner.serving.workload import RequestShape, ServingWorkload

# Two kinds: two servers of two "big" GPUs, and one server of four "small" ones (numbers made up,
# of the order of an A100 and an L4), InfiniBand-like link between servers.
SMALL_FLEET = """
name: small-fleet
device_kinds:
  - {name: big, type: gpu, peak_flops: {fp16: 300 TFLOP/s}, mem_bytes: 16 GB, mem_bw_bytes_per_s: 2000 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us, step_overhead_s: 0.5 ms}
  - {name: small, type: gpu, peak_flops: {fp16: 120 TFLOP/s}, mem_bytes: 8 GB, mem_bw_bytes_per_s: 300 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us, step_overhead_s: 0.5 ms}
  - {name: host, type: cpu, peak_flops: {fp16: 2 TFLOP/s}, mem_bytes: 256 GB, mem_bw_bytes_per_s: 200 GB/s}
nodes:
  - {name: bigbox, count: 2, devices: {host: 1, big: 2},
     links: [{between: [big, big], bw_bytes_per_s: 300 GB/s, latency_s: 2 us}]}
  - {name: smallbox, devices: {host: 1, small: 4},
     links: [{between: [small, small], bw_bytes_per_s: 32 GB/s, latency_s: 5 us}]}
links:
  intra_node_default: {bw_bytes_per_s: 25 GB/s, latency_s: 10 us}
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
"""


# One server of eight H100s from the catalog: the new model families' plans (test_llama4, test_glm4_moe, ...)
ONE_HGX = """
name: one-hgx
device_kinds:
  - {name: h100, catalog: h100-sxm-80g}
nodes:
  - name: hgx
    hostname: hgx-0
    devices: {h100: 8}
    links:
      - {between: [h100, h100], bw_bytes_per_s: 450 GB/s, latency_s: 1 us}
links:
  intra_node_default: {bw_bytes_per_s: 25 GB/s, latency_s: 10 us}
"""


def hf_parameter_count(cfg: DecoderConfig, device: str = "meta") -> int:
    """The parameters transformers' own causal-LM class holds for cfg (built on `device`)."""
    import pytest

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from llm_planner.graph.hf_config import to_hf_config

    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(to_hf_config(cfg))
    return sum(p.numel() for p in model.parameters())


def write_fleet(tmp_path: Path, text: str = SMALL_FLEET) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def workload(prompt: int = 256, output: int = 128, tpot_s: float = 0.05) -> ServingWorkload:
    return ServingWorkload(requests=(RequestShape(prompt_len=prompt, output_len=output),), tpot_slo_s=tpot_s)


def context(
    tmp_path: Path, model: str = "llama2-7b", *, tpot_s: float = 0.05, prompt: int = 256, output: int = 128, **options
) -> ServingContext:
    cluster = load_cluster(write_fleet(tmp_path))
    return ServingContext(
        cluster, preset_config(model), workload(prompt, output, tpot_s), "fp16", ServingOptions(**options)
    )


# The sizes small_deepseek and small_glm share: 16 layers, 2048 wide, 32 experts of 704, top-4, one shared
_SMALL_MOE = dict(
    num_layers=16,
    hidden_size=2048,
    word_embed_dim=2048,
    intermediate_size=5632,
    vocab_size=32000,
    max_positions=4096,
    num_experts=32,
    experts_per_token=4,
    moe_intermediate_size=704,
    shared_expert_size=704,
)


def small_deepseek() -> DecoderConfig:
    """DeepSeek-V3's layout at 2.3B parameters (latent attention with its head widths, 2 dense first
    layers of 16, 32 experts of 704, top-4, one shared) that the small fleet holds in several layouts."""
    return dataclasses.replace(
        preset_config("deepseek-v3"),
        name="small-deepseek",
        first_dense_layers=2,
        num_heads=16,
        num_kv_heads=16,
        kv_lora_rank=256,
        q_lora_rank=512,
        **_SMALL_MOE,
    )


def small_glm() -> DecoderConfig:
    """GLM-4.5's layout at 2.5B parameters (grouped-query attention with q/k/v biases and per-head
    norms, heads wider than the hidden size, 1 dense first layer of 16, 32 experts of 704, top-4,
    one shared) that the small fleet holds in several layouts."""
    return dataclasses.replace(
        preset_config("glm-4.5"), name="small-glm", first_dense_layers=1, num_heads=24, num_kv_heads=4, **_SMALL_MOE
    )
