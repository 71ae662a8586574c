"""serving-profile/2: measured parts of a decoder layer per kind and tensor-parallel degree, the kernel
model for the parts it lacks; version 1 still read; malformed files refused naming file and field; the
serving bounds still hold over plans made with such a profile."""

from __future__ import annotations

import copy

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.core.precision import build_precision
from llm_planner.cost.profile_tables import AttnGrid
from llm_planner.cost.serving_profile import ServingProfileError, parse_serving_profile
from llm_planner.serving.bound import tokens_upper_bound
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.layer_time import MeasuredLayerTime, PartsLayerTime, RooflineLayerTime
from llm_planner.serving.layout import Segment
from llm_planner.serving.optimistic import OptimisticTokens
from llm_planner.serving.workload import RequestShape, ServingWorkload, WorkloadError

ONE_BOX = """name: one-box
device_kinds:
  - {name: g, type: gpu, peak_flops: {fp16: 165 TFLOP/s}, mem_bytes: 24 GB, mem_bw_bytes_per_s: 1000 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us}
nodes:
  - {name: box, devices: {g: 2}, links: [{between: [g, g], bw_bytes_per_s: 25 GB/s, latency_s: 10 us}]}
"""
LINEAR = [[0, 0.001], [64, 0.0012], [256, 0.003]]  # a fixed weight stream, then compute-bound
ALL_REDUCE = [[1024, 0.00002], [1048576, 0.0001]]
V2 = {
    "format": "serving-profile/2",
    "model": "gpt2",
    "dtype": "fp16",
    "source": "constructed",
    "kinds": {"g": {"tp": {1: {"linear_layer_s": LINEAR}, 2: {"linear_layer_s": LINEAR, "all_reduce_s": ALL_REDUCE}}}},
}
HIDDEN_BYTES = 768 * 2  # gpt2's hidden size in fp16: one token's all-reduce message


def _context(tmp_path, profile: dict | None, tpot_s: float = 0.05):
    (tmp_path / "c.yaml").write_text(ONE_BOX)
    path = None
    if profile is not None:
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(profile))
    wl = ServingWorkload(requests=(RequestShape(prompt_len=64, output_len=64),), tpot_slo_s=tpot_s)
    return build_context(
        str(tmp_path / "c.yaml"), "gpt2", wl, "fp16", ServingOptions(), None if path is None else str(path)
    )


def _lin(x: float) -> float:  # LINEAR by hand
    return 0.001 + 0.0002 * x / 64 if x <= 64 else 0.0012 + 0.0018 * (x - 64) / 192


def _model_s(costs, load, leave_out: set[str]) -> float:
    """The kernels the profile does not measure, and the overhead, straight from the kernel model."""
    k = costs.kernels
    return k.overhead_s + sum(k.kernel_s(kernel, load) for kernel in k.kernels if kernel.name not in leave_out)


def test_layer_time_at_b_is_the_linear_table_at_b_tokens_plus_the_models_other_parts(tmp_path):
    ctx = _context(tmp_path, V2)
    costs = ctx.cache.get("box/g", 1)
    assert isinstance(costs.layer_time, PartsLayerTime) and costs.layer_time.measured
    r = ctx.tasks.prefill_per_output
    assert r == 1.0  # E[P]/E[O] = 64/64: each sequence brings one prompt token per iteration
    for b in (1, 5, 32, 100, 300):
        load = ctx.tasks.per_sequence.times(b)
        expected = _lin(b * (1 + r)) + _model_s(costs, load, {"linear"})
        assert costs.layer_time(b) == pytest.approx(expected, rel=1e-9)
        assert costs.layer_time.load_s(load) == pytest.approx(expected, rel=1e-12)
    # elementwise included in the table: not charged again
    included = copy.deepcopy(V2)
    included["kinds"]["g"]["tp"][1]["linear_includes_elementwise"] = True
    costs2 = _context(tmp_path, included).cache.get("box/g", 1)
    load = ctx.tasks.per_sequence.times(10)
    assert costs2.layer_time(10) == pytest.approx(_lin(20) + _model_s(costs2, load, {"linear", "elementwise"}))


