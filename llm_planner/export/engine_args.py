"""What a serving plan means in the engines' own terms (llm_planner.export.serving): the dtype and
quantization, the longest sequence (--max-model-len / --context-length), the KV budget and the
per-iteration token budget, and the ports each engine takes on its hosts.

Facts about the engines are those of the releases pinned in `ENGINE_VERSIONS` (export/serving.py),
read from their source (tests/data/engine_flags lists their flags, benchmarks/engine_flags.py
writes the lists):

- KV budget. The plan holds, on every stage, `concurrency` sequences at the workload's mean full
  context ceil(E[O (P + O)] / E[O]) tokens (docs/serving.md): `concurrency * that` tokens of KV
  per engine. SGLang takes it as --max-total-tokens. vLLM takes --kv-cache-memory-bytes, the same
  bytes on every GPU, and gives every worker the number of blocks of the worker that holds the
  fewest, shrinking the others' tensors to it (vllm/v1/core/kv_cache_planning.py): the bytes of
  the tokens on a GPU of the stage with most layers, in whole blocks, and one block more, which
  vLLM holds back as its null block before it checks that one sequence of --max-model-len fits
  (`VLLM_BLOCK_TOKENS`: the largest block its CUDA attention backends take by default).
- Per-iteration tokens: the plan's own budget (options.max_batched_tokens, what its TTFT and its
  limit b (1 + E[P]/E[O]) <= budget assumed; llm_planner.serving.replica), written explicitly as
  --max-num-batched-tokens / --chunked-prefill-size, whatever the engine's default for the GPUs
  (vLLM's OpenAI server: 16384 from 160 GiB, 8192 from 70 GiB except on A100s, else 2048; SGLang:
  2048 under 20 GiB, 4096 under 60 GiB, 8192 under 160 GiB, else 16384).
- Ports: SGLang binds --dist-init-addr's port and the 6 above it (PortArgs.init_new:
  NUM_DERIVED_PORTS), its HTTP --port and --port + 1 (the gRPC sidecar); vLLM's multi-node head
  binds --master-port and --master-port + 1. Every such port is spaced by `PORT_STEP` per host.
  A Ray cluster takes the ports of `ray_ports` (ray start's flags), a block per cluster on a host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_planner.core.precision import Precision, PrecisionError, precision_from_dict
from llm_planner.core.spec import DeviceKindSpec
from llm_planner.cost.roofline import shard_of
from llm_planner.graph.checkpoint import CheckpointPrecision, checkpoint_precision
from llm_planner.graph.hf_config import named_config
from llm_planner.graph.ir import GraphError
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.serving.tasks import build_serving_tasks
from llm_planner.serving.workload import ServingWorkload

PORT_STEP = 10  # > SGLang's dist-init port + 6 derived ones; > vLLM's master port + 1
VLLM_PORT, SGLANG_PORT, VLLM_MASTER_PORT, DIST_INIT_PORT = 8000, 30000, 29501, 20000
RAY_BASE, RAY_BLOCK, RAY_WORKER_PORTS = 13000, 500, 400  # a Ray cluster's ports: RAY_BASE + k * RAY_BLOCK ..
LONG_CONTEXT_ENV = {  # what lets each engine take sequences past max_position_embeddings
    "vllm": "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    "sglang": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
}
# The plan's element types as vLLM's and SGLang's --dtype names, and a config's torch_dtype as ours.
DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
FP8_KV = {"vllm": "fp8", "sglang": "fp8_e4m3"}  # --kv-cache-dtype of a plan that holds 1-byte KV


class ServingExportError(ValueError):
    """A serving plan the framework cannot run as planned, or an export option it cannot take; the
    message names the replica and stage, or the flag or field (the CLI exits 2 with it)."""


@dataclass(frozen=True, kw_only=True)
class EngineDtype:
    dtype: str  # --dtype
    quantization: str | None  # --quantization
    kv_cache_dtype: str | None  # --kv-cache-dtype
    note: str  # where the dtype comes from, for the script's header


def engine_token_budget(engine: str, kinds: Sequence[DeviceKindSpec]) -> int:
    """The per-iteration token budget `engine` takes by default on the smallest of the replica's
    GPUs (module docstring): vLLM's OpenAI server's --max-num-batched-tokens, SGLang's
    --chunked-prefill-size. A100s count as A100s by their name or catalog entry."""
    kind = min(kinds, key=lambda k: k.mem_bytes)
    gib = kind.mem_bytes / 2**30
    if engine == "sglang":
        return next(b for most, b in ((20, 2048), (60, 4096), (160, 8192), (math.inf, 16384)) if gib < most)
    a100 = any("a100" in (name or "").lower() for name in (kind.name, kind.catalog))
    return 16384 if gib >= 160 else 8192 if gib >= 70 and not a100 else 2048


def _checkpoint(model: str) -> CheckpointPrecision | None:
    try:
        return checkpoint_precision(model)
    except (GraphError, OSError, ValueError):
        return None  # named_config already read it when the plan was made and verified


# The plan's weight formats as the engines' --quantization (llm_planner.core.precision). vLLM has
# no method that quantizes to int8 W8A8 as it loads: it reads an int8 checkpoint's method from its
# config (compressed-tensors), so nothing is written for it.
QUANTIZATION = {
    "vllm": {"fp8": "fp8", "int4-awq": "awq", "int4-gptq": "gptq", "int8": None},
    "sglang": {"fp8": "fp8", "int4-awq": "awq", "int4-gptq": "gptq", "int8": "w8a8_int8"},
}


def engine_dtype(precision: Precision, model: str, framework: str, where: str) -> EngineDtype:
    """The engines' --dtype, --quantization and --kv-cache-dtype of a plan's precision. Activations:
    fp16/bf16 plans (the same bytes, so the same plan) take the config's torch_dtype when it is one
    of them; fp32 stays (asked for); a version-5 fp8 plan's take the config's ("auto" without one).
    Weights: no --quantization when the checkpoint's quantization_config declares the plan's format
    (the engine reads it there and picks its kernel), else the format's method (QUANTIZATION).
    KV cache: fp8 as each engine names it. ServingExportError when the checkpoint declares another
    format than the plan's."""
    ckpt = _checkpoint(model)
    from_config = ckpt.dtype if ckpt is not None else None
    act = precision.activations
    if act not in DTYPE_NAMES and act != "fp8":
        raise ServingExportError(
            f"{where}: model dtype {act!r}: the engines take one of {', '.join([*DTYPE_NAMES, 'fp8'])} "
            "(plan with --dtype set to one of them)"
        )
    if act in DTYPE_NAMES:
        same = act in ("fp16", "bf16") and from_config in ("fp16", "bf16")
        dtype, note = (DTYPE_NAMES[from_config], "model config") if same else (DTYPE_NAMES[act], "plan")
    else:  # version 5's fp8: the checkpoint's activations
        dtype = DTYPE_NAMES.get(from_config or "", "auto")
        note = "the model's config" if from_config else "the checkpoint's"
    kv = FP8_KV[framework] if precision.kv_cache == "fp8" else None
    if precision.weights == act and act in DTYPE_NAMES:  # unquantized weights
        return EngineDtype(dtype=dtype, quantization=None, kv_cache_dtype=kv, note=note)
    stated = ckpt.weights if ckpt is not None else None
    if stated is not None and (stated, ckpt.group_size) != (precision.weights, precision.group_size):
        raise ServingExportError(
            f"{where}: model.precision.weights {precision.weights_label}, but {ckpt.source} declares "
            f"{ckpt.weights_label} in its quantization_config (plan with --weights {ckpt.weights_label})"
        )
    method = None if stated is not None else QUANTIZATION[framework][precision.weights]
    source = "its quantization_config" if stated is not None else "a checkpoint quantized so"
    note = f"{note}; weights {precision.weights_label} ({source})"
    return EngineDtype(dtype=dtype, quantization=method, kv_cache_dtype=kv, note=note)


