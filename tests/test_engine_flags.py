"""The vLLM and SGLang scripts start on the engines they are written for: every flag and environment
variable they set is one the pinned release defines (tests/data/engine_flags, read from the wheels by
benchmarks/engine_flags.py); ports never collide on a host (with what the engines derive from them);
--max-model-len is the model's limit (or the user's, checked), not the workload's mean; the dtype
comes from the model's config; fp8 plans export with --quantization fp8; the KV budget is the plan's."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from test_serving_export import FOUR_PER_SERVER, TWO_SERVERS, _edited, _export, _flat, _hand_plan, _plan, with_precision

from llm_planner.core.spec import load_cluster
from llm_planner.export.engine_args import PORT_STEP, SGLANG_PORT, VLLM_PORT, assign_ports
from llm_planner.export.serving import ENGINE_VERSIONS, ServingExportError, build_engines
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.serving.plan_file import load_serving_plan

FLAG_LISTS = Path(__file__).parent / "data" / "engine_flags"


def engine_facts(engine: str) -> tuple[set[str], set[str]]:
    """(flags, environment variables) of the pinned release of `engine`."""
    path = FLAG_LISTS / f"{engine}-{ENGINE_VERSIONS[engine]}.txt"
    lines = path.read_text().splitlines()
    assert lines[0].startswith(f"# {engine} {ENGINE_VERSIONS[engine]} sha256 "), lines[0]
    flags = {x for x in lines[1:] if x.startswith("--")}
    envs = {x.split()[1] for x in lines[1:] if x.startswith("env ")}
    return flags, envs


def commands(script: str) -> list[list[str]]:
    """The script's commands as words (comments and case labels left out; `( ... )` groups split)."""
    out = []
    for line in _flat(script).splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.endswith(")") and line.count("(") == 0 or line == ";;":
            continue
        for part in re.split(r"\(\s|\s\)|;\s", line):
            try:
                words = shlex.split(part, comments=False)
            except ValueError:
                continue
            if words:
                out.append(words)
    return out


