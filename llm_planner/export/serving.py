"""A serving plan as engines a serving framework starts: `llm-planner export PLAN --to vllm|sglang|megatron`.

Every copy of every replica pattern of the plan (docs/plan-format.md, "Serving plans") is one
engine: p pipeline stages, each a tensor-parallel group of t devices on one host, running
`layers[s]` consecutive decoder layers (sum over s = the model's layers), with at most
`concurrency` sequences in flight split into `micro_batches` batches. An engine has the
frameworks' form when

- every stage has the same degree t (they take one --tensor-parallel-size),
- no stage is on a CPU (their pipelines run GPU workers),
- micro_batches = p (vLLM and SGLang keep one batch per stage in flight),
- each stage's devices are on one host (a stage is one tensor-parallel group),

and, across hosts, for SGLang every host holds the same number of consecutive stages (its
launcher gives node k the stages k*p/n .. (k+1)*p/n - 1), for vLLM every stage lands on GPUs of
its kind in the order vLLM's Ray executor ranks them (`vllm_host_order`). `build_engines` checks these rules
and raises ServingExportError naming the replica and the stage that breaks one. The layer
split goes to VLLM_PP_LAYER_PARTITION / SGLANG_PP_LAYER_PARTITION (layers per stage,
comma-separated; both read it in their get_pp_indices) when it is not the even split.

The load balancer in front of the engines sends engine e the share
tokens_per_s(e) / sum over engines of tokens_per_s: each engine then runs at the operating
point the plan predicts. Scripts are written by llm_planner.export.serving_scripts; Megatron's
parallel sizes per pattern (tensor t, pipeline p, data = copies) by `megatron_config`.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from llm_planner.core.fmt import quote
from llm_planner.core.names import check_host, hostname_problem
from llm_planner.core.spec import ClusterSpec, DeviceSpec
from llm_planner.serving.plan_file import ServingPlanFile

log = logging.getLogger(__name__)

FRAMEWORKS = ("vllm", "sglang", "megatron")
TITLES = {"vllm": "vLLM", "sglang": "SGLang", "megatron": "Megatron-LM"}
# The plan's element types as vLLM's and SGLang's --dtype names.
DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


class ServingExportError(ValueError):
    """A serving plan the framework cannot run as planned; the message names the replica and stage."""


@dataclass(frozen=True, kw_only=True)
class EngineStage:
    """One pipeline stage of an engine: a tensor-parallel group on one host."""

    host: str  # the node's hostname, or the node's name when the spec gives none
    node: str
    kind: str
    gpus: tuple[int, ...]  # CUDA ordinals on the host (the node's GPU kinds in spec order)
    devices: tuple[str, ...]
    layers: int


@dataclass(frozen=True, kw_only=True)
class EnginePlan:
    """One copy of one replica pattern: what one `vllm serve` / `sglang.launch_server` runs."""

    name: str  # "r<replica>c<copy>"
    replica: int
    copy: int
    pattern: str
    tensor_parallel: int
    stages: tuple[EngineStage, ...]
    concurrency: int
    tokens_per_s: float
    mem_fraction: float  # usable share of device memory, the smallest over the engine's kinds

    @property
    def pipeline_parallel(self) -> int:
        return len(self.stages)

    @property
    def layers(self) -> list[int]:
        return [s.layers for s in self.stages]

    @property
    def hosts(self) -> list[str]:
        """Hosts in pipeline order (the first stage's host first)."""
        return list(dict.fromkeys(s.host for s in self.stages))

    def host_stages(self, host: str) -> list[int]:
        return [i for i, s in enumerate(self.stages) if s.host == host]

    def host_gpus(self, host: str) -> list[int]:
        return [g for s in self.stages if s.host == host for g in s.gpus]


@dataclass(frozen=True, kw_only=True)
class ServingExport:
    """The engines of a plan and what every engine shares."""

    framework: str
    plan_path: str
    model: str  # what the scripts pass as the model (MODEL overrides it)
    dtype: str  # the framework's --dtype value
    num_layers: int
    max_model_len: int  # the largest prompt + output of the workload
    tpot_slo_s: float
    tokens_per_s: float
    engines: tuple[EnginePlan, ...]

    def share(self, engine: EnginePlan) -> float:
        total = sum(e.tokens_per_s for e in self.engines)
        return engine.tokens_per_s / total if total > 0 else 1.0 / len(self.engines)


def even_split(num_layers: int, stages: int) -> bool:
    """Whether every stage takes the same layers (what the frameworks do without a partition)."""
    return num_layers % stages == 0


def layer_partition(engine: EnginePlan, num_layers: int) -> str | None:
    """VLLM_PP_LAYER_PARTITION's value, None for the frameworks' default even split."""
    parts = engine.layers
    assert len(parts) == engine.pipeline_parallel and sum(parts) == num_layers, (parts, num_layers)
    if even_split(num_layers, len(parts)) and len(set(parts)) == 1:
        return None
    return ",".join(map(str, parts))


def gpu_ordinals(cluster: ClusterSpec) -> dict[str, int]:
    """Each GPU's CUDA ordinal on its host: the node's non-CPU kinds in spec order, then the index
    (what CUDA_DEVICE_ORDER=PCI_BUS_ID gives when the spec lists kinds in slot order)."""
    templates = {n.name: n for n in cluster.nodes}
    out = {}
    for d in cluster.devices():
        offset = 0
        for kind, num in templates[d.node_template].devices:
            if kind == d.kind:
                break
            if cluster.kind(kind).type != "cpu":
                offset += num
        out[d.name] = offset + d.index
    return out


def build_engines(plan: ServingPlanFile, cluster: ClusterSpec, framework: str) -> ServingExport:
    """The plan's engines for `framework`; ServingExportError naming the replica and stage of a
    rule the plan breaks (module docstring)."""
    if framework not in FRAMEWORKS:
        raise ServingExportError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    model, where = plan.data["model"], str(plan.path or "<plan>")
    if cluster.sha256 and plan.data["inputs"].get("cluster_sha256") not in (None, cluster.sha256):
        log.warning("%s: the cluster spec changed since the plan was made; exporting with today's spec", where)
    dtype = DTYPE_NAMES.get(model["dtype"])
    if dtype is None and framework != "megatron":
        raise ServingExportError(
            f"{where}: model dtype {model['dtype']!r}: {TITLES[framework]} takes one of {', '.join(DTYPE_NAMES)}"
        )
    by_name = cluster.device_map()
    ordinals = gpu_ordinals(cluster)
    engines = []
    for r, rep in enumerate(plan.replicas):
        label = f"{where}: replica {r} ({rep['pattern']})"  # the layout as the plan and `show` state it
        engines += _replica_engines(label, r, rep, int(model["num_layers"]), framework, cluster, by_name, ordinals)
    if framework != "megatron":  # the hosts reach a script (Megatron's sizes name none)
        for device in {st.node: by_name[st.devices[0]] for e in engines for st in e.stages}.values():
            stage_host(device, cluster)
    requests = plan.data["workload"]["requests"]
    return ServingExport(
        framework=framework,
        plan_path=where,
        model=_model_arg(model["name"]),
        dtype=dtype or model["dtype"],
        num_layers=int(model["num_layers"]),
        max_model_len=max(math.ceil(q["prompt_len"] + q["output_len"]) for q in requests),
        tpot_slo_s=float(plan.data["workload"]["tpot_slo_s"]),
        tokens_per_s=float(plan.serving["tokens_per_s"]),
        engines=tuple(engines),
    )


def _replica_engines(
    label: str,
    r: int,
    rep: dict[str, Any],
    num_layers: int,
    framework: str,
    cluster: ClusterSpec,
    by_name: dict[str, DeviceSpec],
    ordinals: dict[str, int],
) -> list[EnginePlan]:
    """The engines of one pattern, one per copy, after the rules of the module docstring."""
    layers, copies, title = rep["layers"], rep["devices"], TITLES[framework]
    if not copies or any(len(copy) != len(layers) for copy in copies) or len(copies) != rep["count"]:
        raise ServingExportError(
            f"{label}: devices do not match count {rep['count']} and {len(layers)} stage(s) of layers"
        )
    if sum(layers) != num_layers or any(n < 1 for n in layers):
        raise ServingExportError(
            f"{label}: layers per stage {layers} do not add up to the model's {num_layers} (each stage at least one)"
        )
    out = []
    for c, copy in enumerate(copies):
        stages = tuple(
            _stage(f"{label}, copy {c}, stage {s}", names, layers[s], by_name, ordinals, cluster)
            for s, names in enumerate(copy)
        )
        for s, stage in enumerate(stages):
            if len(stage.gpus) != len(stages[0].gpus):
                raise ServingExportError(
                    f"{label}, copy {c}: stage {s} has tensor-parallel degree {len(stage.gpus)}, stage 0 has "
                    f"{len(stages[0].gpus)}: {title} uses one tensor-parallel size for every stage (plan with "
                    "--exportable vllm to search only such layouts)"
                )
        if framework != "megatron" and rep["micro_batches"] != len(layers):
            raise ServingExportError(
                f"{label}: {rep['micro_batches']} micro-batch(es) over {len(layers)} pipeline stage(s): "
                f"{title} keeps one batch per stage in flight (micro-batches = pipeline size; "
                "plan with --exportable vllm)"
            )
        fractions = [cluster.kind(st.kind).usable_mem_bytes / cluster.kind(st.kind).mem_bytes for st in stages]
        engine = EnginePlan(
            name=f"r{r}c{c}",
            replica=r,
            copy=c,
            pattern=rep["pattern"],
            tensor_parallel=len(copy[0]),
            stages=stages,
            concurrency=int(rep["concurrency"]),
            tokens_per_s=float(rep["tokens_per_s"]),
            mem_fraction=min(fractions),
        )
        if framework == "sglang":
            _check_sglang_hosts(f"{label}, copy {c}", engine)
        if framework == "vllm" and len(engine.hosts) > 1:
            _check_vllm_hosts(f"{label}, copy {c}", engine)
        out.append(engine)
    return out


def _stage(
    label: str,
    names: list[str],
    layers: int,
    by_name: dict[str, DeviceSpec],
    ordinals: dict[str, int],
    cluster: ClusterSpec,
) -> EngineStage:
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ServingExportError(f"{label}: device {missing[0]!r} is not in cluster {cluster.name!r}")
    devs = [by_name[n] for n in names]
    kinds = {d.kind for d in devs}
    cpu = [k for k in sorted(kinds) if cluster.kind(k).type == "cpu"]
    if cpu:
        raise ServingExportError(
            f"{label} runs on CPU device kind {cpu[0]!r}: the frameworks run GPU stages only "
            "(plan without --allow-cpu, or with --exportable vllm)"
        )
    nodes = {d.node for d in devs}
    if len(nodes) != 1 or len(kinds) != 1:
        raise ServingExportError(
            f"{label}: devices on {len(nodes)} node(s) of {len(kinds)} kind(s): a stage is one "
            "tensor-parallel group of one kind on one host"
        )
    d = devs[0]
    return EngineStage(
        host=_host_of(d),
        node=d.node,
        kind=d.kind,
        gpus=tuple(ordinals[x.name] for x in devs),
        devices=tuple(names),
        layers=int(layers),
    )


def _host_of(device: DeviceSpec) -> str:
    return device.hostname or device.node


def stage_host(device: DeviceSpec, cluster: ClusterSpec) -> str:
    """The host a device's engine runs on (EngineStage.host): its node's hostname, else the node's name;
    ServingExportError naming the spec file and the node when that is not a host name or an address."""
    t = next(i for i, n in enumerate(cluster.nodes) if n.name == device.node_template)
    if device.hostname:
        return check_host(device.hostname, f"{cluster.source}: nodes[{t}].hostname", ServingExportError)
    problem = hostname_problem(device.node)
    if problem is not None:
        raise ServingExportError(
            f"{cluster.source}: nodes[{t}]: node {quote(device.node)} has no hostname, so the export would name "
            f"its host by the node's name, and {problem}; set `hostname:` on nodes[{t}]"
        )
    return _host_of(device)


def _check_sglang_hosts(label: str, engine: EnginePlan) -> None:
    """SGLang's launcher gives node k of n the stages k*p/n .. (k+1)*p/n - 1: equal, consecutive runs."""
    hosts = engine.hosts
    per_host = engine.pipeline_parallel / len(hosts)
    for k, host in enumerate(hosts):
        stages = engine.host_stages(host)
        if stages != list(range(round(k * per_host), round(k * per_host) + len(stages))) or len(stages) != per_host:
            raise ServingExportError(
                f"{label}: stage {stages[0]} on host {host!r} holds stages {stages} of {engine.pipeline_parallel}: "
                f"SGLang across {len(hosts)} hosts gives each the same number of consecutive stages"
            )


def vllm_host_order(engine: EnginePlan) -> list[str]:
    """The hosts in the order vLLM's Ray executor ranks their GPUs: the head (the driver's host)
    first, then the others by their number of the engine's GPUs, fewer first (ties: by IP
    address, which the spec does not know; kept here in pipeline order)."""
    return [engine.hosts[0], *sorted(engine.hosts[1:], key=lambda h: len(engine.host_gpus(h)))]


def _host_kinds(engine: EnginePlan, host: str) -> list[str]:
    """The kind of each of the engine's GPUs on the host, in ascending GPU order (vLLM's within a host)."""
    return [kind for _, kind in sorted((g, st.kind) for st in engine.stages if st.host == host for g in st.gpus)]


def vllm_ip_ties(engine: EnginePlan) -> bool:
    """Whether hosts after the head hold as many GPUs but of different kinds: their order, hence
    which of them runs which stages, then depends on their IP addresses."""
    rest = engine.hosts[1:]
    return any(
        len(engine.host_gpus(a)) == len(engine.host_gpus(b)) and _host_kinds(engine, a) != _host_kinds(engine, b)
        for i, a in enumerate(rest)
        for b in rest[i + 1 :]
    )


def _check_vllm_hosts(label: str, engine: EnginePlan) -> None:
    """vLLM's Ray executor gives rank r the r-th GPU of `vllm_host_order` and stage s the ranks
    s*t .. (s+1)*t - 1: every stage must land on GPUs of the kind the plan gave it (which host
    of that kind runs it does not change the plan's memory or time)."""
    planned = [st.kind for st in engine.stages for _ in st.gpus]
    ranked = [kind for host in vllm_host_order(engine) for kind in _host_kinds(engine, host)]
    for rank, (want, got) in enumerate(zip(planned, ranked)):
        if want != got:
            s = rank // engine.tensor_parallel
            raise ServingExportError(
                f"{label}: stage {s} ({want} on host {engine.stages[s].host!r}) would run on {got} GPUs: "
                "vLLM's Ray executor ranks the head's GPUs first, then the other hosts' by their GPU count "
                "(fewer first), each host's in ascending order, and this plan's pipeline is in another order"
            )


def _model_arg(name: str) -> str:
    """The plan's model as the frameworks' model path: a config.json's folder, else the name."""
    return (os.path.dirname(name) or ".") if name.endswith(".json") else name


def assign_ports(engines: tuple[EnginePlan, ...], base: int, step: int) -> dict[str, int]:
    """A port per engine, the smallest base + k*step that no other engine on any of its hosts uses."""
    used: dict[str, set[int]] = {}
    out = {}
    for e in engines:
        port = base
        while any(port in used.get(h, ()) for h in e.hosts):
            port += step
        for h in e.hosts:
            used.setdefault(h, set()).add(port)
        out[e.name] = port
    return out


def megatron_config(export: ServingExport) -> dict[str, Any]:
    """Megatron-LM's parallel sizes per pattern: tensor t, pipeline p, data = the copies, and the
    layer split (--decoder-first/last-pipeline-num-layers when only the end stages differ, else
    --pipeline-model-parallel-layout, E the embedding, t a decoder layer, L the loss)."""
    patterns: dict[int, list[EnginePlan]] = {}
    for e in export.engines:
        patterns.setdefault(e.replica, []).append(e)
    out = []
    for r, copies in patterns.items():
        first = copies[0]
        t, p, split = first.tensor_parallel, first.pipeline_parallel, first.layers
        args = [
            "--tensor-model-parallel-size",
            str(t),
            "--pipeline-model-parallel-size",
            str(p),
            "--num-layers",
            str(export.num_layers),
        ]
        if len(set(split)) > 1:
            middle = split[1:-1]
            if p > 2 and len(set(middle)) == 1:
                args += [
                    "--decoder-first-pipeline-num-layers",
                    str(split[0]),
                    "--decoder-last-pipeline-num-layers",
                    str(split[-1]),
                ]
            else:
                args += ["--pipeline-model-parallel-layout", "E" + "|".join(f"t*{n}" for n in split) + ",L"]
        out.append(
            {
                "replica": r,
                "pattern": first.pattern,
                "tensor_model_parallel_size": t,
                "pipeline_model_parallel_size": p,
                "data_parallel_size": len(copies),
                "num_layers_per_stage": split,
                "args": " ".join(args),
                "tokens_per_s_per_copy": first.tokens_per_s,
                "devices": [[list(s.devices) for s in e.stages] for e in copies],
            }
        )
    return {
        "framework": "megatron",
        "plan": export.plan_path,
        "model": export.model,
        "num_layers": export.num_layers,
        "patterns": out,
    }


def engines_config(export: ServingExport, ports: dict[str, int]) -> dict[str, Any]:
    """The engines as JSON (`export --format json`): sizes, partition, hosts, ports and shares."""
    return {
        "framework": export.framework,
        "plan": export.plan_path,
        "model": export.model,
        "dtype": export.dtype,
        "num_layers": export.num_layers,
        "max_model_len": export.max_model_len,
        "tokens_per_s": export.tokens_per_s,
        "engines": [
            {
                "name": e.name,
                "replica": e.replica,
                "copy": e.copy,
                "pattern": e.pattern,
                "tensor_parallel_size": e.tensor_parallel,
                "pipeline_parallel_size": e.pipeline_parallel,
                "layers_per_stage": e.layers,
                "layer_partition": layer_partition(e, export.num_layers),
                "max_num_seqs": e.concurrency,
                "mem_fraction": e.mem_fraction,
                "port": ports[e.name],
                "head": e.hosts[0],
                "hosts": [{"host": h, "stages": e.host_stages(h), "gpus": e.host_gpus(h)} for h in e.hosts],
                "tokens_per_s": e.tokens_per_s,
                "share": export.share(e),
            }
            for e in export.engines
        ],
    }