def test_a_mixed_iteration_reads_the_linear_table_once(tmp_path):
    costs = _context(tmp_path, V2).cache.get("box/g", 1)
    d, p = 16, 48
    mixed = costs.layer_load_s(d, p)
    assert costs.layer_time.parts["linear"](costs.tasks.per_sequence.times(1)) == pytest.approx(_lin(2))
    assert mixed < costs.layer_load_s(d, 0) + costs.layer_load_s(0, p)
    # the saving is the weight stream the table charges once, not twice: linear(d) + linear(p) - linear(d + p)
    saved = costs.layer_load_s(d, 0) + costs.layer_load_s(0, p) - mixed
    assert saved >= _lin(d) + _lin(p) - _lin(d + p) > 0.0009


def test_tensor_parallel_stages_take_the_profile_at_their_degree_and_the_model_otherwise(tmp_path):
    ctx = _context(tmp_path, V2)
    tp2 = ctx.cache.get("box/g", 2)
    assert isinstance(tp2.layer_time, PartsLayerTime)
    for b in (1, 7, 64):
        load = ctx.tasks.per_sequence.times(b)
        tokens = 2 * b
        message = tokens * HIDDEN_BYTES
        all_reduce = 0.00002 + 0.00008 * (message - 1024) / (1048576 - 1024)
        expected = _lin(tokens) + 2 * all_reduce + _model_s(tp2, load, {"linear", "all_reduce"})
        assert tp2.layer_time(b) == pytest.approx(expected, rel=1e-9)
    only_one = copy.deepcopy(V2)
    del only_one["kinds"]["g"]["tp"][2]
    ctx1 = _context(tmp_path, only_one)
    assert isinstance(ctx1.cache.get("box/g", 2).layer_time, RooflineLayerTime)
    assert isinstance(ctx1.cache.get("box/g", 1).layer_time, PartsLayerTime)
    other_kind = copy.deepcopy(V2)  # g's tables at a degree the stage does not run, another kind's at 1
    other_kind["kinds"] = {"h": other_kind["kinds"]["g"], "g": {"tp": {4: {"linear_layer_s": LINEAR}}}}
    assert isinstance(_context(tmp_path, other_kind).cache.get("box/g", 1).layer_time, RooflineLayerTime)


def test_the_measured_time_is_linear_between_its_breakpoints(tmp_path):
    grid = [[b, c, 1e-6 * b * (1 + c / 100)] for b in (1, 64, 512) for c in (64, 1024)]
    profile = copy.deepcopy(V2)
    profile["kinds"]["g"]["tp"][2]["attn_decode_s"] = grid
    ctx = _context(tmp_path, profile)
    t = ctx.cache.get("box/g", 2).layer_time
    points = [x for x in t.breakpoints if x < 600]
    assert {32.0, 128.0} <= set(points)  # the linear table's sizes over 2 tokens per sequence
    for x0, x1 in zip(points, points[1:]):
        mid = (x0 + x1) / 2
        assert t(mid) == pytest.approx((t(x0) + t(x1)) / 2, rel=1e-9)
        assert t(mid) == pytest.approx(t.load_s(ctx.tasks.per_sequence.times(mid)), rel=1e-9)
    assert t.least(1, 600) == pytest.approx(min(t(x) for x in [1, *(x for x in points if x > 1), 600]))


