"""The decoder's work per sequence in flight: the tasks one engine iteration runs for each sequence.

An iteration carries, per *sequence in flight*, one decode token at the workload's mean decode
context plus its share of prompt work, E[P]/E[O] prompt tokens (chunked prefill spreads each
prompt over the iterations of the output it produces; llm_planner.serving.workload), under the
engine's per-iteration token budget (`token_budget`, vLLM's --max-num-batched-tokens, SGLang's
--chunked-prefill-size). `build_serving_tasks` gives the parts' tasks (embed, one decoder layer
as "block", final_norm, lm_head, and "dense", one of DeepSeek's dense first layers, where the
model has them) with those costs per sequence, the block's weights and KV cache at the
precision's bytes; llm_planner.serving.costs prices them on a stage.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from functools import lru_cache

from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.precision import Precision, as_precision
from llm_planner.cost.dp_attention import dp_offered
from llm_planner.cost.eplb import replica_picks
from llm_planner.cost.iteration import Load
from llm_planner.graph.attention_window import check_window
from llm_planner.graph.decoder_graph import ID_BYTES, build_decoder_graph
from llm_planner.graph.ir import GraphError, Task
from llm_planner.graph.mla import mla_replicated_linear
from llm_planner.graph.transformer import DecoderConfig, matmul_parameters, stored_mlp_parameters
from llm_planner.serving.workload import ServingWorkload, WorkloadError

log = logging.getLogger(__name__)

PARTS = ("embed", "block", "final_norm", "lm_head")
# Per-iteration token budget when none is given: vLLM's default for its OpenAI server on A100s and
# on GPUs under 70 GiB (--max-num-batched-tokens 2048), SGLang's --chunked-prefill-size under
# 20 GiB; the larger defaults of larger GPUs only shorten the TTFT (llm_planner.export.engine_args).
DEFAULT_TOKEN_BUDGET = 2048


def sequences_in_budget(token_budget: int, prefill_per_output: float, chunked_prefill: bool = True) -> float:
    """The most sequences one micro-batch may hold: its decodes and their steady prompt share,
    1 + E[P]/E[O] tokens a sequence, within the token budget (serving.replica.within_budget);
    decodes alone without chunked prefill."""
    return token_budget / ((1.0 + prefill_per_output) if chunked_prefill else 1.0)


@dataclass(frozen=True, kw_only=True)
class ServingTasks:
    """The decoder's tasks per sequence in flight per iteration (module docstring)."""

    config: DecoderConfig
    dtype: str  # the activations' (the end parts, hand-offs and all-reduces)
    precision: Precision  # weights, activations and KV cache (llm_planner.core.precision)
    tasks: dict  # part -> Task (the block's weights and KV cache at the precision's bytes)
    prefill_per_output: float  # prompt tokens per output token, E[P]/E[O]
    kv_context: float  # KV tokens held per sequence in flight
    per_sequence: Load  # one layer's load per sequence in flight per iteration (module docstring)
    mean_prompt_len: float  # E[P] over requests
    token_budget: int = DEFAULT_TOKEN_BUDGET  # tokens one iteration may carry (module docstring)
    expert_imbalance: float = 1.0  # an MoE layer's busiest expert's rows over the mean (llm_planner.cost.moe_cost)
    chunked_prefill: bool = True  # False: prompts run whole in iterations of their own (cost.chunks; scored only)
    # per size k of a group with data-parallel attention, its busiest member's rows over the mean
    # (llm_planner.serving.expert_load); None, or a size not in it: expert_imbalance
    dp_imbalance: dict[int, float] | None = None
    # a measured router's chance per expert that one token reaches it (llm_planner.serving.expert_load;
    # graph.moe.experts_touched); None: uniform routing
    expert_picks: tuple[float, ...] | None = None
    # MoE: the engines rebalance the experts of groups with data-parallel attention (EPLB,
    # llm_planner.cost.eplb) with this many redundant replicas; None: no rebalancing
    redundant_experts: int | None = None

    @property
    def most_sequences(self) -> float:
        """The most sequences one micro-batch may hold (`sequences_in_budget`)."""
        return sequences_in_budget(self.token_budget, self.prefill_per_output, self.chunked_prefill)

    @property
    def dp_picks(self) -> tuple[float, ...] | None:
        """The chances one token reaches each routed expert a group with data-parallel attention
        holds: under EPLB each replica's (cost.eplb.replica_picks; uniform routing where no router
        was measured), else the experts' (`expert_picks`)."""
        if self.redundant_experts is None:
            return self.expert_picks
        e, k = self.config.num_experts, self.config.experts_per_token
        return replica_picks(self.expert_picks or (min(1.0, k / e),) * e, self.redundant_experts)

    def imbalance_of(self, degree: int, attention: str) -> float:
        """The imbalance factor an MoE layer is charged on a group (`attention` "tp", or data-parallel)."""
        if attention == "tp" or not self.dp_imbalance:
            return self.expert_imbalance
        return self.dp_imbalance.get(degree, self.expert_imbalance)

    @property
    def num_layers(self) -> int:
        """The layers the stages split: all but the dense first ones, which the first stage holds."""
        return self.config.num_layers - self.config.first_dense_layers

    @property
    def dense_layers(self) -> int:
        return self.config.first_dense_layers

    @property
    def hidden_bytes_per_token(self) -> float:
        """One token's hidden state: the message per token of a layer's all-reduces."""
        return self.config.hidden_size * DTYPE_BYTES[self.dtype]

    @property
    def handoff_bytes_per_seq(self) -> float:
        """Hidden states sent to the next stage per sequence per iteration (its prompt chunk too)."""
        return (1.0 + self.prefill_per_output) * self.config.hidden_size * DTYPE_BYTES[self.dtype]

    @property
    def return_bytes_per_seq(self) -> float:
        """The sampled token id, last stage back to the first."""
        return float(ID_BYTES)

    def shards_over(self, k: int) -> bool:
        return all(t.shards_over(k) for t in self.tasks.values())

    def dp_over(self, k: int) -> bool:
        """Whether a group of k may run the model's layers with data-parallel attention
        (llm_planner.cost.dp_attention: an MoE model whose experts split evenly over the k). It
        also asks that the end parts and the dense first layers' MLP would split over k, which the
        layout, running them whole on each rank, does not need (kept: a group it adds is untested)."""
        ends = all(t.shards_over(k) for part, t in self.tasks.items() if part not in ("block", "dense"))
        dense = not self.dense_layers or self.config.intermediate_size % k == 0
        return ends and dense and dp_offered(self.config.moe_layer(), k, self.redundant_experts)


