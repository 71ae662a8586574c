"""A serving plan as engines a serving framework starts: `llm-planner export PLAN --to vllm|sglang|megatron`.

Every copy of every replica pattern of the plan (docs/plan-format.md, "Serving plans") is one
engine: p pipeline stages, each a tensor-parallel group of t devices on one host, running
`layers[s]` consecutive decoder layers (sum over s = the model's layers), with at most
`concurrency` sequences in flight split into `micro_batches` batches. Each stage's devices are
one tensor-parallel group of one kind on one host; what else an engine of each framework needs
(one degree, no CPU, a micro-batch per stage, the same number of consecutive stages on every
host) is the rule of llm_planner.serving.engines, the one `plan --exportable vllm|sglang` searches
within, so a plan made with it always exports. For vLLM over Ray (`--vllm-multinode ray`) the
hosts' rule is instead that every stage lands on GPUs of its kind in the order vLLM's Ray executor
ranks them (`vllm_ray.vllm_host_order`). What the engines are told of dtype, memory and the
longest sequence comes from llm_planner.export.engine_args. `build_engines` raises
ServingExportError naming the replica, copy and stage that breaks a rule, and the option that
avoids it. The layer split goes to VLLM_PP_LAYER_PARTITION / SGLANG_PP_LAYER_PARTITION (layers per
stage, comma-separated; both read it in their get_pp_indices) when it is not the even split.

The load balancer in front of the engines sends engine e the share
tokens_per_s(e) / sum over engines of tokens_per_s: each engine then runs at the operating
point the plan predicts. Scripts are written by llm_planner.export.serving_scripts; Megatron's
parallel sizes per pattern (tensor t, pipeline p, data = copies) by `megatron_config`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from llm_planner.core.fmt import quote
from llm_planner.core.names import check_host, hostname_problem
from llm_planner.core.spec import ClusterSpec, DeviceSpec
from llm_planner.export.engine_args import (
    LONG_CONTEXT_ENV,
    KVBudget,
    ServingExportError,
    engine_dtype,
    kv_budget,
    max_model_len,
    model_config,
    plan_precision,
)
from llm_planner.export.routers import ROUTER_VERSIONS
from llm_planner.export.vllm_ray import check_vllm_ray_hosts
from llm_planner.serving.classes import DP_ALL2ALL, is_dp
from llm_planner.serving.engines import StageForm, dp_attention_refusal, engine_refusal
from llm_planner.serving.layout import stage_attention
from llm_planner.serving.plan_file import ServingPlanFile
from llm_planner.serving.workload import plan_workload

log = logging.getLogger(__name__)
# decoders whose published checkpoints hold a vision encoder beside them, which a plan of the decoder
# does not hold: the engines are told to serve the language model alone (llm_planner.graph.moe, UNPLANNED)
LANGUAGE_ONLY = ("llama4_text",)

FRAMEWORKS = ("vllm", "sglang", "megatron")
# The engine releases the scripts are written for: their flags are checked against these
# (tests/data/engine_flags/NAME-VERSION.txt, written by benchmarks/engine_flags.py).
ENGINE_VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23", "ray": "2.60.0"}  # ray: `ray start` (vLLM over Ray)
ENGINE_VERSIONS |= ROUTER_VERSIONS  # the routers in front (export.routers)
# How a vLLM engine spans hosts: vLLM's own --nnodes/--node-rank/--master-addr/--headless, or Ray.
VLLM_MULTINODE = ("native", "ray")


@dataclass(frozen=True, kw_only=True)
class EngineStage:
    """One pipeline stage of an engine: a tensor-parallel group on one host, or a group with
    data-parallel attention over whole servers (its members on the further hosts in `others`)."""

    host: str  # the node's hostname, or the node's name when the spec gives none
    node: str
    kind: str
    gpus: tuple[int, ...]  # CUDA ordinals on the host (the node's GPU kinds in spec order)
    devices: tuple[str, ...]
    layers: int
    others: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (host, CUDA ordinals) of the group's other hosts

    @property
    def parts(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """(host, CUDA ordinals) of each host the stage's group runs on, its first host first."""
        return ((self.host, self.gpus), *self.others)