def test_the_attention_grid_is_bilinear_and_extended_past_its_contexts():
    g = AttnGrid(batches=(1, 3), contexts=(100, 200), seconds=((1.0, 3.0), (2.0, 6.0)))
    assert g.at(1, 100) == 1.0 and g.at(3, 200) == 6.0
    assert g.at(2, 150) == pytest.approx((2.0 + 4.0) / 2)  # 2 at context 100, 4 at 200
    assert g.at(3, 300) == pytest.approx(9.0)  # the context pair extended: 3 + (6 - 3) * 2
    assert g.at(1, 0) == 0.0  # 1 - 1 = 0 at context 0, floored
    assert g.at_context(150).breakpoints()[:2] == (0.0, 1)  # the batch table's extended end reaches 0 at 0


def test_version_1_still_reads_and_applies_to_single_devices_only(tmp_path):
    v1 = {
        "format": "serving-profile/1",
        "model": "gpt2",
        "dtype": "fp16",
        "kinds": {"g": {"decode_layer_s": [[1, 0.001], [64, 0.002]], "prefill_layer_s": [[0, 0.0], [64, 0.001]]}},
    }
    p = parse_serving_profile(v1)
    assert p.version == 1 and p.layer_time_s("g", 64, 64) == pytest.approx(0.003)
    ctx = _context(tmp_path, v1)
    assert isinstance(ctx.cache.get("box/g", 1).layer_time, MeasuredLayerTime)
    assert isinstance(ctx.cache.get("box/g", 2).layer_time, RooflineLayerTime)
    assert ctx.cache.get("box/g", 1).layer_time(64) == pytest.approx(0.003)


def _v2_with(entry: dict | None = None, degree=1, **top) -> dict:
    data = copy.deepcopy({**V2, **top})
    if entry is not None:
        data["kinds"]["g"]["tp"] = {degree: entry}
    return data


@pytest.mark.parametrize(
    "data, message",
    [
        (_v2_with({}), "kinds.g.tp.1: expected at least one of linear_layer_s"),
        (
            _v2_with({"linear_layer_s": LINEAR, "decode_layer_s": LINEAR}),
            "kinds.g.tp.1: unknown key(s) 'decode_layer_s'",
        ),
        (_v2_with({"linear_layer_s": LINEAR}, degree=0), "kinds.g.tp: degree 0 is not an integer from 1"),
        (_v2_with({"linear_layer_s": LINEAR}, degree="two"), "kinds.g.tp: degree 'two' is not an integer"),
        (_v2_with({"all_reduce_s": ALL_REDUCE}), "kinds.g.tp.1.all_reduce_s: a single device runs no all-reduce"),
        (_v2_with({"attn_decode_s": LINEAR}), "kinds.g.tp.1.attn_decode_s: expected a list of at least four"),
        (
            _v2_with({"attn_decode_s": [[1, 8, 1.0], [2, 8, 1.0], [1, 16, 1.0], [3, 16, 1.0]]}),
            "kinds.g.tp.1.attn_decode_s: not a full grid",
        ),
        (
            _v2_with({"attn_decode_s": [[1, 8, 1.0], [2, 8], [1, 16, 1.0], [2, 16, 1.0]]}),
            "kinds.g.tp.1.attn_decode_s[1]: expected [batch, context, seconds]",
        ),
        (
            _v2_with({"linear_layer_s": [[4, 1.0], [2, 1.0]]}),
            "kinds.g.tp.1.linear_layer_s[1]: sizes must increase",
        ),
        (
            _v2_with(
                {
                    "attn_decode_s": [[1, 8, 1.0], [2, 8, 1.0], [1, 16, 1.0], [2, 16, 1.0]],
                    "linear_includes_elementwise": True,
                }
            ),
            "kinds.g.tp.1.linear_includes_elementwise: given without linear_layer_s",
        ),
        (_v2_with({"linear_layer_s": LINEAR, "linear_includes_elementwise": "yes"}), "linear_includes_elementwise"),
        (_v2_with(kinds={"g": {"linear_layer_s": LINEAR}}), "kinds.g.tp: missing required field"),
        (_v2_with(format="serving-profile/3"), "format: unknown format 'serving-profile/3'"),
        (_v2_with({"linear_layer_s": [[1, "3 ms"], [2, 1.0]]}), "linear_layer_s[0]: seconds must be a number, got"),
        (_v2_with({"linear_layer_s": LINEAR}, dtype="fp9"), "dtype: unknown dtype 'fp9' (known: fp32, tf32"),
        (_v2_with({"linear_layer_s": [[1, "-1e-3"], [2, 1.0]]}), "linear_layer_s[0]: seconds must be a finite number"),
    ],
)
def test_malformed_version_2_profiles_are_refused_naming_the_file_and_field(data, message):
    with pytest.raises(ServingProfileError) as info:
        parse_serving_profile(data, source="p.yaml")
    assert str(info.value).startswith("p.yaml: ") and message in str(info.value), str(info.value)