def check_workload_window(config: DecoderConfig, workload: ServingWorkload, source: str | None = None) -> None:
    """GraphError naming `source` (the model's file or preset; default its name) when the workload's
    longest request does not fit inside the model's sliding window (llm_planner.graph.attention_window)."""
    longest = max(workload.requests, key=lambda r: r.prompt_len + r.output_len)
    where = "--prompt-len + --output-len" if workload.source == "flags" else f"{workload.source}: requests"
    context = f"prompt {longest.prompt_len} + output {longest.output_len} tokens ({where})"
    check_window(config, workload.max_context, context, source)


def check_context(config: DecoderConfig, workload: ServingWorkload) -> None:
    """The longest request (prompt + output) against the model's positions: past learned ones a
    WorkloadError (no embedding exists there); past a rotary model's `max_position_embeddings` a
    warning, once: the model computes there, TensorRT-LLM runs it (its own benchmarks ran Llama-2 to
    4,224 tokens), and vLLM and SGLang refuse such requests unless told otherwise."""
    if workload.max_context <= config.max_positions:
        return
    where = (
        "--prompt-len + --output-len" if workload.source == "flags" else f"{workload.source}: prompt_len + output_len"
    )
    if config.learned_positions:
        raise WorkloadError(
            f"{where} of {workload.max_context} tokens exceeds {config.name}'s {config.max_positions} learned positions"
        )
    _say_past_positions(where, workload.max_context, config.name, config.max_positions)


@lru_cache(maxsize=64)
def _say_past_positions(where: str, context: int, name: str, positions: int) -> None:
    log.warning(
        "%s of %d tokens is past %s's %d positions (max_position_embeddings): vLLM and SGLang refuse such requests "
        "unless told to allow them (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1); "
        "the plan prices them as the model computes them",
        where,
        context,
        name,
        positions,
    )


def check_group(config: DecoderConfig, precision: Precision) -> None:
    """WorkloadError when an int4 format's group size does not divide the rows its groups cut: each
    group of a linear layer's input holds g weights, and the engines' AWQ and GPTQ kernels refuse a
    layer whose input width (the hidden size, the MLP's widths) is not a multiple of g. A group of
    the hidden size is a checkpoint's per-channel one (`group_size: -1`, graph.checkpoint): a group
    a row, whatever the row's width."""
    g = precision.group_size
    if g is None:
        return
    widths = {"hidden_size": config.hidden_size}
    if g != config.hidden_size:
        widths |= {"intermediate_size": config.intermediate_size, "moe_intermediate_size": config.moe_intermediate_size}
    bad = [f"{name} {w}" for name, w in widths.items() if w > 0 and w % g]
    if bad:
        raise WorkloadError(
            f"--weights {precision.weights_label}: a group of {g} weights does not divide {config.name}'s "
            f"{', '.join(bad)}; the engines' int4 kernels need groups that do (e.g. :g128, :g64)"
        )