def check_against_engine(script: str, engine: str) -> int:
    """Every --flag of every `engine` command line is in the pinned list, every VAR= set before it
    is a variable the engine's source names; the number of command lines checked."""
    flags, envs = engine_facts(engine)
    program = {
        "vllm": ("vllm", "serve"),
        "sglang": ("sglang.launch_server",),
        "ray": ("ray", "start"),
        "sglang_router": ("sglang_router.launch_router",),
        "vllm_router": ("vllm-router",),
    }[engine]
    checked = 0
    for words in commands(script):
        env = [w.split("=")[0] for w in words if re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
        rest = [w for w in words if not re.match(r"^[A-Z_][A-Z0-9_]*=", w) and w != "exec"]
        if not all(p in rest for p in program):
            continue
        checked += 1
        used = {w.split("=")[0] for w in rest if w.startswith("--")}
        assert used <= flags, f"{engine} {ENGINE_VERSIONS[engine]} has no {sorted(used - flags)}: {words}"
        ours = {v for v in env if v.startswith(("VLLM_", "SGLANG_", "RAY_"))}
        assert ours <= envs, f"{engine} {ENGINE_VERSIONS[engine]} never reads {sorted(ours - envs)}"
    return checked


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("engine-plans")
    return {
        "multi-host": _plan(tmp, "pipeline", TWO_SERVERS, "--max-tp", "1", "--exportable", "vllm"),
        "one-host": _plan(tmp, "tp", FOUR_PER_SERVER, "--exportable", "vllm", slo="50 ms"),
    }


def _rendered(plan: Path, to: str, **options) -> str:
    served = load_serving_plan(plan)
    export = build_engines(served, load_cluster(served.input_path("cluster")), to, **options)
    return vllm_script(export) if to == "vllm" else sglang_script(export)


def _uneven(data):
    layers = data["serving"]["replicas"][0]["layers"]
    layers[0], layers[-1] = layers[0] + 1, layers[-1] - 1


def _fp8(data):
    """A version-5 plan in fp8 (its one dtype: weights, activations and KV cache; no serving.unrestricted)."""
    data["model"]["dtype"] = "fp8"
    data["version"] = 5
    del data["model"]["precision"], data["serving"]["unrestricted"]
    for rep in data["serving"]["replicas"]:
        del rep["precision"]


@pytest.mark.parametrize("case", ["one-host", "multi-host", "uneven", "fp8"])
def test_every_flag_and_variable_is_the_pinned_engines(plans, tmp_path, case):
    plan = plans.get(case) or _edited(plans["multi-host"], tmp_path, _uneven if case == "uneven" else _fp8)
    vllm = _rendered(plan, "vllm")
    assert check_against_engine(vllm, "vllm") >= 1 and "ray start" not in vllm
    assert check_against_engine(sglang_script(_export_of(plan, "sglang")), "sglang") >= 1
    ray = _rendered(plan, "vllm", multinode="ray")
    assert check_against_engine(ray, "vllm") >= 1
    spans = case not in ("one-host",)
    assert (check_against_engine(ray, "ray") >= 2) == spans  # a head and a joining host
    assert f"written for vLLM {ENGINE_VERSIONS['vllm']}" in vllm
    if case == "uneven":
        assert "VLLM_PP_LAYER_PARTITION=" in vllm and "SGLANG_PP_LAYER_PARTITION=" in _rendered(plan, "sglang")


def _export_of(plan: Path, to: str):
    served = load_serving_plan(plan)
    return build_engines(served, load_cluster(served.input_path("cluster")), to)


def test_the_check_sees_a_flag_the_engine_lacks(plans):
    script = _rendered(plans["one-host"], "vllm")
    with pytest.raises(AssertionError, match="--gpu-memory-fraction"):
        check_against_engine(script.replace("--max-num-seqs", "--gpu-memory-fraction"), "vllm")
    with pytest.raises(AssertionError, match="VLLM_NO_SUCH_THING"):
        check_against_engine(
            script.replace("CUDA_VISIBLE_DEVICES=", "VLLM_NO_SUCH_THING=1 CUDA_VISIBLE_DEVICES="), "vllm"
        )


# One box of four small GPUs and two boxes of two: four engines on one box, engines over two hosts.
CROWDED = """
name: crowded
device_kinds:
  - {name: l4, type: gpu, peak_flops: {fp16: 120 TFLOP/s}, mem_bytes: 24 GB, mem_bw_bytes_per_s: 300 GB/s}
nodes:
  - {name: box, hostname: box, devices: {l4: 4}}
  - {name: pair, count: 2, hostname: "pair-{i}", devices: {l4: 2}}
links:
  intra_node_default: {bw_bytes_per_s: 32 GB/s, latency_s: 5 us}
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
"""
# What each flag binds on its host: the port and those the engine derives from it (engine_args).
SPANS = {"--port": 2, "--master-port": 2, "--dist-init-addr": 7}


def _crowded_export(tmp_path: Path, to: str, multinode: str = "native"):
    cluster = tmp_path / "crowded.yaml"
    cluster.write_text(CROWDED)
    single = [[[f"box/l4:{i}"]] for i in range(4)]  # four one-GPU engines on `box`
    plan = _hand_plan(cluster, ["box/l4:0"], [32])
    rep = plan.data["serving"]["replicas"][0]
    rep.update(count=4, devices=single)
    two = dict(rep, count=2, layers=[16, 16], micro_batches=2)  # two engines over pair-0 and pair-1
    two["devices"] = [[["pair-0/l4:0"], ["pair-1/l4:0"]], [["pair-0/l4:1"], ["pair-1/l4:1"]]]
    plan.data["serving"]["replicas"].append(two)
    return build_engines(plan, load_cluster(cluster), to, multinode=multinode)


def _bound_ports(script: str) -> dict[str, list[range]]:
    """host -> the port ranges its commands bind (each flag with what the engine derives from it)."""
    out: dict[str, list[range]] = {}
    host = None
    for line in _flat(script).splitlines():
        label = re.match(r"^  (\S+)\)$", line)
        host = label.group(1) if label else host
        for flag, sep, value in re.findall(r"(--[a-z-]*port|--dist-init-addr)([ =])(\S+)", line):
            if flag in ("--min-worker-port", "--max-worker-port"):
                continue
            if flag == "--dist-init-addr" and not value.startswith(host + ":"):
                continue  # the head binds it, the others connect
            if flag == "--master-port" and "--headless" in line:
                continue
            port = int(value.rsplit(":", 1)[-1])
            span = SPANS.get(flag, 1) if sep == " " else 1  # ray start's --flag=PORT binds that port only
            out.setdefault(host, []).append(range(port, port + span))
        workers = re.search(r"--min-worker-port=(\d+) --max-worker-port=(\d+)", line)
        if workers:
            out.setdefault(host, []).append(range(int(workers.group(1)), int(workers.group(2)) + 1))
    return out


@pytest.mark.parametrize("to,multinode", [("vllm", "native"), ("vllm", "ray"), ("sglang", "native")])
def test_ports_are_distinct_per_host_across_engines(tmp_path, to, multinode):
    export = _crowded_export(tmp_path, to, multinode)
    script = (vllm_script if to == "vllm" else sglang_script)(export)
    bound = _bound_ports(script)
    assert set(bound) == {"box", "pair-0", "pair-1"}
    for host, ranges in bound.items():
        ports = [p for r in ranges for p in r]
        assert len(ports) == len(set(ports)), (host, sorted(ranges, key=lambda r: r.start))
    assert len(bound["box"]) >= 4  # four engines' API ports on one box
    if multinode == "ray":  # two Ray clusters share pair-0 and pair-1: each its block of ray start ports
        assert script.count("ray start --head") == 2 and len(set(re.findall(r"--node-manager-port=(\d+)", script))) == 2
        assert len(set(re.findall(r"--temp-dir=(\S+)", script))) == 2


def test_max_model_len_is_the_model_limit_or_the_users(plans, caplog):
    plan = plans["one-host"]  # prompt 256 + output 64: the mean, which the scripts no longer take
    for to in ("vllm", "sglang"):
        assert _export_of(plan, to).max_model_len == 4096  # llama2-7b's max_position_embeddings
    assert "--max-model-len 4096 " in _flat(_rendered(plan, "vllm"))
    assert "--context-length 4096 " in _flat(_rendered(plan, "sglang"))
    rc, script, err = _export(plan, "--to", "vllm", "--max-model-len", "2048")
    assert rc == 0 and "--max-model-len 2048 " in script, err
    served = load_serving_plan(plan)
    with caplog.at_level("WARNING", logger="llm_planner.export.serving"):
        build_engines(served, load_cluster(served.input_path("cluster")), "vllm", max_len=300)
    assert "at most 300 tokens (--max-model-len), shorter than the workload's longest prompt + output, 320" in (
        caplog.text
    )
    rc, _, err = _export(plan, "--to", "sglang", "--max-model-len", "5000")
    assert rc == 2 and "--max-model-len 5000: above the model's context limit of 4096" in " ".join(err.split())
    rc, _, err = _export(plan, "--to", "vllm", "--max-model-len", "0")
    assert rc == 2 and "--max-model-len: must be a positive number of tokens, got 0" in " ".join(err.split())


def test_max_model_len_is_refused_past_the_kv_budget(plans, tmp_path):
    plan = _edited(plans["one-host"], tmp_path, lambda d: d["serving"]["replicas"][0].update(concurrency=4))
    served = load_serving_plan(plan)
    cluster = load_cluster(served.input_path("cluster"))
    export = build_engines(served, cluster, "vllm")
    assert export.max_model_len == 4 * 320  # four sequences of 320 tokens of KV: no longer sequence fits
    with pytest.raises(ServingExportError, match=r"--max-model-len 2000: engine r0c0 .* holds 1280 tokens"):
        build_engines(served, cluster, "vllm", max_len=2000)


def test_kv_budget_is_the_plans(plans):
    data = yaml.safe_load(plans["multi-host"].read_text())
    rep = data["serving"]["replicas"][0]
    _, text, _ = _export(plans["multi-host"], "--to", "vllm", "--format", "json")
    engine = json.loads(text)["engines"][0]
    assert engine["kv_tokens"] == rep["concurrency"] * 320
    # llama2-7b fp16: 2 (K, V) * 4096 * 2 bytes per token and layer; the stage with most layers sizes the
    # pool, in whole 64-token blocks and one more, vLLM's null block, held back before it checks that one
    # sequence of --max-model-len fits (vllm/v1/core/kv_cache_planning.py)
    per_token = 2 * 4096 * 2 * max(rep["layers"])
    blocks = -(-(rep["concurrency"] * 320) // 64) + 1
    assert engine["kv_cache_memory_bytes"] == blocks * 64 * per_token
    usable = (engine["kv_cache_memory_bytes"] // (16 * per_token) - 1) * 16  # tokens vLLM holds at 16-token blocks
    assert usable >= engine["kv_tokens"] and usable >= json.loads(text)["max_model_len"]
    vllm, sglang = _flat(_rendered(plans["multi-host"], "vllm")), _flat(_rendered(plans["multi-host"], "sglang"))
    assert f"--kv-cache-memory-bytes {engine['kv_cache_memory_bytes']} " in vllm
    assert "--gpu-memory-utilization" not in vllm
    assert f"--max-total-tokens {engine['kv_tokens']} " in sglang and "--mem-fraction-static 0.88 " in sglang
    # no per-iteration budget in the plan: the engines' defaults for 6 GB GPUs, written explicitly
    assert "--max-num-batched-tokens 2048 " in vllm and "--chunked-prefill-size 2048 " in sglang
    # SGLang mixes the running decodes into the prompt chunk's iteration only when told: the plan prices it so
    assert "--enable-mixed-chunk " in sglang


def test_dtype_comes_from_the_models_config(plans, tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "num_hidden_layers": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    plan = _edited(plans["one-host"], tmp_path, lambda d: d["model"].update(name=str(path)))
    vllm, sglang = _flat(_rendered(plan, "vllm")), _flat(_rendered(plan, "sglang"))
    assert "--dtype bfloat16 " in vllm and "--dtype bfloat16 " in sglang  # the plan said fp16: same bytes
    assert "--max-model-len 8192 " in vllm  # the config's limit
    fp32 = _edited(plan, tmp_path, lambda d: with_precision(d, weights="fp32", activations="fp32", kv_cache="fp32"))
    assert "--dtype float32 " in _flat(_rendered(fp32, "vllm"))  # never the planner's default: asked for


def test_fp8_plans_export_with_fp8_quantization(plans, tmp_path):
    plan = _edited(plans["multi-host"], tmp_path, _fp8)
    vllm, sglang = _flat(_rendered(plan, "vllm")), _flat(_rendered(plan, "sglang"))
    assert "--dtype auto --quantization fp8 --kv-cache-dtype fp8 " in vllm
    assert "--dtype auto --quantization fp8 --kv-cache-dtype fp8_e4m3 " in sglang
    export = _export_of(plan, "vllm")
    fp16 = _export_of(plans["multi-host"], "vllm")
    assert export.kv["r0c0"].gpu_bytes * 2 == fp16.kv["r0c0"].gpu_bytes  # 1-byte KV, as the plan sized it


def test_native_multinode_flags_and_ray_behind_the_option(plans):
    native = _flat(_rendered(plans["multi-host"], "vllm"))
    assert native.count("vllm serve") == 2 and native.count("--headless") == 1
    assert "--nnodes 2 --node-rank 0 --master-addr gpu-0 --master-port 29501 >" in native
    assert "--nnodes 2 --node-rank 1 --master-addr gpu-0 --master-port 29501 --headless >" in native
    # each worker reads the layer partition: every host sets it (when the split is uneven)
    partitions = re.findall(r"VLLM_PP_LAYER_PARTITION=(\S+)", native)
    assert len(partitions) in (0, 2) and len(set(partitions)) <= 1
    rc, _, err = _export(plans["multi-host"], "--to", "vllm", "--vllm-multinode", "mpi")
    assert rc == 2 and "--vllm-multinode" in err
    rc, _, err = _export(plans["multi-host"], "--to", "sglang", "--vllm-multinode", "ray")
    assert rc == 2 and "--vllm-multinode applies to --to vllm" in err
    rc, _, err = _export(plans["multi-host"], "--to", "megatron", "--max-model-len", "1024")
    assert rc == 2 and "--max-model-len applies to --to vllm or sglang" in err


@pytest.mark.parametrize("to,router", [("vllm", "vllm-router"), ("sglang", "sglang-router")])
def test_router_flags_are_the_pinned_routers_and_point_at_every_engine(plans, to, router):
    served = load_serving_plan(plans["multi-host"])
    export = build_engines(served, load_cluster(served.input_path("cluster")), to)
    script = (vllm_script if to == "vllm" else sglang_script)(export, router)
    package = router.replace("-", "_")
    assert check_against_engine(script, package) == 1  # one router, started by `bash SCRIPT --router`
    assert check_against_engine(script, to) >= 1
    words = next(w for w in commands(script) if "--worker-urls" in w)
    urls = words[words.index("--worker-urls") + 1 : words.index("--policy")]
    ports = assign_ports(export.engines, VLLM_PORT if to == "vllm" else SGLANG_PORT, PORT_STEP)
    assert urls == [f"http://{e.hosts[0]}:{ports[e.name]}" for e in export.engines]
    assert words[words.index("--max-concurrent-requests") + 1] == str(sum(e.concurrency for e in export.engines))
    assert "  --router)" in _flat(script)
    with pytest.raises(AssertionError, match="--worker-weights"):
        check_against_engine(script.replace("--policy", "--worker-weights 1 --policy"), package)
    assert "--router)" not in (vllm_script if to == "vllm" else sglang_script)(export)  # nginx: nothing started


def test_router_options_are_refused_where_they_do_not_apply(plans):
    rc, _, err = _export(plans["one-host"], "--to", "vllm", "--router", "sglang-router")
    assert rc == 2 and "--router sglang-router fronts sglang engines, not --to vllm's" in " ".join(err.split())
    rc, _, err = _export(plans["one-host"], "--to", "megatron", "--router", "nginx")
    assert rc == 2 and "--router applies to the scripts of --to vllm or sglang" in " ".join(err.split())
    rc, script, err = _export(plans["one-host"], "--to", "sglang", "--router", "sglang-router")
    assert rc == 0 and "python3 -m sglang_router.launch_router --host 0.0.0.0 --port 9000" in script, err
