"""Data-parallel attention with the experts split over the group (llm_planner.cost.dp_attention):
its kernels and memory by hand, which groups offer it, the notation, and a DeepSeek-V3 plan that
runs it planned, verified, shown, exported and refused where nothing runs it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from serving_fixtures import context, small_deepseek, workload, write_fleet

from llm_planner.cli.main import main
from llm_planner.core.precision import build_precision
from llm_planner.core.spec import load_cluster
from llm_planner.cost.dp_attention import dp_layer_kernels
from llm_planner.cost.iteration import Load, layer_kernels, sublayer_kernels
from llm_planner.export.engine_args import ServingExportError
from llm_planner.export.serving import build_engines
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.serving.baselines import engineer_options
from llm_planner.serving.context import ServingContext, ServingOptions
from llm_planner.serving.engines import StageForm, engine_refusal
from llm_planner.serving.layout import Segment, describe, runs_somewhere
from llm_planner.serving.layout_text import LayoutError, parse_layout
from llm_planner.serving.plan_file import load_serving_plan
from llm_planner.serving.score import score_replica
from llm_planner.serving.search import candidate_layouts
from llm_planner.serving.verify_replica import derive

QWEN = "qwen1.5-moe-a2.7b"  # 60 experts of 1408, top-4, a shared expert of 5632, 16 heads of 128
H200 = str(Path(__file__).resolve().parents[1] / "cluster_specs" / "h200-2x8.yaml")


def test_a_layer_is_its_own_share_but_the_routed_experts(tmp_path):
    """Per member of dpa2: every kernel of one device but the routed experts at half the load
    (weights read whole), the routed experts of a tp2 member on all of it, and an all-gather plus a
    reduce-scatter of h fp16 bytes a token, each half of them over the link and one hop."""
    ctx = context(tmp_path, QWEN)
    sc = ctx.by_name["bigbox/big"]
    kind, link, cfg = sc.kind, sc.intra_link, ctx.config
    load = Load(decodes=6, decode_keys=6 * 300, prompt_tokens=40, prompt_keys=40 * 128)
    whole = layer_kernels(cfg, "fp16", kind, 1)
    mlp = sublayer_kernels(cfg, "fp16", kind, "mlp", 2, link)
    fixed = 2 * (kind.collective_call_s + link.latency_s)
    size = 2 * (1 / 2) * cfg.hidden_size * 2 * (6 + 40)
    by_hand = kind.overhead_s + fixed + size / (link.bw_bytes_per_s * kind.collective_bw_efficiency)
    by_hand += sum(whole.kernel_s(kr, load.times(0.5)) for kr in whole.kernels if kr.experts is None)
    by_hand += sum(mlp.kernel_s(kr, load) for kr in mlp.kernels if kr.experts is not None)
    assert dp_layer_kernels(cfg, "fp16", kind, 2, link).time_s(load) == pytest.approx(by_hand)
    # a W8A8 layer's fixed time is paid whole on each member: it runs every projection of the layer
    w8a8 = dataclasses.replace(kind, peak_flops=(*kind.peak_flops, ("fp8", 1e15)), w8a8_overhead_s=30e-6)
    fp8 = build_precision("fp16", "fp8", None)
    assert dp_layer_kernels(cfg, fp8, w8a8, 2, link).w8a8_s == pytest.approx(30e-6)


def test_a_group_over_servers_gathers_across_their_link(tmp_path):
    """dpa4 over the two bigbox servers (2 GPUs each): each collective moves 1/4 of the bytes over
    the server's link and 2/4 over the 12x slower link between servers, 1 hop on each."""
    ctx = context(tmp_path, QWEN)
    sc = ctx.by_name["bigbox/big"]
    intra, across, h = sc.intra_link, sc.server_link, ctx.config.hidden_size
    costs = ctx.cache.get("bigbox/big", 4, "dp")
    (gather,) = [kr for kr in costs.kernels.kernels if kr.collective]
    assert gather.flops[0] == pytest.approx(2 * (sc.kind.collective_call_s + intra.latency_s + across.latency_s))
    weighted = 1 / 4 + 2 / 4 * intra.bw_bytes_per_s / across.bw_bytes_per_s  # in the server link's bytes
    assert gather.bytes[1] == pytest.approx(2 * weighted * h * 2)
    assert costs.kv_bytes_per_seq == pytest.approx(ctx.cache.get("bigbox/big", 1).kv_bytes_per_seq / 4)


def test_a_member_holds_everything_whole_but_half_the_routed_experts(tmp_path):
    """qwen1.5-moe on dpa2 (vLLM's layout): q, k, v, o and their biases, the shared expert, router
    and norms whole, the routed experts split; each sequence's whole cache on one member (half of
    them each); the end parts whole."""
    ctx = context(tmp_path, QWEN)
    h, e, m, s, kv = 2048, 60, 1408, 5632, 2048
    attn = 2 * h * h + 2 * h * kv + (h + 2 * kv)
    whole = h * e + h + 2 * h + 3 * h * s  # router, shared expert gate, the two norms, the shared expert
    costs, one = ctx.cache.get("bigbox/big", 2, "dp"), ctx.cache.get("bigbox/big", 1)
    assert costs.weight_bytes["block"] == pytest.approx(2 * (attn + 3 * h * m * e / 2 + whole))
    assert costs.kv_bytes_per_seq == pytest.approx(one.kv_bytes_per_seq / 2)
    assert costs.weight_bytes["lm_head"] == one.weight_bytes["lm_head"]


