"""`llm-planner export PLAN --to vllm|sglang|megatron` (llm_planner.export.serving): serving plans
made on small specs written here, exported, and checked against the frameworks' rules (one
tensor-parallel degree, VLLM_PP_LAYER_PARTITION of pipeline-size entries adding up to the model's
layers, one micro-batch per stage, no CPU stage); refusals exit 2 naming the replica and stage."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.export.engine_args import assign_ports
from llm_planner.export.serving import EnginePlan, EngineStage, ServingExportError, build_engines
from llm_planner.export.serving_json import megatron_config
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.serving.plan_file import ServingPlanFile, load_serving_plan

# Two servers of three 6 GB GPUs: llama2-7b (13.5 GB of fp16 weights) needs a pipeline over both.
TWO_SERVERS = """
name: two-servers
device_kinds:
  - {name: g6, type: gpu, peak_flops: {fp16: 120 TFLOP/s, bf16: 120 TFLOP/s}, mem_bytes: 6 GB,
     mem_bw_bytes_per_s: 300 GB/s, compute_efficiency: 0.6, mem_efficiency: 0.8, usable_mem_fraction: 0.88}
nodes:
  - {name: box, count: 2, hostname: "gpu-{i}", devices: {g6: 3}}
links:
  intra_node_default: {bw_bytes_per_s: 32 GB/s, latency_s: 5 us}
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
"""
# Two servers of four 8 GB GPUs: tensor-parallel groups inside a server.
FOUR_PER_SERVER = TWO_SERVERS.replace("6 GB", "8 GB").replace("{g6: 3}", "{g6: 4}")
# The CPU and the A100 of cpu-two-gpus.yaml: the plan without --exportable still puts a copy on the
# CPU, and its bounds take a third of the time of the three-device server's.
CPU_AND_GPU = Path("cluster_specs/cpu-two-gpus.yaml").read_text().replace(", t4: 1}", "}")
SERVING = ["--objective", "serving", "--prompt-len", "256", "--output-len", "64", "--no-baselines"]


def _plan(tmp_path: Path, name: str, spec: str, *extra: str, model: str = "llama2-7b", slo: str = "100 ms") -> Path:
    cluster = tmp_path / f"{name}.cluster.yaml"
    if not cluster.exists():
        cluster.write_text(spec)
    out = tmp_path / f"{name}.yaml"
    assert (
        main(["plan", "--cluster", str(cluster), "--model", model, *SERVING, "--tpot-slo", slo, *extra, "-o", str(out)])
        == 0
    )
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("plans")
    return {
        "pipeline": _plan(tmp, "pipeline", TWO_SERVERS, "--max-tp", "1", "--exportable", "vllm"),
        "tp": _plan(tmp, "tp", FOUR_PER_SERVER, "--exportable", "vllm", slo="50 ms"),
    }


def _export(plan: Path, *args: str) -> tuple[int, str, str]:
    import io
    from contextlib import redirect_stderr, redirect_stdout

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        from llm_planner.cli import main as cli

        cli.console.file = out  # the CLI prints to its own console
        cli.err_console.file = err
        try:
            rc = main(["export", str(plan), *args])
        finally:
            cli.console.file = None
            cli.err_console.file = None
    return rc, _flat(out.getvalue()), err.getvalue()


def _written(plan: Path, to: str, multinode: str = "native") -> str:
    """What the exporter writes for `plan` (a script, or Megatron's JSON), past the CLI's verify gate:
    the plans edited here no longer verify, and `export` refuses them (test_export_trust.py)."""
    served = load_serving_plan(plan)
    export = build_engines(served, load_cluster(served.input_path("cluster")), to, multinode=multinode)
    if to == "megatron":
        return json.dumps(megatron_config(export))
    return _flat(vllm_script(export) if to == "vllm" else sglang_script(export))


def _flat(script: str) -> str:
    """Commands on one line each (the scripts continue long ones with a backslash)."""
    return re.sub(r" *\\\n *", " ", script)


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


def _check_vllm_rules(plan: Path, engines: list[dict]) -> None:
    """vLLM's rules on every engine, against the plan it came from."""
    data = yaml.safe_load(plan.read_text())
    num_layers = data["model"]["num_layers"]
    assert len(engines) == sum(r["count"] for r in data["serving"]["replicas"])
    for e in engines:
        rep = data["serving"]["replicas"][e["replica"]]
        pp = e["pipeline_parallel_size"]
        partition = e["layer_partition"] or ",".join([str(num_layers // pp)] * pp)
        parts = [int(x) for x in partition.split(",")]
        assert len(parts) == pp and sum(parts) == num_layers
        assert parts == rep["layers"]
        stages = rep["devices"][e["copy"]]
        assert {len(s) for s in stages} == {e["tensor_parallel_size"]}
        assert rep["micro_batches"] == pp
        assert e["max_num_seqs"] == rep["concurrency"]
    assert sum(e["share"] for e in engines) == pytest.approx(1.0)


def test_vllm_script_of_a_pipeline_over_two_hosts(plans):
    rc, script, _ = _export(plans["pipeline"], "--to", "vllm")
    assert rc == 0
    rc, text, _ = _export(plans["pipeline"], "--to", "vllm", "--format", "json")
    config = json.loads(text)
    _check_vllm_rules(plans["pipeline"], config["engines"])
    engine = config["engines"][0]
    assert [h["host"] for h in engine["hosts"]] == ["gpu-0", "gpu-1"] and engine["head"] == "gpu-0"
    # the model's limit (llama2-7b: 4096), not the workload's 256 + 64; KV: every sequence at its full 320
    assert config["max_model_len"] == 4096 and config["dtype"] == "float16"
    assert engine["kv_tokens"] == engine["max_num_seqs"] * 320
    partition = re.search(r"VLLM_PP_LAYER_PARTITION=([\d,]+)", script)
    if engine["layer_partition"] is None:
        assert partition is None
    else:
        assert partition.group(1) == engine["layer_partition"]
    pp = int(re.search(r"--pipeline-parallel-size (\d+)", script).group(1))
    assert pp == engine["pipeline_parallel_size"] and "--tensor-parallel-size 1 " in script
    # vLLM's own multi-node mode: the head serves, the other host runs headless workers; no Ray
    assert "--nnodes 2 --node-rank 0 --master-addr gpu-0 --master-port 29501 >" in script
    assert "--nnodes 2 --node-rank 1 --master-addr gpu-0 --master-port 29501 --headless >" in script
    assert "ray start" not in script and "--gpu-memory-utilization" not in script
    assert f"--kv-cache-memory-bytes {engine['kv_cache_memory_bytes']} " in script
    assert f"--max-num-seqs {engine['max_num_seqs']} " in script and "--max-model-len 4096 " in script
    rc, ray, _ = _export(plans["pipeline"], "--to", "vllm", "--vllm-multinode", "ray")
    assert rc == 0 and "ray start --head --port=13000 " in ray and "ray start --address=gpu-0:13000 " in ray
    assert "--distributed-executor-backend ray" in ray and "--nnodes" not in ray
    assert "server gpu-0:8000 weight=1000;" in script
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_vllm_script_of_tensor_parallel_engines(plans, tmp_path):
    out = tmp_path / "serve.sh"
    rc, _, _ = _export(plans["tp"], "--to", "vllm", "-o", str(out))
    script = _flat(out.read_text())
    rc_json, text, _ = _export(plans["tp"], "--to", "vllm", "--format", "json")
    assert rc == rc_json == 0
    engines = json.loads(text)["engines"]
    _check_vllm_rules(plans["tp"], engines)
    for e in engines:
        assert len(e["hosts"]) == 1  # a server holds a whole engine: no Ray
        assert f"CUDA_VISIBLE_DEVICES={','.join(map(str, e['hosts'][0]['gpus']))} " in script
    assert "ray start" not in script and script.count("vllm serve") == len(engines)
    weights = [int(w) for w in re.findall(r"weight=(\d+);", script)]
    assert len(weights) == len(engines) and sum(weights) == pytest.approx(1000, abs=len(engines))


def test_sglang_script_spans_hosts_with_node_ranks(plans):
    rc, script, _ = _export(plans["pipeline"], "--to", "sglang")
    assert rc == 0
    assert script.count("sglang.launch_server") == 2
    assert "--nnodes 2 --node-rank 0 --dist-init-addr gpu-0:20000" in script
    assert "--nnodes 2 --node-rank 1 --dist-init-addr gpu-0:20000" in script
    assert "--tp-size 1 " in script and "--mem-fraction-static 0.88 " in script and "--context-length 4096 " in script
    concurrency = yaml.safe_load(plans["pipeline"].read_text())["serving"]["replicas"][0]["concurrency"]
    assert f"--max-total-tokens {concurrency * 320} " in script
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_megatron_sizes_per_pattern(plans):
    rc, text, _ = _export(plans["tp"], "--to", "megatron")
    assert rc == 0
    data = yaml.safe_load(plans["tp"].read_text())
    config = json.loads(text)
    for pattern, rep in zip(config["patterns"], data["serving"]["replicas"]):
        assert pattern["data_parallel_size"] == rep["count"]
        assert pattern["pipeline_model_parallel_size"] == len(rep["layers"])
        assert pattern["tensor_model_parallel_size"] == len(rep["devices"][0][0])
        assert f"--tensor-model-parallel-size {pattern['tensor_model_parallel_size']} " in pattern["args"]


def test_uneven_split_is_written_for_both_frameworks(plans, tmp_path):
    def uneven(data):
        layers = data["serving"]["replicas"][0]["layers"]
        layers[0], layers[-1] = layers[0] + 1, layers[-1] - 1

    plan = _edited(plans["pipeline"], tmp_path, uneven)
    layers = yaml.safe_load(plan.read_text())["serving"]["replicas"][0]["layers"]
    partition = ",".join(map(str, layers))
    assert f"VLLM_PP_LAYER_PARTITION={partition} " in _written(plan, "vllm")
    assert f"SGLANG_PP_LAYER_PARTITION={partition} " in _written(plan, "sglang")
    megatron = json.loads(_written(plan, "megatron"))["patterns"][0]["args"]
    assert "--decoder-first-pipeline-num-layers" in megatron or "--pipeline-model-parallel-layout" in megatron


def test_mixed_degrees_are_refused_naming_replica_and_stage(plans, tmp_path):
    def mixed(data):  # two stages: a tensor-parallel pair, then one device
        rep, n = data["serving"]["replicas"][0], data["model"]["num_layers"]
        rep.update(layers=[n // 2, n - n // 2], micro_batches=2)
        name = rep["segments"][0]["class"]
        rep["segments"] = [{"class": name, "degree": 2, "stages": 1}, {"class": name, "degree": 1, "stages": 1}]
        for key in ("stage_s", "mem_bytes", "usable_bytes"):
            rep[key] = rep[key] * 2
        rep["devices"] = [[copy[0][:2], copy[0][2:3]] for copy in rep["devices"]]

    plan = _edited(plans["tp"], tmp_path, mixed)
    for target in ("vllm", "sglang", "megatron"):
        rc, _, err = _export(plan, "--to", target)
        assert rc == 2
        assert "replica 0" in err and "stage 1 has tensor-parallel degree 1" in err, err


def test_micro_batches_other_than_the_pipeline_are_refused(plans, tmp_path):
    plan = _edited(plans["pipeline"], tmp_path, lambda d: d["serving"]["replicas"][0].update(micro_batches=1))
    rc, _, err = _export(plan, "--to", "vllm")
    assert rc == 2 and "replica 0" in err and "1 micro-batch(es)" in err and "one batch per stage" in err
    assert json.loads(_written(plan, "megatron"))["patterns"]  # Megatron's sizes do not depend on it


def test_layers_that_do_not_add_up_are_refused(plans, tmp_path):
    plan = _edited(plans["pipeline"], tmp_path, lambda d: d["serving"]["replicas"][0]["layers"].__setitem__(0, 1))
    rc, _, err = _export(plan, "--to", "vllm")
    assert rc == 2 and "do not add up" in err


def test_sglang_refuses_hosts_with_unequal_stage_runs(plans, tmp_path):
    def shuffle(data):
        copy = data["serving"]["replicas"][0]["devices"][0]
        copy.append(copy.pop(0))  # the first host's first stage moves to the end of the pipeline

    plan = _edited(plans["pipeline"], tmp_path, shuffle)
    rc, _, err = _export(plan, "--to", "sglang")
    assert rc == 2 and "replica 0" in err and "stage" in err and "consecutive" in err, err
    assert "vllm serve" in _written(plan, "vllm", "ray")  # one kind: vLLM's Ray host order runs the same stages
    with pytest.raises(ServingExportError, match=r"vLLM across 2 hosts .*--vllm-multinode ray"):
        _written(plan, "vllm")  # vLLM's own multi-node mode gives node k the k-th run of stages, as SGLang


# Three hosts: a head of one big GPU, a host of two small ones, a host of one medium one.
THREE_KINDS = """
name: three-kinds
device_kinds:
  - {name: big, type: gpu, peak_flops: {fp16: 300 TFLOP/s}, mem_bytes: 40 GB, mem_bw_bytes_per_s: 2000 GB/s}
  - {name: small, type: gpu, peak_flops: {fp16: 60 TFLOP/s}, mem_bytes: 16 GB, mem_bw_bytes_per_s: 300 GB/s}
  - {name: mid, type: gpu, peak_flops: {fp16: 120 TFLOP/s}, mem_bytes: 24 GB, mem_bw_bytes_per_s: 900 GB/s}
nodes:
  - {name: a, hostname: host-a, devices: {big: 1}}
  - {name: b, hostname: host-b, devices: {small: 2}}
  - {name: c, hostname: host-c, devices: {mid: 1}}
links:
  intra_node_default: {bw_bytes_per_s: 32 GB/s, latency_s: 5 us}
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
"""


FP16 = {"weights": "fp16", "activations": "fp16", "kv_cache": "fp16"}


def with_precision(data: dict, **precision: str) -> None:
    """Set the plan's precision (model.dtype, model.precision and every replica's) in place."""
    p = {**data["model"]["precision"], **precision}
    data["model"].update(dtype=p["activations"], precision=p)
    for rep in data["serving"]["replicas"]:
        rep["precision"] = dict(p)


def _hand_plan(cluster: Path, stages: list[str], layers: list[int]) -> ServingPlanFile:
    rep = {
        "pattern": "hand",
        "count": 1,
        "segments": [],
        "layers": layers,
        "concurrency": 8,
        "micro_batches": len(stages),
        "tokens_per_s": 100.0,
        "devices": [[[d] for d in stages]],
    }
    data = {
        "inputs": {"cluster": str(cluster)},
        "model": {"name": "llama2-7b", "dtype": "fp16", "num_layers": sum(layers), "precision": FP16},
        "workload": {"requests": [{"prompt_len": 100, "output_len": 20, "weight": 1.0}], "tpot_slo_s": 0.1},
        "options": {"max_batched_tokens": 2048},
        "serving": {"tokens_per_s": 100.0, "replicas": [rep]},
    }
    return ServingPlanFile(data=data, path=cluster.parent / "hand.yaml")


def test_vllm_refuses_a_pipeline_its_ray_executor_would_reorder(tmp_path):
    cluster_path = tmp_path / "three.yaml"
    cluster_path.write_text(THREE_KINDS)
    cluster = load_cluster(cluster_path)
    # a -> b (2 stages) -> c: vLLM ranks c (1 GPU) before b (2 GPUs), so stage 1 would run on the mid GPU
    plan = _hand_plan(cluster_path, ["a/big:0", "b/small:0", "b/small:1", "c/mid:0"], [10, 4, 4, 6])
    with pytest.raises(
        ServingExportError, match=r"replica 0 .*stage 1 \(small on host 'host-b'\) would run on mid GPUs"
    ):
        build_engines(plan, cluster, "vllm", multinode="ray")
    # a -> c -> b is the order vLLM ranks: it exports, and SGLang refuses three hosts of unequal stage runs
    plan = _hand_plan(cluster_path, ["a/big:0", "c/mid:0", "b/small:0", "b/small:1"], [10, 6, 4, 4])
    export = build_engines(plan, cluster, "vllm", multinode="ray")
    assert export.engines[0].hosts == ["host-a", "host-c", "host-b"]
    assert "VLLM_PP_LAYER_PARTITION=10,6,4,4 " in _flat(vllm_script(export))
    with pytest.raises(ServingExportError, match="SGLang across 3 hosts"):
        build_engines(plan, cluster, "sglang")


def test_a_cpu_stage_is_refused_naming_the_stage(tmp_path):
    plan = _plan(tmp_path, "cpu", CPU_AND_GPU, "--allow-cpu", model="gpt2", slo="100 ms")
    data = yaml.safe_load(plan.read_text())
    where = [
        (r, s)
        for r, rep in enumerate(data["serving"]["replicas"])
        for s, devs in enumerate(rep["devices"][0])
        if any("epyc" in d for d in devs)
    ]
    if not where:  # the planner left the CPU out: put a stage on it
        cpu = ["workstation/epyc-7543:0"]
        plan = _edited(plan, tmp_path, lambda d: d["serving"]["replicas"][0]["devices"][0].__setitem__(0, cpu))
        where = [(0, 0)]
    r, s = where[0]
    for target in ("vllm", "sglang", "megatron"):
        rc, _, err = _export(plan, "--to", target)
        assert rc == 2
        assert f"replica {r}" in err and f"stage {s} runs on CPU device kind 'epyc-7543'" in err, err


@pytest.mark.parametrize(
    "spec,extra,model,slo",
    [
        (TWO_SERVERS, ("--max-tp", "1"), "llama2-7b", "100 ms"),
        (TWO_SERVERS, (), "llama2-7b", "100 ms"),
        (FOUR_PER_SERVER, (), "llama2-7b", "50 ms"),
        # at 100 ms as at 200 ms the plan without --exportable puts a stage on the CPU; its bounds take half as long
        (CPU_AND_GPU, ("--allow-cpu",), "gpt2", "100 ms"),
        # at 20 ms as at 50 ms the plan without --exportable puts a copy on the CPU; its bounds take two thirds as long
        (None, ("--allow-cpu", "--max-classes-per-replica", "2"), "gpt2", "20 ms"),
    ],
    ids=["pipeline", "two-servers", "four-per-server", "cpu-and-gpu", "cpu-two-gpus-two-classes"],
)
@pytest.mark.heavy
def test_exportable_vllm_plans_always_export(tmp_path, spec, extra, model, slo):
    spec = spec or Path("cluster_specs/cpu-two-gpus.yaml").read_text()
    plan = _plan(tmp_path, "p", spec, *extra, "--exportable", "vllm", model=model, slo=slo)
    rc, text, err = _export(plan, "--to", "vllm", "--format", "json")
    assert rc == 0, err
    _check_vllm_rules(plan, json.loads(text)["engines"])
    assert _export(plan, "--to", "vllm")[0] == 0


def test_bf16_plans_export_bfloat16(plans, tmp_path):
    bf16 = {"weights": "bf16", "activations": "bf16", "kv_cache": "bf16"}
    plan = _edited(plans["tp"], tmp_path, lambda d: with_precision(d, **bf16))
    assert "--dtype bfloat16" in _written(plan, "vllm")
    assert "--dtype bfloat16" in _written(plan, "sglang")


def test_other_plans_and_bad_options_exit_2(plans, tmp_path):
    other = tmp_path / "plan.yaml"
    other.write_text("format: llm_planner.core.plan\n")
    rc, _, err = _export(other, "--to", "vllm")
    assert rc == 2 and "not a serving plan" in err
    other.write_text("garbage: [\n")  # not YAML at all: said so, as verify and show say it
    rc, _, err = _export(other, "--to", "vllm")
    assert rc == 2 and f"{other}: not valid YAML" in err and "not a serving plan" not in err
    rc, _, err = _export(plans["tp"], "--to", "megatron", "--format", "script")
    assert rc == 2 and "JSON" in err


def _engine(name: str, hosts: list[str]) -> EnginePlan:
    stages = tuple(EngineStage(host=h, node=h, kind="g", gpus=(0,), devices=(f"{h}/g:0",), layers=1) for h in hosts)
    return EnginePlan(
        name=name,
        replica=0,
        copy=0,
        pattern="p",
        tensor_parallel=1,
        stages=stages,
        concurrency=1,
        tokens_per_s=1.0,
        mem_fraction=0.9,
    )


def test_ports_are_distinct_per_host():
    engines = (_engine("a", ["h0"]), _engine("b", ["h0"]), _engine("c", ["h1"]), _engine("d", ["h1", "h0"]))
    ports = assign_ports(engines, 8000, 10)
    assert ports == {"a": 8000, "b": 8010, "c": 8000, "d": 8020}


@pytest.mark.heavy  # about 10 s: CI's test command runs it after the default suite
def test_requests_past_the_models_context_get_the_engines_opt_in(tmp_path, caplog):
    """Llama-3 8B (8,192 positions) planned for 8,000 + 500 tokens: the export's engines take the
    plan's 8,500-token requests, with the environment variable each engine needs for that, and a
    warning says so; an --max-model-len past both the limit and the requests is refused."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(Path("cluster_specs/four-gpus.yaml").read_text())
    plan = tmp_path / "p.yaml"
    argv = ["plan", "--cluster", str(cluster), "--model", "llama3-8b", "--objective", "serving", "--no-baselines"]
    assert main([*argv, "--prompt-len", "8000", "--output-len", "500", "--tpot-slo", "200 ms", "-o", str(plan)]) == 0
    for to, env in (("vllm", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"), ("sglang", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")):
        script = tmp_path / f"{to}.sh"
        assert main(["export", str(plan), "--to", to, "-o", str(script)]) == 0
        text = script.read_text()
        assert f"\nexport {env}=1\n" in text and "8500" in text
        as_json = tmp_path / f"{to}.json"
        assert main(["export", str(plan), "--to", to, "--format", "json", "-o", str(as_json)]) == 0
        config = json.loads(as_json.read_text())
        assert config["max_model_len"] == 8500 and config["environment"] == {env: "1"}
    said = " ".join(caplog.text.split())
    assert "take sequences of up to 8500 tokens, past llama3-8b's context limit of 8192" in said
    assert "they reject those requests" not in said
    assert main(["export", str(plan), "--to", "vllm", "--max-model-len", "9000", "-o", str(tmp_path / "x.sh")]) == 2


def test_requests_within_the_models_context_need_no_opt_in(plans):
    served = load_serving_plan(plans["tp"])
    export = build_engines(served, load_cluster(served.input_path("cluster")), "vllm")
    assert export.max_model_len == export.model_limit == 4096
    assert "ALLOW_LONG" not in _written(plans["tp"], "vllm")
    rc, text, _ = _export(plans["tp"], "--to", "sglang", "--format", "json")
    assert rc == 0 and json.loads(text)["environment"] == {}
