"""The placement planner's decoder layers timed by the serving kernel model (llm_planner.cost.task_pieces):
a layer task's time by hand on a small decoder, on one device and on groups of 2 and 4; its pieces
against the kernels' sum at every batch; which tasks keep their roofline."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_instances import kind, make_cluster

from llm_planner.core.spec import LinkSpec
from llm_planner.cost import measured
from llm_planner.cost import profile as prof
from llm_planner.cost import roofline as cost
from llm_planner.cost.iteration import KAPPA, SUBLAYERS, layer_kernels, sublayer_kernels
from llm_planner.cost.task_pieces import decoder_load, placement_task_pieces, sample_load
from llm_planner.graph.decoder_graph import build_decoder_graph
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.ir import TaskGraph
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.placement.problem import ProblemError, build_problem

# h 256, 4 heads of 64 (no grouped-query attention), gated MLP of 512, RMSNorm, rotary, no biases
TINY = DecoderConfig(
    name="tiny-llama",
    model_type="llama",
    num_layers=2,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=4,
    intermediate_size=512,
    vocab_size=1000,
    max_positions=512,
    tie_word_embeddings=False,
)
PEAK, BW, OVERHEAD, CALL, LATENCY = 100e12, 1e12, 5e-6, 20e-6, 1e-6
LINK_BW, SHARE = 100e9, 0.5  # the link, and the share of it the collectives' bytes reach


def _cluster(gpus: int = 4):
    g = kind("g", "gpu", flops=PEAK, mem_bytes=80e9, mem_bw=BW, overhead_s=OVERHEAD)
    g |= {"collective_overhead_s": CALL, "collective_efficiency": SHARE}
    return make_cluster([g], [{"g": gpus}], bw=LINK_BW, latency_s=LATENCY)


def _graph(config: DecoderConfig = TINY, phase: str = "decode", seq_len: int = 100) -> TaskGraph:
    return build_decoder_graph(config, phase=phase, seq_len=seq_len, granularity="block", dtype="fp16")


def _corner(c: float, m: float) -> float:
    return max(c, m, KAPPA * (c + m))


# One decode step at a context of 100 keys, fp16 (2 bytes), per member of a group of k (the kernel
# model's docstring). Parameters of the linear layers: q, k, v, o 4 * 256 * 256 = 262,144 and gate,
# up, down 3 * 256 * 512 = 393,216, 655,360 in all, split k ways. Activations in and out of the four
# projections per token: (256 + 768 / k) + (256 / k + 256) + (256 + 1024 / k) + (512 / k + 256).
# Decode attention per sequence: 4 * (256 / k) FLOPs and 2 * (256 / k) * 2 bytes per key, and
# q, k, v, o, 2 * (512 + 512) / k * 2 bytes. Elementwise: two RMSNorm scales (512 * 2 bytes) read
# once; per token two norms (4 * 256), two residual adds (6 * 256), rotary 2 * 512 / k, the
# activation 1536 / k, 2 bytes each. All-reduces: two per layer, each the kind's 20 us plus
# 2 (k - 1) latencies of 1 us, and 2 (k - 1) / k * 256 * 2 bytes per token over 100 GB/s.
BY_HAND = {  # k: (weight bytes, linear FLOPs/token, linear bytes/token, attention FLOPs and bytes/sequence,
    #             elementwise bytes per sequence, all-reduce fixed s and bytes per sequence)
    1: (1_310_720, 1_310_720, 7_168, 102_400, 104_448, 10_240, 0.0, 0),
    2: (655_360, 655_360, 4_608, 51_200, 52_224, 7_680, 44e-6, 1_024),
    4: (327_680, 327_680, 3_328, 25_600, 26_112, 6_400, 52e-6, 1_536),
}


def _by_hand_s(k: int, batch: int) -> float:
    weights, lin_flops, lin_bytes, att_flops, att_bytes, elem, ar_fixed, ar_bytes = BY_HAND[k]
    linear = _corner(lin_flops * batch / PEAK, (weights + lin_bytes * batch) / BW)
    attention = _corner(att_flops * batch / PEAK, att_bytes * batch / BW)
    elementwise = (1_024 + elem * batch) / BW
    reduce = ar_fixed + ar_bytes * batch / (LINK_BW * SHARE) if k > 1 else 0.0
    return OVERHEAD + linear + attention + elementwise + reduce


@pytest.mark.parametrize("k,device", [(1, "node0/g:0"), (2, "node0/g:2-3"), (4, "node0/g:0-3")])
def test_a_layer_task_costs_its_kernels_by_hand(k, device):
    problem = build_problem(_graph(), _cluster(), dtype="fp16", max_tp=4, batch_size=8)
    d = problem.device_names.index(device)
    for name in ("block.0", "block.1"):
        i = [t.name for t in problem.graph.tasks].index(name)
        # 1 and 8: memory-bound; 256 and 512: the linear layers compute-bound (the corner near 221 on one device)
        for batch in (1, 8, 64, 256, 512):
            assert problem.task_time(i, d, batch) == pytest.approx(_by_hand_s(k, batch), rel=1e-12)
        assert problem.task_time(i, d, 0) == 0.0


@pytest.mark.parametrize("phase,seq_len", [("decode", 100), ("prefill", 100), ("prefill", 7)])
def test_a_layer_task_is_the_serving_kernel_models_layer_time(phase, seq_len):
    cluster = _cluster()
    problem = build_problem(_graph(phase=phase, seq_len=seq_len), cluster, dtype="fp16", max_tp=4)
    link = LinkSpec(bw_bytes_per_s=LINK_BW, latency_s=LATENCY)
    i = [t.name for t in problem.graph.tasks].index("block.1")
    per_sequence = sample_load(phase, seq_len)
    for device, k in (("node0/g:1", 1), ("node0/g:0-1", 2), ("node0/g:0-3", 4)):
        kernels = layer_kernels(TINY, "fp16", cluster.kind("g"), k, link if k > 1 else None)
        for batch in (1, 3, 16, 100):
            expected = kernels.time_s(per_sequence.times(batch))
            assert problem.task_time(i, problem.device_names.index(device), batch) == pytest.approx(expected, rel=1e-12)


def test_the_graphs_layer_flops_are_the_kernel_models():
    for phase, seq_len in (("decode", 100), ("prefill", 100)):
        graph = _graph(phase=phase, seq_len=seq_len)
        assert decoder_load(graph, "fp16").layers == {"block.0": "block", "block.1": "block"}
    prefill = _graph(phase="prefill", seq_len=100)
    # 2 * 655,360 per token on 100 tokens, 4 * 256 per key over 100 * 101 / 2 causal keys
    assert prefill.task("block.0").flops_per_sample == 2 * 655_360 * 100 + 4 * 256 * 5050


def test_the_two_sublayers_kernels_are_the_layers():
    link = LinkSpec(bw_bytes_per_s=LINK_BW, latency_s=LATENCY)
    g = _cluster().kind("g")
    for config in (TINY, preset_config("gpt2"), preset_config("opt-350m")):
        for k in (1, 2, 4):
            whole = layer_kernels(config, "fp16", g, k, link)
            parts = [sublayer_kernels(config, "fp16", g, part, k, link) for part in SUBLAYERS]
            for kernel in whole.kernels:
                same = [kr for p in parts for kr in p.kernels if kr.name == kernel.name]
                assert [sum(v) for v in zip(*(kr.flops for kr in same))] == pytest.approx(kernel.flops, rel=1e-12)
                assert [sum(v) for v in zip(*(kr.bytes for kr in same))] == pytest.approx(kernel.bytes, rel=1e-12)
    # the attention sublayer has no MLP: only its heads need to divide k
    odd_mlp = dataclasses.replace(TINY, intermediate_size=510)
    assert sublayer_kernels(odd_mlp, "fp16", g, "attn", 4, link).time_s(sample_load("decode", 10)) > 0
    with pytest.raises(cost.CostError, match="mlp sublayer of tiny-llama cannot run on a tensor-parallel group of 4"):
        sublayer_kernels(odd_mlp, "fp16", g, "mlp", 4, link)


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_sublayer_tasks_are_their_kernels_sums(phase):
    cluster = _cluster()
    graph = build_decoder_graph(TINY, phase=phase, seq_len=64, granularity="sublayer", dtype="fp16")
    problem = build_problem(graph, cluster, dtype="fp16", max_tp=4)
    link = LinkSpec(bw_bytes_per_s=LINK_BW, latency_s=LATENCY)
    per_sequence = sample_load(phase, 64)
    for part in SUBLAYERS:
        i = [t.name for t in graph.tasks].index(f"block.1.{part}")
        for device, k in (("node0/g:3", 1), ("node0/g:0-1", 2), ("node0/g:0-3", 4)):
            kernels = sublayer_kernels(TINY, "fp16", cluster.kind("g"), part, k, link if k > 1 else None)
            for batch in (1, 5, 300):
                expected = kernels.time_s(per_sequence.times(batch))
                d = problem.device_names.index(device)
                assert problem.task_time(i, d, batch) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    config=st.sampled_from([TINY, preset_config("gpt2"), preset_config("llama3-8b")]),
    phase=st.sampled_from(["decode", "prefill"]),
    seq_len=st.integers(1, 512),
    part=st.sampled_from(["block", *SUBLAYERS]),
    k=st.sampled_from([1, 2, 4]),
    batches=st.lists(st.integers(1, 4096), min_size=1, max_size=8),
)
def test_layer_pieces_are_the_kernels_sum_at_every_batch(config, phase, seq_len, part, k, batches):
    granularity = "block" if part == "block" else "sublayer"
    one = dataclasses.replace(config, num_layers=1)
    graph = build_decoder_graph(one, phase=phase, seq_len=seq_len, granularity=granularity, dtype="fp16")
    kind_spec = _cluster().kind("g")
    link = LinkSpec(bw_bytes_per_s=LINK_BW, latency_s=LATENCY)
    decoder = decoder_load(graph, "fp16")
    task = graph.task("block.0" if part == "block" else f"block.0.{part}")
    pieces = placement_task_pieces(task, kind_spec, k, link, "fp16", decoder)
    group_link = link if k > 1 else None
    if part == "block":
        kernels = layer_kernels(one, "fp16", kind_spec, k, group_link)
    else:
        kernels = sublayer_kernels(one, "fp16", kind_spec, part, k, group_link)
    assert all(f >= 0 and s >= 0 for f, s in pieces)  # what the bounds' fastest-time rule needs
    for b in batches:
        exact = kernels.time_s(decoder.per_sample.times(b))
        assert cost.evaluate_pieces(pieces, b) == pytest.approx(exact, rel=1e-9)


def test_end_parts_and_other_graphs_keep_their_roofline():
    cluster = _cluster()
    graph = _graph()
    problem = build_problem(graph, cluster, dtype="fp16", max_tp=2)
    link = cluster.link(*cluster.devices()[:2])
    g = cluster.kind("g")
    for i, task in enumerate(graph.tasks):
        if task.label("role") == "block":
            continue
        for d, device in enumerate(problem.devices):
            if problem.supported[i, d]:
                roofline = cost.group_task_time_pieces(task, g, device.degree, link, "fp16")
                assert problem.task_time(i, d, 5) == pytest.approx(cost.evaluate_pieces(roofline, 5), rel=1e-12)
    # a task that calls itself a block in a graph no decoder builder made: its roofline
    block = dataclasses.replace(graph.task("block.0"), name="t")
    plain = build_problem(TaskGraph(name="plain", tasks=(block,), edges=()).validate(), cluster, dtype="fp16")
    assert plain.task_time(0, 0, 5) == pytest.approx(cost.estimate_task_time_s(block, g, "fp16", 5), rel=1e-12)
    assert decoder_load(graph, "fp32") is None  # a problem of another dtype than the graph's: the rooflines


def test_an_edited_layer_task_keeps_its_roofline_with_a_warning(caplog):
    graph = _graph()
    edited = dataclasses.replace(graph.task("block.1"), flops_per_sample=graph.task("block.1").flops_per_sample * 2)
    graph = dataclasses.replace(graph, tasks=tuple(edited if t.name == "block.1" else t for t in graph.tasks))
    with caplog.at_level(logging.WARNING, logger="llm_planner.cost.task_pieces"):
        problem = build_problem(graph, _cluster(), dtype="fp16")
    assert "block.1" in caplog.text and "roofline" in caplog.text
    i = [t.name for t in graph.tasks].index("block.1")
    roofline = cost.estimate_task_time_s(edited, _cluster().kind("g"), "fp16", 8)
    assert problem.task_time(i, 0, 8) == pytest.approx(roofline, rel=1e-12)
    assert problem.task_time(i - 1, 0, 8) == pytest.approx(_by_hand_s(1, 8), rel=1e-12)


def test_a_malformed_decoder_meta_is_a_problem_error_naming_it():
    graph = _graph()
    meta = tuple((key, {"name": "x"} if key == "decoder_config" else v) for key, v in graph.meta)
    with pytest.raises(ProblemError, match="meta decoder_config"):
        build_problem(dataclasses.replace(graph, meta=meta), _cluster(), dtype="fp16")
    meta = tuple((key, -3 if key == "seq_len" else v) for key, v in graph.meta)
    with pytest.raises(ProblemError, match="seq_len a positive integer"):
        build_problem(dataclasses.replace(graph, meta=meta), _cluster(), dtype="fp16")


def test_a_measured_share_plus_ring_collectives_pays_the_kinds_call_overhead():
    graph = _graph()
    cluster = _cluster(2)
    key = measured.task_key(graph, graph.task("block.0"))
    profile = prof.Profile(
        cluster="test",
        model={"name": "tiny-llama"},
        settings={"batch_sizes": [1, 2, 4]},
        devices={"g": ["node0/g:0"]},
        tasks={"g": {f"{key}@tp2": prof.task_timing("block.0", [1, 2, 4], [1e-4 + 2e-5 * b for b in (1, 2, 4)], 3)}},
    )
    problem = build_problem(graph, cluster, dtype="fp16", max_tp=2, profile=profile)
    d = problem.device_names.index("node0/g:0-1")
    i = [t.name for t in graph.tasks].index("block.0")
    # the share as measured, then two all-reduces: 20 us per call, 2 latencies, 256 * 2 bytes per token
    ring = 2 * (CALL + 2 * LATENCY) + 2 * (2 * 1 / 2 * 256 * 2) * 3 / (LINK_BW * SHARE)
    assert problem.task_time(i, d, 3) == pytest.approx(1e-4 + 2e-5 * 3 + ring, rel=1e-9)


def test_a_group_the_layer_does_not_split_over_is_a_cost_error():
    graph = _graph()
    link = LinkSpec(bw_bytes_per_s=LINK_BW, latency_s=LATENCY)
    with pytest.raises(cost.CostError, match="tensor-parallel group of 3"):
        placement_task_pieces(graph.task("block.0"), _cluster().kind("g"), 3, link, "fp16", decoder_load(graph, "fp16"))


@pytest.mark.milp
@pytest.mark.parametrize(
    "objective,phase",
    [("latency", "decode"), ("latency", "prefill"), ("throughput", "decode"), ("throughput", "prefill")],
)
def test_bounds_stay_below_the_brute_force_optimum_and_the_milp_reaches_it(objective, phase):
    """A one-layer decoder on two GPUs and their group, its layer timed by the kernel model: the
    lower bound (with and without the partition bound's stand-ins) is below the optimum that
    enumeration finds, which the exact MILP reaches, and MILP-SPLIT's bound too."""
    from unittest import mock

    from milp_brute_force import brute_force

    from llm_planner.placement.bounds import partition
    from llm_planner.placement.bounds.combined import lower_bound
    from llm_planner.placement.options import SolveOptions
    from llm_planner.placement.solve import solve

    graph = _graph(dataclasses.replace(TINY, num_layers=1), phase=phase, seq_len=64)
    problem = build_problem(graph, _cluster(2), objective=objective, batch_size=2, max_shards=2, max_tp=2)
    best = brute_force(problem)
    assert problem.has_groups and 0 < best < math.inf
    assert lower_bound(problem) <= best * (1 + 1e-9)
    with mock.patch.object(partition, "MAX_PARTITIONS", 0):
        assert lower_bound(problem) <= best * (1 + 1e-9)
    milp = solve(problem, SolveOptions(solver="milp", rel_gap=1e-7, time_limit_s=60.0))
    assert milp.objective_s == pytest.approx(best, rel=1e-5) and milp.lower_bound_s <= best * (1 + 1e-9)
    split = solve(problem, SolveOptions(solver="milp-split"))
    assert best * (1 - 1e-9) <= split.objective_s and split.lower_bound_s <= best * (1 + 1e-9)