def test_the_latent_cache_is_split_by_sequences_not_replicated(tmp_path):
    """MLA: a tp member holds every sequence's latent, a dpa member its own sequences' only; the
    dense first layers whole on every rank."""
    ctx = ServingContext(load_cluster(write_fleet(tmp_path)), small_deepseek(), workload(), "fp16", ServingOptions())
    one, tp, dp = (ctx.cache.get("smallbox/small", k, a) for k, a in ((1, "tp"), (4, "tp"), (4, "dp")))
    assert tp.kv_bytes_per_seq == pytest.approx(one.kv_bytes_per_seq)
    assert dp.kv_bytes_per_seq == pytest.approx(one.kv_bytes_per_seq / 4)
    assert dp.weight_bytes["dense"] == one.weight_bytes["dense"]  # a dense layer whole on each rank


def test_a_group_the_class_forms_only_for_dp_is_verified_as_the_search_scores_it(tmp_path):
    """With 2 KV heads the smallbox forms tp1-tp2 but dpa2-dpa4: dpa4 reads back from its text, and
    the verifier's own arithmetic gives the search's figures for it."""
    cfg = dataclasses.replace(preset_config(QWEN), num_kv_heads=2)
    ctx = ServingContext(load_cluster(write_fleet(tmp_path)), cfg, workload(), "fp16", ServingOptions())
    sc = ctx.by_name["smallbox/small"]
    assert (sc.degrees, sc.dp_degrees) == ((1, 2), (2, 4))
    layout = parse_layout("1 x smallbox/small[dpa4]", ctx.by_name)
    score = score_replica(ctx, layout, concurrency=8, micro_batches=1, layers=(24,))
    own = derive(ctx, layout, [24], 8, 1)
    assert (own.tpot_s, own.ttft_s) == pytest.approx((score.ev.tpot_s, score.ev.ttft_s))
    assert own.mem_bytes == pytest.approx(score.ev.mem_bytes)


def test_the_busiest_rank_holds_its_ceiling_share_of_the_sequences(tmp_path):
    """dpa4 with 5 sequences in flight: one rank holds 2, so each member's memory is charged as for
    8 (what the export sizes each rank for), by the search's costs and by the verifier alike."""
    ctx = context(tmp_path, QWEN)
    layout = parse_layout("1 x smallbox/small[dpa4]", ctx.by_name)
    costs = ctx.cache.of(layout[0])
    at = {c: costs.mem_bytes(layers=24, first=True, last=True, concurrency=c, micro_batch=c) for c in (5, 8, 9)}
    assert at[5] == pytest.approx(at[8]) and at[9] > at[8]
    assert derive(ctx, layout, [24], 5, 1).mem_bytes == pytest.approx((at[5],))


def test_each_rank_keeps_its_share_of_the_sequences_within_its_share_of_the_budget(tmp_path):
    """Prompt 256 and output 128: a sequence takes 1 + 2 = 3 tokens of an iteration. At a budget of 26, 8 in
    flight fit one scheduler (24 tokens) and each of dpa4's ranks (2 sequences, 6 tokens of its 7). At 28, 9
    fit one scheduler (27 tokens) but not dpa4's busiest rank (3 sequences, 9 tokens of its ceil(28 / 4) = 7),
    whose prompts would queue without end: refused for dpa4 only."""
    for budget, fits_tp, fits_dp in ((26, (True, False), (True, False)), (28, (True, True), (True, False))):
        ctx = context(tmp_path, QWEN, max_batched_tokens=budget)
        tp, dp = (ctx.replica(parse_layout(f"1 x smallbox/small[{g}]", ctx.by_name)) for g in ("tp4", "dpa4"))
        assert (tp.within_budget(8, 1), tp.within_budget(9, 1)) == fits_tp, budget
        assert (dp.within_budget(8, 1), dp.within_budget(9, 1)) == fits_dp, budget


def test_only_a_mixture_of_experts_whose_experts_split_offers_it(tmp_path):
    assert all(sc.dp_degrees == () for sc in context(tmp_path, "llama2-7b").classes)
    moe = context(tmp_path, QWEN)
    # two bigbox servers of 2: a group over both (4) too; one smallbox server of 4
    assert {sc.name: sc.dp_degrees for sc in moe.classes} == {"bigbox/big": (2, 4), "smallbox/small": (2, 4)}
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


