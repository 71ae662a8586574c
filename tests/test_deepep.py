"""Groups with data-parallel attention that move tokens with DeepEP's low-latency kernels
(`--deepep`, dpa<k>-deepep; llm_planner.cost.dp_attention): the dispatch and combine by hand,
their calls per chunk of a rank's tokens in the layer's pieces, DeepEP's published table, where
the shape is offered, its notation, and a DeepSeek-V3 plan over servers that runs it planned,
verified and exported."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from serving_fixtures import context

from llm_planner.cli.main import main
from llm_planner.core.precision import build_precision
from llm_planner.core.spec import load_cluster
from llm_planner.core.spec_links import LinkSpec
from llm_planner.cost.dp_attention import (
    DEEPEP_LL_CALL_S,
    FP8_SCALE_BYTES,
    MOE_DP_CHUNK,
    deepep_call_s,
    dp_layer_kernels,
)
from llm_planner.cost.iteration import Load
from llm_planner.cost.layer_pieces import layer_pieces
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.serving.layout import Segment, describe
from llm_planner.serving.layout_text import LayoutError, parse_layout
from llm_planner.serving.score import score_replica
from llm_planner.serving.workload import WorkloadError

QWEN = "qwen1.5-moe-a2.7b"  # 60 experts of 1408, top-4, hidden 2048
REPO = Path(__file__).resolve().parents[1]
H100 = str(REPO / "cluster_specs" / "h100-4x8.yaml")


def _dispatch_combine(ctx, degree: int):
    costs = ctx.cache.get("bigbox/big", degree, "dp-deepep")
    (kernel,) = [kr for kr in costs.kernels.kernels if kr.collective]
    return kernel, costs.kernels


def test_each_token_goes_to_its_top_k_experts_members_only(tmp_path):
    """dpa4-deepep over the two bigbox servers (2 GPUs each), fp16: per token of the group a member
    sends top-k/4 of a token's pairs to each other member, 1 of them in its server and 2 in the
    other (those weighted by how much slower the link between servers is), each pair h fp16 bytes
    out and h back, at the links' full bandwidth; two calls of DeepEP's fixed time per chunk of
    256 tokens a rank."""
    ctx = context(tmp_path, QWEN, deepep=True)
    sc, h, top_k = ctx.by_name["bigbox/big"], ctx.config.hidden_size, ctx.config.experts_per_token
    kernel, kernels = _dispatch_combine(ctx, 4)
    assert kernel.name == "dispatch_combine" and kernel.flops[0] == pytest.approx(2 * DEEPEP_LL_CALL_S)
    ratio = sc.intra_link.bw_bytes_per_s / sc.server_link.bw_bytes_per_s
    pairs = top_k / 4 * (1 / 4 + 2 / 4 * ratio)
    bytes_per_token = pairs * (h * 2 + h * 2)
    assert kernel.bytes[1] / kernels.link_bytes_per_s == pytest.approx(bytes_per_token / sc.intra_link.bw_bytes_per_s)
    assert kernel.chunk == MOE_DP_CHUNK * 4


def test_a_rank_past_the_chunk_pays_a_call_per_chunk_in_time_and_pieces(tmp_path):
    """The collective's fixed time is paid once up to 256 tokens a rank and once per 256 after:
    kernel_s and the layer's pieces (their maximum at b sequences) agree on both sides."""
    ctx = context(tmp_path, QWEN, deepep=True)
    kernel, kernels = _dispatch_combine(ctx, 4)
    one = Load(decodes=1.0, decode_keys=300.0)
    others = frozenset(kr.name for kr in kernels.kernels if kr is not kernel)
    pieces = layer_pieces(kernels, one, without=others)
    for b in (10, 4 * 256, 3 * 4 * 256):
        load = one.times(b)
        calls = max(1, b / (4 * 256))
        size = kernel.bytes[1] * b / kernels.link_bytes_per_s
        assert kernels.kernel_s(kernel, load) == pytest.approx(2 * DEEPEP_LL_CALL_S * calls + size)
        by_pieces = max(f + s * b for f, s in pieces) - kernels.overhead_s
        assert by_pieces == pytest.approx(kernels.kernel_s(kernel, load))


def test_fp8_experts_dispatch_fp8_with_their_scales():
    """Where the experts compute in fp8 (fp8 weights on an H100) the dispatch is h fp8 bytes and a
    scale per 128 values (DeepEP's fp8 dispatch), the combine h activation bytes."""
    cluster = load_cluster(H100)
    kind, cfg = cluster.kind("h100"), preset_config(QWEN)
    link = cluster.link(*[d for d in cluster.devices() if d.kind == "h100"][:2])
    p = build_precision("bf16", "fp8", None)
    kernels = dp_layer_kernels(cfg, p, kind, 2, link, all2all="deepep_low_latency").kernels
    (deepep,) = [kr for kr in kernels if kr.collective]
    h, top_k = cfg.hidden_size, cfg.experts_per_token
    by_hand = top_k / 2 * (1 / 2) * (h * (1 + FP8_SCALE_BYTES) + 2 * h) * kind.collective_bw_efficiency
    assert deepep.bytes[1] == pytest.approx(by_hand)


