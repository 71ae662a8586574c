"""Precision as a plan input: bytes per weight of each format, a checkpoint's quantization_config
read as what it is, the kernel model and memory at the formats' bytes and rates, kinds that cannot
run a format left out, and the CLI's refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import SPECS

from llm_planner.cli.main import main
from llm_planner.core.precision import (
    Precision,
    PrecisionError,
    build_precision,
    linear_dtype,
    parse_weights,
    runs_on,
    uniform,
)
from llm_planner.core.spec import load_cluster
from llm_planner.cost.iteration import Load, layer_kernels, sublayer_kernels
from llm_planner.cost.layer_pieces import layer_pieces, layer_time_s
from llm_planner.graph.checkpoint import checkpoint_precision
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.ir import GraphError
from llm_planner.serving.context import ServingContext, ServingOptions, build_context
from llm_planner.serving.inputs import serving_precision
from llm_planner.serving.precision_choice import candidate_precisions, plan_among
from llm_planner.serving.workload import RequestShape, ServingWorkload, WorkloadError

WL = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.2)
FOUR_GPUS = str(SPECS / "four-gpus.yaml")  # 2 Xeon sockets, 4 A100 80GB
WORKSTATION = str(SPECS / "rtx4090-workstation.yaml")  # a Ryzen CPU, 2 RTX 4090
# LLaMA-2 70B, one layer's linear weights: q, o (8192 x 8192 each), k, v (8192 x 1024 each),
# gate, up, down (8192 x 28672 each)
LINEAR_70B = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672


def test_bytes_per_weight_of_each_format_by_hand():
    assert uniform("fp16").weight_bytes == 2 and uniform("bf16").weight_bytes == 2 and uniform("fp32").weight_bytes == 4
    assert build_precision("bf16", "fp8", None).weight_bytes == 1
    assert build_precision("bf16", "int8", None).weight_bytes == 1
    # 4-bit weights, and per group of 128 one fp16 scale and one 4-bit zero point
    assert build_precision("fp16", "int4-awq", None).weight_bytes == 0.5 + (2 + 0.5) / 128 == 0.51953125
    assert build_precision("fp16", "int4-gptq:g64", None).weight_bytes == 0.5 + 2.5 / 64
    assert build_precision("fp16", None, "fp8").kv_bytes == 1 and build_precision("bf16", None, "auto").kv_bytes == 2


def test_each_format_computes_at_its_dtype():
    assert build_precision("bf16", "fp8", None).compute_dtype == "fp8"
    assert build_precision("bf16", "int8", None).compute_dtype == "int8"
    assert build_precision("bf16", "int4-awq", None).compute_dtype == "bf16"
    assert build_precision("fp16", None, None) == uniform("fp16")


@pytest.mark.parametrize(
    "activations, weights, kv, words",
    [
        ("fp16", "int4-awq:64", None, ":gN"),
        ("fp16", "fp8:g64", None, "only int4 formats"),
        ("fp16", "bf16", None, "unquantized weights are the activation dtype"),
        ("fp8", None, None, "--weights fp8 --kv-cache-dtype fp8"),
        ("fp16", "int3", None, "unknown weight format"),
    ],
)
def test_a_precision_that_means_nothing_is_refused(activations, weights, kv, words):
    with pytest.raises(PrecisionError, match=words):
        build_precision(activations, weights, kv)


def _checkpoint(tmp_path, quant: dict | None, dtype: str = "float16") -> str:
    data = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
        "vocab_size": 32000,
        "torch_dtype": dtype,
    }
    if quant is not None:
        data["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(data))
    return str(tmp_path)


@pytest.mark.parametrize(
    "quant, dtype, expected",
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "float16", ("int4-awq", 128)),
        ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}, "float16", ("int4-gptq", 32)),
        ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "float16", ("int4-gptq", 4096)),  # per row
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "bfloat16", ("fp8", None)),
    ],
)
def test_a_quantized_checkpoint_is_planned_as_what_it_is(tmp_path, quant, dtype, expected):
    model = _checkpoint(tmp_path, quant, dtype)
    p = serving_precision(model, None, None, None)
    assert (p.weights, p.group_size) == expected
    assert p.activations == {"float16": "fp16", "bfloat16": "bf16"}[dtype] and p.kv_cache == p.activations
    assert serving_precision(model, None, p.weights_label, "fp8").kv_cache == "fp8"  # the same format, restated


@pytest.mark.parametrize(
    "quant, words",
    [
        ({"quant_method": "bitsandbytes"}, "quant_method: 'bitsandbytes' is not planned"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits: 8: gptq is planned at 4 bits only"),
        ({"quant_method": "awq", "bits": 4, "group_size": 0}, "group_size: 0"),
    ],
)
def test_a_checkpoint_quantization_the_planner_has_no_format_for_is_refused(tmp_path, quant, words):
    with pytest.raises(GraphError, match=words):
        checkpoint_precision(_checkpoint(tmp_path, quant))


def test_a_weights_flag_that_contradicts_the_checkpoint_exits_2_naming_both(tmp_path, capsys):
    model = _checkpoint(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 128})
    with pytest.raises(PrecisionError, match=r"--weights int4-awq:g64 contradicts .*config.json.*int4-awq:g128"):
        serving_precision(model, None, "int4-awq:g64", None)
    argv = ["plan", "--objective", "serving", "--cluster", WORKSTATION, "--model", model, "--prompt-len", "128"]
    argv += ["--output-len", "64", "--tpot-slo", "50 ms", "--weights", "fp8", "-o", str(tmp_path / "p.yaml")]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--weights fp8 contradicts" in err and "int4-awq:g128" in err and "Traceback" not in err


def test_int4_holds_a_70b_model_on_one_gpu_where_fp16_does_not():
    """LLaMA-2 70B on one A100 80GB (72 GiB usable): fp16 weights alone take 2 bytes per weight of
    its 69 billion, int4 with groups of 128 0.5195 bytes."""
    fp16 = build_context(FOUR_GPUS, "llama2-70b", WL, "fp16", ServingOptions())
    int4 = build_context(FOUR_GPUS, "llama2-70b", WL, build_precision("fp16", "int4-awq", None), ServingOptions())
    name = next(sc.name for sc in fp16.classes if sc.kind.type == "gpu")
    a, b = fp16.cache.get(name, 1), int4.cache.get(name, 1)
    norms = 2 * 8192 * 2  # two RMSNorm scales per layer, kept in fp16
    assert a.weight_bytes["block"] == LINEAR_70B * 2 + norms
    assert b.weight_bytes["block"] == pytest.approx(LINEAR_70B * (0.5 + 2.5 / 128) + norms, rel=1e-12)
    ends = dict(first=True, last=True, concurrency=1, micro_batch=1)
    assert a.max_layers(**ends) < 80 <= b.max_layers(**ends)
    assert b.mem_bytes(layers=80, **ends) <= b.usable_bytes < a.mem_bytes(layers=80, **ends)


def test_fp8_kv_halves_the_kv_bytes_held_and_read():
    fp16 = build_context(FOUR_GPUS, "llama2-70b", WL, "fp16", ServingOptions())
    kv8 = build_context(FOUR_GPUS, "llama2-70b", WL, build_precision("fp16", None, "fp8"), ServingOptions())
    name = next(sc.name for sc in fp16.classes if sc.kind.type == "gpu")
    for degree in (1, 4):
        a, b = fp16.cache.get(name, degree), kv8.cache.get(name, degree)
        assert b.kv_bytes_per_seq * 2 == a.kv_bytes_per_seq > 0
        assert b.weight_bytes == a.weight_bytes
        decode = Load(decode_keys=1.0)  # bytes per key of the decode attention
        ka = next(k for k in a.kernels.kernels if k.name == "attn_decode")
        kb = next(k for k in b.kernels.kernels if k.name == "attn_decode")
        assert a.kernels.kernel_terms(ka, decode.vector())[1] == 2 * b.kernels.kernel_terms(kb, decode.vector())[1]


def test_a_kind_that_dequantizes_the_kv_cache_reads_it_at_the_16_bit_time_and_holds_it_in_8_bits(tmp_path):
    """kv_dequant_factor 2: an fp8 cache's attention takes the 16-bit cache's time (an engine with no
    latency gain from it) while memory holds it at 1 byte; a 16-bit cache is untouched by the factor."""
    cfg = preset_config("llama3-8b")
    kind = load_cluster(FOUR_GPUS).kind("a100-80g")
    slow = dataclasses.replace(kind, kv_dequant_factor=2.0)
    kv8, fp16 = build_precision("fp16", None, "fp8"), uniform("fp16")
    load = Load(decodes=64.0, decode_keys=64.0 * 2048)

    def attention_s(k, p):
        kernels = layer_kernels(cfg, p, k)
        return kernels.kernel_s(next(x for x in kernels.kernels if x.name == "attn_decode"), load)

    assert attention_s(slow, kv8) == pytest.approx(attention_s(kind, fp16), rel=1e-12)
    assert attention_s(kind, kv8) < 0.6 * attention_s(kind, fp16)
    assert attention_s(slow, fp16) == attention_s(kind, fp16)
    spec = tmp_path / "slow-kv.yaml"
    spec.write_text(
        (SPECS / "four-gpus.yaml").read_text().replace("name: a100-80g", "name: a100-80g\n    kv_dequant_factor: 2", 1)
    )
    assert load_cluster(str(spec)).kind("a100-80g").kv_dequant_factor == 2.0
    held = build_context(str(spec), "llama3-8b", WL, kv8, ServingOptions()).cache.get("server/a100-80g", 1)
    plain = build_context(FOUR_GPUS, "llama3-8b", WL, kv8, ServingOptions()).cache.get("server/a100-80g", 1)
    assert held.kv_bytes_per_seq == plain.kv_bytes_per_seq


def test_the_linear_kernel_reads_the_format_and_computes_at_its_rate():
    ctx = build_context(WORKSTATION, "llama3-8b", WL, "fp16", ServingOptions())
    kind = next(sc.kind for sc in ctx.classes)  # rtx4090: fp16 165.2, fp8 330.3 TFLOP/s
    linear_params = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    one = Load(decodes=1.0).vector()
    weights_only = (1.0, 0.0, 0.0, 0.0, 0.0)

    def linear(p: Precision) -> tuple[float, float, float]:
        ks = layer_kernels(ctx.config, p, kind)
        lin = next(k for k in ks.kernels if k.name == "linear")
        return ks.kernel_terms(lin, one)[0], ks.kernel_terms(lin, weights_only)[1], ks.bytes_per_s

    c16, m16, bw = linear(uniform("fp16"))
    c8, m8, _ = linear(build_precision("fp16", "fp8", None))
    c4, m4, _ = linear(build_precision("fp16", "int4-awq", None))
    eff = kind.compute_efficiency
    assert c16 == pytest.approx(2 * linear_params / (165.2e12 * eff), rel=1e-9)
    assert c8 == pytest.approx(2 * linear_params / (330.3e12 * eff), rel=1e-9)
    assert c4 == pytest.approx(c16 * kind.dequant_factor, rel=1e-12)
    assert m16 == pytest.approx(2 * linear_params / bw) and m8 == pytest.approx(linear_params / bw)
    assert m4 == pytest.approx(linear_params * (0.5 + 2.5 / 128) / bw)


def test_a_cpu_in_the_spec_does_not_block_a_gpu_format():
    options = ServingOptions(allow_cpu=True)
    plain = build_context(WORKSTATION, "llama3-8b", WL, "fp16", options)
    assert {sc.kind.type for sc in plain.classes} == {"cpu", "gpu"}
    for p in (build_precision("fp16", "fp8", None), build_precision("fp16", "int4-gptq", "fp8")):
        ctx = build_context(WORKSTATION, "llama3-8b", WL, p, options)
        assert {sc.kind.name for sc in ctx.classes} == {"rtx4090"}  # the Ryzen serves no stage


T4_SERVER = """
name: t4-box
device_kinds:
  - {name: t4, catalog: t4}