def build_serving_tasks(
    config: DecoderConfig,
    workload: ServingWorkload,
    dtype: str | Precision,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    expert_imbalance: float = 1.0,
    chunked_prefill: bool = True,
    dp_imbalance: dict[int, float] | None = None,
    expert_picks: tuple[float, ...] | None = None,
    redundant_experts: int | None = None,
) -> ServingTasks:
    """The tasks per sequence in flight (module docstring) in `dtype` (one dtype for everything) or
    a precision: the block's linear weights at the weight format's bytes, its KV cache at the KV
    cache dtype's, everything else at the activation dtype's."""
    precision = as_precision(dtype)
    dtype = precision.activations
    check_context(config, workload)
    check_group(config, precision)
    check_workload_window(config, workload)
    decode = _parts(config, "decode", max(1, round(workload.decode_context)), dtype)
    held = _parts(config, "decode", max(1, math.ceil(workload.kv_context)), dtype)
    prompts: dict[str, dict[str, float]] = {p: {} for p in decode}
    for r, of_requests in zip(workload.requests, workload.shares):
        share = of_requests / workload.mean_output_len
        for part, task in _parts(config, "prefill", r.prompt_len, dtype).items():
            for key in _SCALED:
                prompts[part][key] = prompts[part].get(key, 0.0) + share * getattr(task, key)
    ratio = workload.prefill_per_output
    prompt_keys = sum(
        share / workload.mean_output_len * r.prompt_len * (r.prompt_len + 1) / 2
        for r, share in zip(workload.requests, workload.shares)
    )
    per_sequence = Load(decodes=1.0, decode_keys=workload.decode_context, prompt_tokens=ratio, prompt_keys=prompt_keys)
    tasks = {}
    for part, task in decode.items():
        fields = {key: getattr(task, key) + prompts[part][key] for key in _SCALED}
        fields["workspace_bytes_per_sample"] = task.workspace_bytes_per_sample * (1.0 + ratio)
        fields["mem_bytes_per_sample"] = held[part].mem_bytes_per_sample
        fields["tp_replicated_mem_bytes_per_sample"] = held[part].tp_replicated_mem_bytes_per_sample
        tasks[part] = dataclasses.replace(task, **fields)
    tasks["block"] = _stored_as(tasks["block"], config.moe_layer(), precision)
    if "dense" in tasks:
        tasks["dense"] = _stored_as(tasks["dense"], config.dense_layer(), precision)
    return ServingTasks(
        config=config,
        dtype=dtype,
        precision=precision,
        tasks=tasks,
        prefill_per_output=ratio,
        kv_context=workload.kv_context,
        per_sequence=per_sequence,
        mean_prompt_len=workload.mean_prompt_len,
        token_budget=token_budget,
        expert_imbalance=expert_imbalance,
        chunked_prefill=chunked_prefill,
        dp_imbalance=dp_imbalance,
        expert_picks=expert_picks,
        redundant_experts=redundant_experts,
    )


def _stored_as(block: Task, config: DecoderConfig, precision: Precision) -> Task:
    """The block task with its linear weights at the weight format's bytes per weight (the latent
    projections that a group replicates too) and its KV cache at the KV dtype's bytes per element
    (norms and biases, replicated on a group, unchanged)."""
    b = precision.activation_bytes
    linear = matmul_parameters(config)["attn"] + stored_mlp_parameters(config)
    replicated = mla_replicated_linear(config) if config.is_mla else 0
    kv = precision.kv_bytes / b
    return dataclasses.replace(
        block,
        weight_bytes=block.weight_bytes + linear * (precision.weight_bytes - b),
        tp_replicated_weight_bytes=block.tp_replicated_weight_bytes + replicated * (precision.weight_bytes - b),
        mem_bytes_per_sample=block.mem_bytes_per_sample * kv,
        tp_replicated_mem_bytes_per_sample=block.tp_replicated_mem_bytes_per_sample * kv,
    )


# Task fields that grow with the tokens an iteration processes for one sequence.
_SCALED = (
    "flops_per_sample",
    "bytes_per_sample",
    "tp_replicated_bytes_per_sample",
    "tp_allreduce_bytes_per_sample",
    "tp_allgather_bytes_per_sample",
)


@lru_cache(maxsize=256)
def _parts(config: DecoderConfig, phase: str, seq_len: int, dtype: str) -> dict[str, Task]:
    """The PARTS' tasks of one sequence, and "dense" (one of the dense first layers) where it has them."""
    try:
        graph = build_decoder_graph(config.moe_layer(), phase=phase, seq_len=seq_len, granularity="block", dtype=dtype)
        dense = (
            build_decoder_graph(config.dense_layer(), phase=phase, seq_len=seq_len, granularity="block", dtype=dtype)
            if config.first_dense_layers
            else None
        )
    except GraphError as exc:  # a task past the sizes the planner computes with: the request's length made it
        raise WorkloadError(
            f"the requests' lengths (--prompt-len and --output-len, or --workload): a {phase} of {seq_len:,} tokens "
            f"is past what the planner computes with ({exc})"
        ) from None
    by_name = {t.name: t for t in graph.tasks}
    out = {part: by_name["block.0" if part == "block" else part] for part in PARTS}
    if dense:
        out["dense"] = next(t for t in dense.tasks if t.name == "block.0")
    return out