def plan_precision(data: dict, where: str) -> Precision:
    """The precision a plan's replicas run in (model.precision: every replica's, as verify checks)."""
    try:
        return precision_from_dict(data["model"]["precision"], f"{where}: model.precision")
    except PrecisionError as exc:
        raise ServingExportError(str(exc)) from None


VLLM_BLOCK_TOKENS = 64  # vLLM's KV block: 16 tokens, 64 under FlashMLA; sized here for the larger


@dataclass(frozen=True, kw_only=True)
class KVBudget:
    tokens: int  # KV tokens the plan holds per engine (every stage holds them for its layers)
    gpu_bytes: int  # vLLM's --kv-cache-memory-bytes: those tokens on a GPU of the stage with most layers


def model_config(model: str, where: str) -> DecoderConfig:
    """The plan's model as a decoder config; ServingExportError naming the plan's field when it is gone."""
    try:
        config = named_config(model)
    except GraphError as exc:
        raise ServingExportError(f"{where}: model.name: {exc}") from None
    if config is None:
        raise ServingExportError(
            f"{where}: model.name {model!r} is neither a decoder preset nor a config.json: the export needs "
            "the model's context limit and KV cache size"
        )
    return config


def kv_budget(
    config: DecoderConfig,
    dtype: str | Precision,
    workload: ServingWorkload,
    tp: int,
    concurrency: int,
    layers: list[int],
) -> KVBudget:
    """The KV the plan sized an engine for (module docstring); the same task costs as the planner's.
    An engine with data-parallel attention passes one rank's: its sequences at tp = 1 (each rank
    holds its sequences' whole caches in a KV pool of its own)."""
    block = build_serving_tasks(config, workload, dtype).tasks["block"]
    per_seq = (shard_of(block, tp) if tp > 1 else block).mem_bytes_per_sample  # one layer, per device
    held = max(1, math.ceil(workload.kv_context))
    tokens = concurrency * held
    blocks = -(-tokens // VLLM_BLOCK_TOKENS) + 1  # whole blocks, and vLLM's null block (module docstring)
    return KVBudget(tokens=tokens, gpu_bytes=math.ceil(blocks * VLLM_BLOCK_TOKENS * per_seq * max(layers) / held))


def max_model_len(asked: int | None, limit: int, budgets: dict[str, KVBudget], where: str, longest: int = 0) -> int:
    """--max-model-len: the one the user asked for, else the model's context limit or the plan's
    longest request (prompt + output) where that is longer (the engines' opt-in: `past_limit`),
    never more than the KV the smallest engine holds (a request longer than that could never run
    there). A length above both the limit and the plan's longest request is refused."""
    name, smallest = min(budgets.items(), key=lambda kv: kv[1].tokens)
    if asked is None:
        return min(max(limit, longest), smallest.tokens)
    if asked < 1:
        raise ServingExportError(f"--max-model-len: must be a positive number of tokens, got {asked}")
    if asked > max(limit, longest):
        longer = f", and the plan's longest request is {longest}" if longest > limit else ""
        raise ServingExportError(
            f"--max-model-len {asked}: above the model's context limit of {limit} tokens{longer} ({where})"
        )
    if asked > smallest.tokens:
        raise ServingExportError(
            f"--max-model-len {asked}: engine {name} of {where} holds {smallest.tokens} tokens of KV cache "
            "(its sequences in flight at the workload's mean full context): one sequence that long does not fit"
        )
    return asked


def past_limit(framework: str, length: int, limit: int) -> tuple[str, str] | None:
    """The environment variable (name, value) with which `framework` takes sequences of `length`
    tokens past the model's context limit (max_position_embeddings); None when none is needed."""
    if length <= limit:
        return None
    return LONG_CONTEXT_ENV[framework], "1"


def assign_ports(engines: Sequence[Any], base: int, step: int) -> dict[str, int]:
    """A port per engine (EnginePlan: its name and hosts), the smallest base + k*step that no other
    engine on any of its hosts uses."""
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


RAY_PORT_FLAGS = (  # ray start's flags, offsets in a cluster's block
    ("--port", 0),
    ("--dashboard-port", 1),
    ("--node-manager-port", 2),
    ("--object-manager-port", 3),
    ("--ray-client-server-port", 4),
    ("--dashboard-agent-listen-port", 5),
    ("--dashboard-agent-grpc-port", 6),
    ("--runtime-env-agent-port", 7),
    ("--metrics-export-port", 8),
)
RAY_HEAD_ONLY = ("--port", "--dashboard-port", "--ray-client-server-port")


def ray_ports(k: int, *, head: bool) -> list[str]:
    """`ray start` flags of the k-th Ray cluster on a host: every port it binds in a block of its own,
    and a session folder of its own."""
    base = RAY_BASE + k * RAY_BLOCK
    if base + RAY_BLOCK > 32768:  # Linux's ephemeral ports start there
        raise ServingExportError(
            f"{k + 1} Ray clusters on one host: more than fit below port 32768 (export with --vllm-multinode native)"
        )
    flags = [f"{f}={base + off}" for f, off in RAY_PORT_FLAGS if head or f not in RAY_HEAD_ONLY]
    first = base + RAY_BLOCK - RAY_WORKER_PORTS
    workers = [f"--min-worker-port={first}", f"--max-worker-port={first + RAY_WORKER_PORTS - 1}"]
    # its own session folder too: Ray records "the" cluster of a host (its address, session_latest) there
    return [*flags, *workers, f"--temp-dir=/tmp/ray-llm-planner-{k}"]