nodes:
  - {name: box, devices: {t4: 4}}
links:
  intra_node_default: {bw_bytes_per_s: 16 GB/s, latency_s: 10 us}
"""


def test_a_format_no_kind_runs_names_the_format_and_every_kind(tmp_path):
    spec = tmp_path / "t4.yaml"
    spec.write_text(T4_SERVER)
    with pytest.raises(WorkloadError, match=r"--weights fp8 .*'t4': its peak_flops give no fp8, and fp8 weight-only"):
        build_context(str(spec), "llama3-8b", WL, build_precision("fp16", "fp8", None), ServingOptions())
    cpus = str(SPECS / "localhost-cpu.yaml")
    with pytest.raises(WorkloadError, match=r"--weights int4-awq:g128 .*CPU kinds run unquantized"):
        build_context(cpus, "gpt2", WL, build_precision("fp32", "int4-awq", None), ServingOptions(allow_cpu=True))


def test_fp8_weights_run_weight_only_where_the_kind_has_no_fp8_peak():
    """An A100 runs fp8 weights as vLLM's FP8 Marlin does, W8A16: read at 1 byte, computed at the
    fp16 peak times dequant_factor; an H100 at its fp8 peak (W8A8); a T4 (no bf16: before compute
    capability 8.0) not at all."""
    fp8 = build_precision("fp16", "fp8", None)
    a100, h100 = ("fp32", "tf32", "fp16", "bf16", "int8"), ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
    assert linear_dtype(fp8, a100) == ("fp16", True) and runs_on(fp8, "gpu", a100) is None
    assert linear_dtype(fp8, h100) == ("fp8", False) and runs_on(fp8, "gpu", h100) is None
    assert "compute capability 8.0" in runs_on(fp8, "gpu", ("fp32", "fp16", "int8"))
    assert "compute capability 8.0" in runs_on(fp8, "accelerator", a100)  # FP8 Marlin is NVIDIA's kernel
    fp32 = build_precision("fp32", "fp8", None)
    assert "compute in fp16 or bf16, not fp32" in runs_on(fp32, "gpu", a100)
    cluster = load_cluster(FOUR_GPUS)
    kind = cluster.kind("a100-80g")
    slow = dataclasses.replace(kind, dequant_factor=1.5)
    load = Load(decodes=4096.0)  # compute bound: the linear kernel's time is its FLOPs'
    cfg = preset_config("llama3-8b")

    def linear_s(k, p):
        kernels = layer_kernels(cfg, p, k)
        return kernels.kernel_s(next(x for x in kernels.kernels if x.name == "linear"), load)

    fp16 = uniform("fp16")
    assert linear_s(kind, fp8) == pytest.approx(linear_s(kind, fp16), rel=0.01)
    assert linear_s(slow, fp8) == pytest.approx(1.5 * linear_s(kind, fp16), rel=0.01)
    ctx = build_context(FOUR_GPUS, "llama3-8b", WL, fp8, ServingOptions())
    ctx16 = build_context(FOUR_GPUS, "llama3-8b", WL, fp16, ServingOptions())
    block = ctx.cache.get("server/a100-80g", 1).weight_bytes["block"]
    assert block < 0.55 * ctx16.cache.get("server/a100-80g", 1).weight_bytes["block"]


def test_nothing_serves_names_the_kinds_the_format_left_out(tmp_path, capsys):
    """Llama-3 70B in fp8 outgrows the two 4090s; the CPU that fp8 left out is named beside that."""
    argv = ["plan", "--cluster", WORKSTATION, "--model", "llama3-70b", "--weights", "fp8", "--allow-cpu"]
    argv += ["--objective", "serving", "--prompt-len", "512", "--output-len", "256", "--tpot-slo", "200 ms"]
    assert main([*argv, "-o", str(tmp_path / "plan.yaml")]) == 2
    err = capsys.readouterr().err
    assert "no layout of one class holds the weights" in err, err
    assert "left out as they cannot run weights fp8" in err and "CPU kinds run unquantized" in err, err


def test_parse_weights_reads_the_group_size():
    assert parse_weights("int4-awq", "--weights") == ("int4-awq", 128)
    assert parse_weights("int4-gptq:g32", "--weights") == ("int4-gptq", 32)
    assert parse_weights("int8", "--weights") == ("int8", None)


def test_candidates_are_the_asked_precision_and_every_allowed_one():
    asked = build_precision("bf16", None, None)
    got = candidate_precisions(asked, ("fp8", "int4-awq:g64"), ("fp8",), None)
    assert got[0] == asked and len(got) == 6
    assert {(p.weights_label, p.kv_cache) for p in got} == {
        (w, k) for w in ("bf16", "fp8", "int4-awq:g64") for k in ("bf16", "fp8")
    }
    with pytest.raises(PrecisionError, match="--allow-weights: the checkpoint's quantization_config fixes"):
        candidate_precisions(build_precision("fp16", "int4-awq", None), ("fp8",), (), "int4-awq:g128")


def test_a_candidate_nothing_serves_in_is_listed_with_its_bound_and_never_chosen():
    a, b = build_precision("fp16", None, None), build_precision("fp16", "fp8", None)

    def plan_one(p):
        if p == b:
            raise WorkloadError("no device kind runs it")
        timings = {"layout_search": 1.0, "bounds": 2.0, "total": 3.5}
        return {
            "serving": {"tokens_per_s": 10.0, "upper_bound_tokens_per_s": 12.0, "device_prices": {"c": 1.0}}
            | {"timings_s": timings}
        }

    data = plan_among([a, b], plan_one, lambda p: 0.0 if p == b else 99.0)
    rows = data["serving"]["precisions"]
    assert [r["tokens_per_s"] for r in rows] == [10.0, 0.0] and rows[1]["upper_bound_tokens_per_s"] == 0.0
    assert data["serving"]["upper_bound_tokens_per_s"] == 12.0 and data["serving"]["gap"] == pytest.approx(1 / 6)
    with pytest.raises(WorkloadError, match="no allowed precision serves"):
        plan_among([b], plan_one, lambda p: 0.0)
    c = build_precision("fp16", None, "fp8")
    timings = plan_among([a, b, c], plan_one, lambda p: 0.0)["serving"]["timings_s"]
    assert timings["layout_search"] == 2.0 and timings["bounds"] == 4.0  # both plans' time, not the last one's
    assert 0 < timings["precisions_that_serve_nothing"] < 1 and timings["total"] > 7.0


def test_a_measured_profile_is_not_applied_to_a_quantized_precision(tmp_path):
    class Profile:  # a measured serving profile's dtype and path are all this check reads
        dtype, path = "fp16", "p.yaml"

    cluster, config = load_cluster(WORKSTATION), preset_config("llama3-8b")
    with pytest.raises(
        WorkloadError, match=r"--profile p.yaml: its times are in fp16, the weights asked for in int4-awq:g128"
    ):
        ServingContext(cluster, config, WL, build_precision("fp16", "int4-awq", None), ServingOptions(), Profile())


@pytest.mark.parametrize("dtype", ["bogus", "float64", 5])
def test_a_checkpoint_dtype_the_planner_does_not_know_is_refused_naming_it(tmp_path, dtype):
    with pytest.raises(GraphError, match=rf"config.json: torch_dtype: {dtype!r} is not planned"):
        checkpoint_precision(_checkpoint(tmp_path, None, dtype))


@pytest.mark.parametrize("dtype", ["auto", None])
def test_a_checkpoint_dtype_left_to_the_weights_states_none(tmp_path, dtype):
    assert checkpoint_precision(_checkpoint(tmp_path, None, dtype)).dtype is None


def test_w8a8_layers_add_the_kinds_fixed_time_and_weight_only_and_16_bit_layers_do_not(tmp_path):
    """w8a8_overhead_s: a decoder layer computed in 8 bits (fp8 or int8 weights on a kind with their
    peak) adds it once per layer, half to each sublayer; 16-bit and weight-only layers (int4, fp8 on a
    kind with no fp8 peak) do not. A measured linear table includes it."""
    cfg = preset_config("llama3-8b")
    base = load_cluster(FOUR_GPUS).kind("a100-80g")
    peaks = (*base.peak_flops, ("fp8", 2 * base.flops_for("fp16")))
    plain = dataclasses.replace(base, peak_flops=peaks)
    kind = dataclasses.replace(plain, w8a8_overhead_s=20e-6)
    load = Load(decodes=16.0, decode_keys=16.0 * 1024)

    def extra(k, p, part=None):
        get = (
            (lambda q, c: layer_kernels(cfg, q, c))
            if part is None
            else (lambda q, c: sublayer_kernels(cfg, q, c, part))
        )
        return get(p, k).time_s(load) - get(p, plain if k is kind else base).time_s(load)

    for weights in ("fp8", "int8"):
        assert extra(kind, build_precision("fp16", weights, None)) == pytest.approx(20e-6)
        assert extra(kind, build_precision("fp16", weights, None), "attn") == pytest.approx(10e-6)
    for weights in (None, "int4-awq"):
        assert extra(kind, build_precision("fp16", weights, None)) == pytest.approx(0.0, abs=1e-15)
    no_fp8 = dataclasses.replace(base, w8a8_overhead_s=20e-6)  # fp8 weight-only there (W8A16)
    assert extra(no_fp8, build_precision("fp16", "fp8", None)) == pytest.approx(0.0, abs=1e-15)
    kernels = layer_kernels(cfg, build_precision("fp16", "fp8", None), kind)
    per_sequence = Load(decodes=1.0, decode_keys=1024.0)
    fixed = min(f for f, _ in layer_pieces(kernels, per_sequence))
    assert fixed - min(f for f, _ in layer_pieces(kernels, per_sequence, without=frozenset({"linear"}))) >= 20e-6 * (
        1 - 1e-9
    )
    linear = next(k for k in kernels.kernels if k.name == "linear")
    measured = layer_time_s(kernels, load, {"linear": lambda ld: kernels.kernel_s(linear, ld)})
    assert kernels.time_s(load) - measured == pytest.approx(20e-6)
    spec = tmp_path / "w8a8.yaml"
    spec.write_text(
        (SPECS / "four-gpus.yaml")
        .read_text()
        .replace("name: a100-80g", "name: a100-80g\n    w8a8_overhead_s: 25 us", 1)
    )
    assert load_cluster(str(spec)).kind("a100-80g").w8a8_overhead_s == pytest.approx(25e-6)