def test_seconds_with_an_exponent_and_no_point_are_read_as_numbers(tmp_path):
    """YAML 1.1 reads 3e-04 as a string; the profile takes it as the number it spells, as the cluster
    spec does."""
    text = yaml.safe_dump(_v2_with({"linear_layer_s": LINEAR})).replace(f"- {LINEAR[0][1]}", "- 3e-04", 1)
    assert "3e-04" in text
    profile = parse_serving_profile(yaml.safe_load(text), source="p.yaml")
    assert profile.kinds[0].degrees[0].linear.seconds[0] == 3e-04


def test_a_time_that_falls_with_more_tokens_is_raised_to_the_one_before(caplog):
    data = _v2_with({"linear_layer_s": [[1, 0.001], [64, 0.001], [128, 0.0005], [256, 0.003]]})
    profile = parse_serving_profile(data, source="p.yaml")
    assert profile.kinds[0].degrees[0].linear.seconds == (0.001, 0.001, 0.001, 0.003)
    assert "p.yaml: kinds.g.tp.1.linear_layer_s: 1 of 4 times fall below the one before them" in caplog.text


def test_a_malformed_profile_file_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(ONE_BOX)
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump(_v2_with({"all_reduce_s": ALL_REDUCE})))
    argv = ["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", "gpt2", "--objective", "serving"]
    argv += ["--prompt-len", "64", "--output-len", "64", "--tpot-slo", "50 ms", "--profile", str(bad)]
    assert main([*argv, "-o", str(tmp_path / "plan.yaml")]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "p.yaml: kinds.g.tp.1.all_reduce_s" in err and "Traceback" not in err


@pytest.mark.parametrize("tpot_s", [0.0025, 0.02, 1.0])
def test_the_bounds_hold_over_replicas_made_with_a_version_2_profile(tmp_path, tpot_s):
    """As test_serving's measured-profile check: every replica's best stays under the search's
    optimistic value and the first two bounds, on one GPU and on a group of two. A table whose time
    falls with more tokens (extended past its end, it would make a layer free) has the time raised to
    the one before, and a warning says so."""
    falling = copy.deepcopy(V2)
    falling["kinds"]["g"]["tp"][1]["linear_layer_s"] = [[1, 0.001], [64, 0.001], [128, 0.0005]]
    for profile in (V2, falling):
        ctx = _context(tmp_path, profile, tpot_s)
        upper = tokens_upper_bound(ctx.cache, ctx.classes, tpot_s, tokens_per_s=float("inf"))
        for layout in ((Segment("box/g", 1, 1),), (Segment("box/g", 2, 1),), (Segment("box/g", 1, 2),)):
            ev = ctx.replica(layout).best([1, 2], refine=True)
            if ev is None:
                continue
            assert ev.tokens_per_s <= OptimisticTokens(ctx)(layout) * (1 + 1e-9)
            assert ev.tokens_per_s <= upper * (1 + 1e-9)


def test_a_plan_with_a_version_2_profile_verifies(tmp_path):
    (tmp_path / "c.yaml").write_text(ONE_BOX)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(V2))
    plan = tmp_path / "plan.yaml"
    argv = ["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", "gpt2", "--objective", "serving"]
    argv += ["--prompt-len", "64", "--output-len", "64", "--tpot-slo", "20 ms", "--profile", str(tmp_path / "p.yaml")]
    assert main([*argv, "-o", str(plan)]) == 0
    assert main(["verify", str(plan)]) == 0