def test_deepeps_published_low_latency_times_within_20_percent():
    """The model's formula against every row of DeepEP's own table (benchmarks/data; the fixed time
    per call was fitted on these rows, so this guards the formula, not a prediction)."""
    ref = yaml.safe_load((REPO / "benchmarks" / "data" / "deepep_low_latency.yaml").read_text())
    nvlink, rdma = LinkSpec(bw_bytes_per_s=ref["nvlink_bytes_per_s"]), LinkSpec(bw_bytes_per_s=ref["rdma_bytes_per_s"])
    h, n = ref["hidden_size"], ref["gpus_per_server"]
    for row in ref["rows"]:
        k = row["ep"]
        span = (n, rdma) if k > n else None
        for pair_bytes, measured in ((h * (1 + FP8_SCALE_BYTES), row["dispatch_us"]), (2 * h, row["combine_us"])):
            model = deepep_call_s(pair_bytes, ref["top_k"], k, ref["tokens_per_rank"], nvlink, span) * 1e6
            assert 0.8 < model / measured < 1.2, (k, model, measured)


def test_it_is_offered_with_deepep_for_a_mixture_of_experts_only(tmp_path):
    plain, with_it = context(tmp_path, QWEN), context(tmp_path, QWEN, deepep=True)
    assert not any(a == "dp-deepep" for _, a in plain.by_name["bigbox/big"].shapes)
    assert (4, "dp-deepep") in with_it.by_name["bigbox/big"].shapes
    with pytest.raises(WorkloadError, match=r"--deepep \(dpa<k>-deepep\): llama2-7b has no experts"):
        context(tmp_path, "llama2-7b", deepep=True)
    with pytest.raises(WorkloadError, match="which --no-dp-attention turns off"):
        context(tmp_path, QWEN, deepep=True, dp_attention=False)
    with pytest.raises(WorkloadError, match=r"--no-dp-attention: llama2-7b has no experts \(a dense model\)"):
        context(tmp_path, "llama2-7b", dp_attention=False)


def test_the_notation_reads_and_writes_dpa_deepep(tmp_path):
    ctx = context(tmp_path, QWEN, deepep=True)
    layout = (Segment("bigbox/big", 4, 1, "dp-deepep"),)
    text = describe(layout, ctx.by_name)
    assert text == "bigbox/big: 1 stage x dpa4-deepep on 2 servers"
    assert parse_layout(text, ctx.by_name) == layout == parse_layout("1 x bigbox/big[dpa4-deepep]", ctx.by_name)
    with pytest.raises(LayoutError, match="offered with --deepep"):
        parse_layout(text, context(tmp_path, QWEN).by_name)
    with pytest.raises(LayoutError, match="-deepep goes with dpa<k>"):
        parse_layout("1 x bigbox/big[tp4-deepep]", ctx.by_name)


@pytest.fixture(scope="module")
def deepep_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deepep") / "deepseek.yaml"
    args = ["plan", "--cluster", H100, "--model", "deepseek-v3", "--objective", "serving", "--dtype", "bf16"]
    args += ["--weights", "fp8", "--kv-cache-dtype", "fp8", "--prompt-len", "1000", "--output-len", "1000"]
    assert main([*args, "--tpot-slo", "50 ms", "--deepep", "--exportable", "vllm", "-o", str(out)]) == 0
    return out


@pytest.mark.heavy
def test_deepseek_over_two_h100_servers_runs_dpa16_over_deepep_and_verifies(deepep_plan, capsys):
    """DeepSeek-V3 in fp8 fits no 8x H100 server: with DeepEP one dpa16 over two servers sends a
    token's pairs over the ports between them instead of gathering every token on all 16, and
    serves well over megatron's pipeline of two tp8 stages."""
    data = yaml.safe_load(deepep_plan.read_text())
    assert data["options"]["deepep"] is True
    reps = data["serving"]["replicas"]
    assert [seg for rep in reps for seg in rep["segments"]] == [
        {"class": "hgx/h100", "degree": 16, "stages": 1, "attention": "dp-deepep"}
    ]
    assert data["serving"]["tokens_per_s"] > 1.5 * data["baselines"]["megatron"]["tokens_per_s"]
    capsys.readouterr()
    assert main(["verify", str(deepep_plan)]) == 0
    assert main(["show", str(deepep_plan)]) == 0
    assert "dpa16-deepep" in capsys.readouterr().out


@pytest.mark.heavy
def test_deepseek_over_deepep_exports_the_engines_backends(deepep_plan, capsys):
    capsys.readouterr()
    assert main(["export", str(deepep_plan), "--to", "vllm"]) == 0
    vllm = " ".join(capsys.readouterr().out.replace("\\\n", " ").split())
    assert "--data-parallel-size 16 --enable-expert-parallel --all2all-backend deepep_low_latency" in vllm
    assert main(["export", str(deepep_plan), "--to", "sglang"]) == 0
    sglang = " ".join(capsys.readouterr().out.replace("\\\n", " ").split())
    assert "--enable-dp-attention --ep-size 16 --moe-a2a-backend deepep --deepep-mode auto" in sglang
    assert "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=128" in sglang


def test_a_rank_holds_no_more_decodes_than_deepeps_low_latency_buffer(tmp_path):
    """SGLang's DeepEP buffer takes a rank's decode batch whole, at most 1,024: the search keeps a
    dpa2-deepep group to 2,048 sequences in flight (the gather's dpa2 has no such limit)."""
    ctx = context(tmp_path, QWEN, deepep=True, max_batched_tokens=10**6)
    deepep, gather = (parse_layout(f"1 x bigbox/big[dpa2{a}]", ctx.by_name) for a in ("-deepep", ""))
    at = {
        (name, c): score_replica(ctx, layout, concurrency=c, micro_batches=1, layers=(24,)).within_token_budget
        for name, layout in (("deepep", deepep), ("gather", gather))
        for c in (2048, 2049)
    }
    assert at == {("deepep", 2048): True, ("deepep", 2049): False, ("gather", 2048): True, ("gather", 2049): True}