@dataclass(frozen=True, kw_only=True)
class EnginePlan:
    """One copy of one replica pattern: what one `vllm serve` / `sglang.launch_server` runs."""

    name: str  # "r<replica>c<copy>"
    replica: int
    copy: int
    pattern: str
    tensor_parallel: int  # the devices of each stage's group
    stages: tuple[EngineStage, ...]
    concurrency: int
    tokens_per_s: float
    mem_fraction: float  # usable share of device memory, the smallest over the engine's kinds
    data_parallel_attention: bool = False  # one group, attention data-parallel, experts split over it
    all2all: str = DP_ALL2ALL["dp"]  # how such a group moves tokens to experts (vLLM's --all2all-backend names)

    @property
    def ranks(self) -> int:
        """Schedulers the engine's sequences split over: each member of a group with data-parallel
        attention runs its own; else one."""
        return self.tensor_parallel if self.data_parallel_attention else 1

    @property
    def rank_concurrency(self) -> int:
        """Sequences in flight per rank (the busiest one's, where they do not split evenly)."""
        return -(-self.concurrency // self.ranks)

    @property
    def kv_shards(self) -> int:
        """Devices one sequence's KV cache is split over: the tensor-parallel group, else 1."""
        return self.tensor_parallel // self.ranks

    @property
    def pipeline_parallel(self) -> int:
        return len(self.stages)

    @property
    def layers(self) -> list[int]:
        return [s.layers for s in self.stages]

    @property
    def hosts(self) -> list[str]:
        """Hosts in pipeline order (the first stage's host first)."""
        return list(dict.fromkeys(h for s in self.stages for h, _ in s.parts))

    def host_stages(self, host: str) -> list[int]:
        return [i for i, s in enumerate(self.stages) if any(h == host for h, _ in s.parts)]

    def host_gpus(self, host: str) -> list[int]:
        return [g for s in self.stages for h, gpus in s.parts if h == host for g in gpus]


@dataclass(frozen=True, kw_only=True)
class ServingExport:
    """The engines of a plan and what every engine shares."""

    framework: str
    plan_path: str
    model: str  # what the scripts pass as the model (MODEL overrides it)
    dtype: str  # the framework's --dtype value
    quantization: str | None = None  # --quantization (fp8 plans)
    kv_cache_dtype: str | None = None  # --kv-cache-dtype (fp8 plans)
    dtype_note: str = "plan"  # where the dtype comes from
    num_layers: int
    max_model_len: int  # --max-model-len / --context-length (engine_args.max_model_len)
    model_limit: int = 0  # the model's context limit
    tpot_slo_s: float
    tokens_per_s: float
    engines: tuple[EnginePlan, ...]
    kv: dict[str, KVBudget] | None = None  # per engine name (not for megatron)
    batched_tokens: dict[str, int] | None = None  # per engine: the plan's per-iteration token budget
    multinode: str = "native"  # vLLM across hosts: VLLM_MULTINODE
    language_model_only: bool = False  # --language-model-only: the checkpoint's vision encoder is not planned
    eplb: int | None = None  # the plan's EPLB redundant experts for its dpaK engines (None: off)

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


def build_engines(
    plan: ServingPlanFile,
    cluster: ClusterSpec,
    framework: str,
    *,
    max_len: int | None = None,
    multinode: str = "native",
) -> ServingExport:
    """The plan's engines for `framework`; ServingExportError naming the replica and stage of a
    rule the plan breaks (module docstring), or the flag (`max_len`: export --max-model-len;
    `multinode`: --vllm-multinode) the engines cannot take."""
    if framework not in FRAMEWORKS:
        raise ServingExportError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    if multinode not in VLLM_MULTINODE:
        raise ServingExportError(f"--vllm-multinode {multinode!r}: choose one of {', '.join(VLLM_MULTINODE)}")
    model, where = plan.data["model"], str(plan.path or "<plan>")
    if cluster.sha256 and plan.data["inputs"].get("cluster_sha256") not in (None, cluster.sha256):
        log.warning("%s: the cluster spec changed since the plan was made; exporting with today's spec", where)
    precision = plan_precision(plan.data, where)
    dtype = engine_dtype(precision, model["name"], framework, where) if framework != "megatron" else None
    by_name = cluster.device_map()
    ordinals = gpu_ordinals(cluster)
    engines = []
    dense = int(
        model.get("dense_layers", 0)
    )  # the first stage's dense first layers (DeepSeek's), in the engines' count
    for r, rep in enumerate(plan.replicas):
        label = f"{where}: replica {r} ({rep['pattern']})"  # the layout as the plan and `show` state it
        rep = dict(rep, layers=[rep["layers"][0] + dense, *rep["layers"][1:]]) if rep["layers"] else rep
        engines += _replica_engines(
            label, r, rep, int(model["num_layers"]) + dense, (framework, multinode), cluster, by_name, ordinals
        )
    if any(e.data_parallel_attention for e in engines):
        why = dp_attention_refusal(framework, model_config(model["name"], where).hf_model_type)
        if why is not None:
            raise ServingExportError(f"{where}: {why} (plan with --exportable {framework}, or --no-dp-attention)")
    export = ServingExport(
        framework=framework,
        plan_path=where,
        model=_model_arg(model["name"]),
        dtype=dtype.dtype if dtype else model["dtype"],
        num_layers=int(model["num_layers"]) + dense,
        max_model_len=max(math.ceil(q["prompt_len"] + q["output_len"]) for q in plan.data["workload"]["requests"]),
        tpot_slo_s=float(plan.data["workload"]["tpot_slo_s"]),
        tokens_per_s=float(plan.serving["tokens_per_s"]),
        engines=tuple(engines),
    )
    if framework == "megatron":  # sizes only: no host, budget or dtype reaches a command line
        return export
    for device in {by_name[d].node: by_name[d] for e in engines for st in e.stages for d in st.devices}.values():
        stage_host(device, cluster)  # the hosts reach a script
    return _engine_budgets(export, plan, cluster, dtype, max_len, multinode)


def _engine_budgets(export, plan, cluster, dtype, max_len, multinode) -> ServingExport:
    """The export with what the engines are told of memory: KV budgets, the longest sequence and
    the per-iteration token budget (llm_planner.export.engine_args)."""
    model, workload = plan.data["model"], plan_workload(plan.data, source=f"{plan.path}: workload")
    config = model_config(model["name"], export.plan_path)
    kv = {
        e.name: kv_budget(
            config,
            plan_precision(plan.data, export.plan_path),
            workload,
            e.kv_shards,
            e.rank_concurrency,
            e.layers,
        )
        for e in export.engines
    }
    limit = int(config.max_positions)
    length = max_model_len(max_len, limit, kv, export.plan_path, workload.max_context)
    if workload.max_context > length:
        log.warning(
            "%s: the engines take sequences of at most %d tokens (%s), shorter than the workload's longest "
            "prompt + output, %d: they reject those requests",
            export.plan_path,
            length,
            "--max-model-len" if max_len is not None else "the KV cache the smallest engine holds",
            workload.max_context,
        )
    if length > limit:
        log.warning(
            "%s: the engines take sequences of up to %d tokens, past %s's context limit of %d "
            "(max_position_embeddings), as the plan's requests need; the scripts set %s=1, without which the "
            "engine refuses them; the model was not trained on positions that far",
            export.plan_path,
            length,
            model["name"],
            limit,
            LONG_CONTEXT_ENV[export.framework],
        )
    budget = plan.data["options"]["max_batched_tokens"]  # what the plan's TTFT and feasibility assumed
    batched = {e.name: budget for e in export.engines}
    return dataclasses.replace(
        export,
        quantization=dtype.quantization,
        kv_cache_dtype=dtype.kv_cache_dtype,
        dtype_note=dtype.note,
        max_model_len=length,
        model_limit=limit,
        kv=kv,
        batched_tokens=batched,
        multinode=multinode,
        language_model_only=config.hf_model_type in LANGUAGE_ONLY,
        eplb=plan.data["options"].get("eplb"),
    )


def _replica_engines(
    label: str,
    r: int,
    rep: dict[str, Any],
    num_layers: int,
    target: tuple[str, str],
    cluster: ClusterSpec,
    by_name: dict[str, DeviceSpec],
    ordinals: dict[str, int],
) -> list[EnginePlan]:
    """The engines of one pattern, one per copy, after the rules of the module docstring (`target`:
    the framework, and how vLLM spans hosts)."""
    (framework, multinode), layers, copies = target, rep["layers"], rep["devices"]
    if not copies or any(len(copy) != len(layers) for copy in copies) or len(copies) != rep["count"]:
        raise ServingExportError(
            f"{label}: devices do not match count {rep['count']} and {len(layers)} stage(s) of layers "
            "(the file was edited: plan again)"
        )
    if sum(layers) != num_layers or any(n < 1 for n in layers):
        raise ServingExportError(
            f"{label}: layers per stage {layers} do not add up to the model's {num_layers} (each stage at least one; "
            "plan again)"
        )
    out = []
    attention = (stage_attention(rep.get("segments", [])) + ["tp"] * len(layers))[: len(layers)]
    for c, copy in enumerate(copies):
        stages = tuple(
            _stage(f"{label}, copy {c}, stage {s}", names, layers[s], (by_name, ordinals, cluster), is_dp(attention[s]))
            for s, names in enumerate(copy)
        )
        if framework == "vllm" and multinode == "ray" and any(st.others for st in stages):
            raise ServingExportError(
                f"{label}, copy {c}: its data-parallel ranks span hosts: vLLM runs them across hosts with its own "
                "multi-node flags (export with --vllm-multinode native)"
            )
        forms = [
            StageForm(
                degree=len(st.devices),
                kind=st.kind,
                cpu=cluster.kind(st.kind).type == "cpu",
                host=st.host,
                attention=attention[s],
            )
            for s, st in enumerate(stages)
        ]
        m = rep["micro_batches"] if framework != "megatron" else None
        refusal = engine_refusal(framework, forms, m, even_hosts=not (framework == "vllm" and multinode == "ray"))
        if refusal is not None:
            raise ServingExportError(f"{label}, copy {c}: {refusal}")
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
            data_parallel_attention=any(map(is_dp, attention)),
            all2all=next((DP_ALL2ALL[a] for a in attention if is_dp(a)), DP_ALL2ALL["dp"]),
        )
        if framework == "vllm" and multinode == "ray" and len(engine.hosts) > 1:
            check_vllm_ray_hosts(f"{label}, copy {c}", engine)
        out.append(engine)
    return out