CATALOG_BOX = """name: catalog-box
device_kinds:
  - {name: h200, catalog: h200-sxm-141g}
nodes:
  - {name: box, devices: {h200: 1}}
"""


def _catalog_context(tmp_path, kinds: dict):
    (tmp_path / "c.yaml").write_text(CATALOG_BOX)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({**V2, "kinds": kinds}))
    wl = ServingWorkload(requests=(RequestShape(prompt_len=64, output_len=64),), tpot_slo_s=0.05)
    return build_context(str(tmp_path / "c.yaml"), "gpt2", wl, "fp16", ServingOptions(), str(tmp_path / "p.yaml"))


def test_a_profile_names_a_kind_by_its_catalog_entry_unless_it_names_the_kind_itself(tmp_path):
    """A profile measured on a GPU model (its catalog name) applies to a spec kind that names that entry."""
    by_catalog = {"h200-sxm-141g": {"tp": {1: {"linear_layer_s": LINEAR}}}}
    costs = _catalog_context(tmp_path, by_catalog).cache.get("box/h200", 1)
    load = costs.layer_time  # the measured table, not the kernel model
    assert isinstance(load, PartsLayerTime) and load.measured
    own = [[0, 0.002], [256, 0.006]]
    both = {**by_catalog, "h200": {"tp": {1: {"linear_layer_s": own}}}}
    ctx = _catalog_context(tmp_path, both)
    costs = ctx.cache.get("box/h200", 1)
    r = ctx.tasks.prefill_per_output
    expected = 0.002 + 0.004 * 10 * (1 + r) / 256 + _model_s(costs, ctx.tasks.per_sequence.times(10), {"linear"})
    assert costs.layer_time(10) == pytest.approx(expected, rel=1e-9)


def test_a_profile_that_names_no_kind_of_the_cluster_is_refused(tmp_path):
    """Never silently the kernel model: a profile for other GPUs (or a misspelt kind) exits 2."""
    with pytest.raises(WorkloadError, match=r"its device kinds \(a100\) name no device kind of 'catalog-box'"):
        _catalog_context(tmp_path, {"a100": {"tp": {1: {"linear_layer_s": LINEAR}}}})


def test_a_profile_in_a_dtype_of_another_size_is_refused(tmp_path):
    """fp16 times for fp32 layers would be half what the plan runs: refused, naming both dtypes."""
    (tmp_path / "c.yaml").write_text(ONE_BOX.replace("{fp16: 165 TFLOP/s}", "{fp16: 165 TFLOP/s, fp32: 82 TFLOP/s}"))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(V2))
    wl = ServingWorkload(requests=(RequestShape(prompt_len=64, output_len=64),), tpot_slo_s=0.05)
    with pytest.raises(WorkloadError, match="its times are in fp16, the layers asked for in fp32"):
        build_context(str(tmp_path / "c.yaml"), "gpt2", wl, "fp32", ServingOptions(), str(tmp_path / "p.yaml"))
    bf16 = {**V2, "dtype": "bf16"}  # the same size: taken
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(bf16))
    assert build_context(str(tmp_path / "c.yaml"), "gpt2", wl, "fp16", ServingOptions(), str(tmp_path / "p.yaml"))


def _h200_context(tmp_path, profile: dict, weights: str | None, kv: str | None = None):
    """Llama-shaped gpt2 on one catalog H200 (fp8 tensor cores), in bf16 with the given weights and KV cache."""
    (tmp_path / "c.yaml").write_text(CATALOG_BOX)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    wl = ServingWorkload(requests=(RequestShape(prompt_len=64, output_len=64),), tpot_slo_s=0.05)
    precision = build_precision("bf16", weights, kv)
    return build_context(str(tmp_path / "c.yaml"), "gpt2", wl, precision, ServingOptions(), str(tmp_path / "p.yaml"))