def test_the_search_and_engineer_best_keep_it_to_a_whole_replica(tmp_path):
    """No engine runs data-parallel attention under a pipeline (nor the runtime at all): the
    search's candidates and engineer-best's layouts hold a dpaK group only as one stage alone."""
    ctx = context(tmp_path, QWEN, tpot_s=0.1)
    alone = [Segment("smallbox/small", 4, 1, "dp")]
    assert runs_somewhere(tuple(alone)) and not runs_somewhere((Segment("smallbox/small", 2, 2, "dp"),))
    assert not runs_somewhere((*alone, Segment("bigbox/big", 2, 1)))
    layouts = candidate_layouts(ctx) + [p.layout for found in engineer_options(ctx).values() for p, _ in found]
    with_dp = [layout for layout in layouts if any(seg.attention == "dp" for seg in layout)]
    assert with_dp and all(len(layout) == 1 and layout[0].stages == 1 for layout in with_dp)


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


@pytest.mark.heavy
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
    assert "256 experts, top-8, tensor-parallel, or split over dpaK groups with data-parallel attention" in flat
    assert "hgx-0/h200:0 .. hgx-0/h200:7 (dpa8)" in out


@pytest.mark.heavy
def test_deepseek_exports_the_engines_data_parallel_flags(deepseek_plan, capsys):
    rep = yaml.safe_load(deepseek_plan.read_text())["serving"]["replicas"][0]
    capsys.readouterr()
    assert main(["export", str(deepseek_plan), "--to", "vllm"]) == 0
    vllm = capsys.readouterr().out
    assert "--tensor-parallel-size 1 --data-parallel-size 8 --enable-expert-parallel" in vllm
    assert f"--max-num-seqs {-(-rep['concurrency'] // 8)}" in vllm  # per data-parallel rank
    row = next(line.split() for line in vllm.splitlines() if line.startswith("# r0c0 "))
    assert main(["export", str(deepseek_plan), "--to", "vllm", "--format", "json"]) == 0
    kv = json.loads(capsys.readouterr().out)["engines"][0]["kv_tokens"]
    assert row[3] == "dp8" and int(row[7]) == 8 * kv  # the header: 8 ranks, the engine's KV (a rank's times 8)
    assert main(["export", str(deepseek_plan), "--to", "sglang"]) == 0
    assert "--tp-size 8 --dp-size 8 --enable-dp-attention --ep-size 8" in capsys.readouterr().out
    assert main(["export", str(deepseek_plan), "--to", "megatron"]) == 2
    assert "Megatron-LM runs tensor-parallel groups only" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attention": "dp-deepep"}, "segments[0].attention: 'dp-deepep': the runtime moves the experts' tokens"),
        ({"micro_batches": 2}, "micro_batches: 2: a data-parallel stage runs one micro-batch per member"),
        ({"concurrency": 5}, "concurrency: 5 sequences leave some of the 8 members without one"),
    ],
)
def test_launch_refuses_data_parallel_attention_it_cannot_run_naming_the_field(
    deepseek_plan, tmp_path, capsys, change, message
):
    """The runtime serves a dpaK replica (tests/test_serve_mpi.py) but not DeepEP's all-to-all, several
    micro-batches, or fewer sequences than members: each refused before anything starts, naming the field."""
    data = yaml.safe_load(deepseek_plan.read_text())
    rep = data["serving"]["replicas"][0]
    if "attention" in change:
        rep["segments"][0]["attention"] = change["attention"]
    else:
        rep.update(change)
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["launch", str(edited), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    assert f"serving.replicas[0].{message}" in capsys.readouterr().err


def test_a_group_over_two_servers_exports_each_hosts_ranks(deepseek_plan, tmp_path):
    """The plan's replica rewritten as one dpa16 over both servers (the export path alone: the
    rewritten figures are not the model's, so `export` itself would refuse the file): vLLM's head
    runs ranks 0-7 and serves the API, the other host ranks 8-15 headless; SGLang one command per
    node rank; vLLM over Ray is refused naming the option that runs it."""
    data = yaml.safe_load(deepseek_plan.read_text())
    rep = data["serving"]["replicas"][0]
    both = [rep["devices"][0][0] + rep["devices"][1][0]]
    rep.update(count=1, pattern="hgx/h200: 1 stage x dpa16 on 2 servers", devices=[both])
    rep["segments"][0]["degree"] = 16
    data["inputs"]["cluster"] = H200
    edited = tmp_path / "dpa16.yaml"
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    plan, cluster = load_serving_plan(edited), load_cluster(H200)
    vllm = _flat(vllm_script(build_engines(plan, cluster, "vllm")))
    assert "--data-parallel-size 16 --enable-expert-parallel" in vllm
    assert "--data-parallel-size-local 8 --data-parallel-address hgx-0" in vllm
    assert "--headless --data-parallel-start-rank 8" in vllm
    sglang = _flat(sglang_script(build_engines(plan, cluster, "sglang")))
    assert "--tp-size 16 --dp-size 16 --enable-dp-attention --ep-size 16" in sglang
    assert "--nnodes 2 --node-rank 1 --dist-init-addr hgx-0:" in sglang
    with pytest.raises(ServingExportError, match="export with --vllm-multinode native"):
        build_engines(plan, cluster, "vllm", multinode="ray")


def _flat(script: str) -> str:
    """A script's words on one line, its continued lines joined."""
    return " ".join(script.replace("\\\n", " ").split())