def _stage(label: str, names: list[str], layers: int, where: tuple, spanning: bool) -> EngineStage:
    """One stage's devices as the engine sees them (`where`: the devices by name, their CUDA
    ordinals, the cluster); a group over several hosts only with data-parallel attention (`spanning`)."""
    by_name, ordinals, cluster = where
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ServingExportError(
            f"{label}: device {missing[0]!r} is not in cluster {cluster.name!r} (plan again on today's spec)"
        )
    devs = [by_name[n] for n in names]
    kinds = {d.kind for d in devs}
    nodes = list(dict.fromkeys(d.node for d in devs))
    if (len(nodes) != 1 and not spanning) or len(kinds) != 1:
        raise ServingExportError(
            f"{label}: devices on {len(nodes)} node(s) of {len(kinds)} kind(s): a stage is one "
            "tensor-parallel group of one kind on one host (the file was edited: plan again)"
        )
    parts = [(n, [d for d in devs if d.node == n]) for n in nodes]
    (node, first), others = parts[0], parts[1:]
    return EngineStage(
        host=_host_of(first[0]),
        node=node,
        kind=first[0].kind,
        gpus=tuple(ordinals[x.name] for x in first),
        devices=tuple(names),
        layers=int(layers),
        others=tuple((_host_of(ds[0]), tuple(ordinals[x.name] for x in ds)) for _, ds in others),
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


def _model_arg(name: str) -> str:
    """The plan's model as the frameworks' model path: a config.json's folder, else the name."""
    return (os.path.dirname(name) or ".") if name.endswith(".json") else name