FP8 = {**V2, "dtype": "fp8", "kinds": {"h200-sxm-141g": {"tp": {1: {"linear_layer_s": LINEAR}}}}}


def test_an_fp8_profile_times_the_projections_of_fp8_weights(tmp_path):
    """profile-serving --dtype fp8 (W8A8 projections) stands for a plan with fp8 weights: its linear
    table replaces the kernel model's fp8 projections, the rest (in bf16) stays the model's."""
    ctx = _h200_context(tmp_path, FP8, "fp8")
    costs = ctx.cache.get("box/h200", 1)
    assert isinstance(costs.layer_time, PartsLayerTime) and costs.layer_time.measured
    load = ctx.tasks.per_sequence.times(10)
    expected = _lin(10 * (1 + ctx.tasks.prefill_per_output)) + _model_s(costs, load, {"linear"})
    assert costs.layer_time(10) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(WorkloadError, match=r"its times are fp8 \(W8A8\) projections, the weights asked for bf16"):
        _h200_context(tmp_path, FP8, None)
    with_attention = copy.deepcopy(FP8)  # written by hand: profile-serving --dtype fp8 times no attention
    with_attention["kinds"]["h200-sxm-141g"]["tp"][1]["attn_decode_s"] = [
        [b, c, 1e-5] for b in (1, 8) for c in (64, 512)
    ]
    for kv in (None, "fp8"):
        with pytest.raises(WorkloadError, match="an fp8 profile stands for W8A8 projections only"):
            _h200_context(tmp_path, with_attention, "fp8", kv)


def test_a_profile_stands_for_its_own_formats_only(tmp_path):
    """bf16 times for int4 or fp8 weights are refused, naming how to profile them; a bf16 profile of
    the projections alone serves a plan whose KV cache is fp8, one that times attention does not."""
    bf16 = {**FP8, "dtype": "bf16"}
    for weights in ("fp8", "int4-awq"):
        with pytest.raises(WorkloadError, match=f"its times are in bf16, the weights asked for in {weights}"):
            _h200_context(tmp_path, bf16, weights)
    assert _h200_context(tmp_path, bf16, None, "fp8").cache.get("box/h200", 1).layer_time.measured
    grid = [[b, c, 1e-5 * b] for b in (1, 64) for c in (128, 1024)]
    with_attention = copy.deepcopy(bf16)
    with_attention["kinds"]["h200-sxm-141g"]["tp"][1]["attn_decode_s"] = grid
    with pytest.raises(WorkloadError, match="its decode attention reads a bf16 KV cache, the one asked for is fp8"):
        _h200_context(tmp_path, with_attention, None, "fp8")


def test_candidate_precisions_the_profile_cannot_time_are_refused_before_planning(tmp_path, capsys):
    """--allow-weights fp8 beside a bf16 profile: the fp8 candidate would be planned without it and
    its bound would not hold, so the command exits 2 naming the profile and the candidate."""
    (tmp_path / "c.yaml").write_text(CATALOG_BOX)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({**FP8, "dtype": "bf16"}))
    argv = ["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", "gpt2", "--objective", "serving"]
    argv += ["--prompt-len", "64", "--output-len", "64", "--tpot-slo", "50 ms", "--dtype", "bf16"]
    argv += ["--profile", str(tmp_path / "p.yaml"), "--allow-weights", "fp8", "-o", str(tmp_path / "plan.yaml")]
    assert main(argv) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "its times are in bf16, the weights asked for in fp8" in err and "the candidate weights fp8" in err
    assert main([*argv[:-4], "-o", str(tmp_path / "plan.yaml")]) == 0  # the asked bf16 alone: planned with it
