"""Serving measurements made scoreable: each observation with its replica, operating point and
workload (`ServingCase`), and its figures as the serving model predicts them for a cluster.

An engine's result does not say the layout, the hardware or the model: the command line gives
them (`ServingSettings`), once for every result file or once per file, in order. A value the
command line gives overrides the file's (an engine whose --max-num-seqs capped the benchmark's
--max-concurrency ran fewer sequences than the file says); what neither gives is an error naming
the file and the key. Defaults: micro-batches = the layout's stages for an engine (vLLM and
SGLang keep one batch per pipeline stage in flight), the token budget of `llm-planner score`, and
the engine's own way with prompts (`mixed_iterations`: SGLang's results with prompts in iterations
of their own, as SGLang runs without --enable-mixed-chunk; the others' chunks beside the decodes).

The layer split is held fixed while the factors change: an engine's is vLLM's and SGLang's even
split (vllm/distributed/utils.py get_pp_indices: the remainder to the stages before the last);
our own runtime's is the planner's split at the spec's values (ReplicaModel.split_layers), or the
even one where none fits memory.

`predict` is `llm-planner score` (llm_planner.serving.score.score_replica) on the case: one
model, no second formula. With `closed_loop` (`calibrate --serving --closed-loop`) a case's TPOT,
tokens/s and TTFT are `score --closed-loop`'s: the benchmark simulated iteration by iteration, C
requests of the run's one shape sent at once (llm_planner.serving.closed_loop), one micro-batch,
reaching the engine through a front end of `front_end_s` a request (`--front-end-s`: 0, as sent,
unless given; it is an input of the fit, not fitted).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from llm_planner.core.precision import Precision
from llm_planner.core.spec import ClusterSpec
from llm_planner.cost.chunks import engine_mixes_prompts
from llm_planner.graph.hf_config import named_config
from llm_planner.graph.model_names import same_model
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.measure.serving_results import ServingObservation, ServingResultError
from llm_planner.serving.closed_loop import MOST_CONCURRENCY as CLOSED_LOOP_MOST
from llm_planner.serving.closed_loop import ROUNDS
from llm_planner.serving.context import ServingContext, ServingOptions
from llm_planner.serving.inputs import decoder_config
from llm_planner.serving.layout import Layout, describe
from llm_planner.serving.layout_text import LayoutError, parse_layout
from llm_planner.serving.replica import ReplicaModel
from llm_planner.serving.score import score_replica
from llm_planner.serving.tasks import DEFAULT_TOKEN_BUDGET
from llm_planner.serving.workload import TPOT_SLO_RANGE_S, ServingWorkload

log = logging.getLogger(__name__)

FIGURES = ("tpot_s", "tokens_per_s", "ttft_s", "decode_step_s")


@dataclass(frozen=True, kw_only=True)
class ServingSettings:
    """What the command line says of the results: each tuple empty, one value for every result
    file, or one per file in order."""

    model: str | None = None
    replicas: tuple[str, ...] = ()
    concurrency: tuple[int, ...] = ()
    micro_batches: tuple[int, ...] = ()
    dtype: str | Precision = "fp16"  # the activations' dtype, or a Precision with weights or KV cache below it
    max_batched_tokens: int | None = None
    allow_cpu: bool = False
    chunked_prefill: bool | None = None  # False: prompts in iterations of their own; None: the engine's default
    closed_loop: bool = False  # the results are closed-loop benchmarks (module docstring)
    front_end_s: float = 0.0  # with closed_loop: the engine's front end's time a request (module docstring)

    def for_file(self, i: int, num_files: int, flag: str):
        """The value of the per-file flag for file i (None: not given)."""
        values = {"--replica": self.replicas, "--concurrency": self.concurrency, "--micro-batches": self.micro_batches}
        given = values[flag]
        if len(given) not in (0, 1, num_files):
            raise ServingResultError(
                f"{flag}: give it once for every result or once per result; got {len(given)} for {num_files} results"
            )
        return given[i] if len(given) == num_files else given[0] if given else None


@dataclass(frozen=True, kw_only=True)
class ServingCase:
    """One observation, ready to score: the replica, its operating point and the workload."""

    obs: ServingObservation
    replica: str  # the layout as `describe` writes it
    layout: Layout
    concurrency: int
    micro_batches: int
    layers: tuple[int, ...]
    workload: ServingWorkload
    options: ServingOptions
    dtype: str | Precision
    kinds: tuple[str, ...]  # device kinds the replica runs on
    grouped_kinds: tuple[str, ...]  # those of them in tensor-parallel groups
    closed_loop: bool = False  # predicted as a closed-loop benchmark (llm_planner.serving.closed_loop)
    front_end_s: float = 0.0  # the closed loop's front end: its time a request


def model_config(settings: ServingSettings, observations: Sequence[ServingObservation]) -> DecoderConfig:
    """--model, else the model the observations name where it is a preset or a config.json."""
    name = settings.model
    if name is None:
        named = {o.model for o in observations if o.model is not None}
        found = [n for n in sorted(named) if named_config(n) is not None]
        if len(found) != 1 or len(named) != 1:
            sources = ", ".join(f"{o.source} ({o.model!r})" for o in observations[:3])
            raise ServingResultError(
                f"--model is required: the results name no single preset or config.json as their model ({sources})"
            )
        name = found[0]
    config = decoder_config(name)
    for o in observations:
        if not same_model(o.model, config.name):
            log.warning("%s: the run served %r, calibrated as %r (--model)", o.source, o.model, config.name)
    _check_dtype(settings.dtype, observations)
    return config


def _check_dtype(dtype: str | Precision, observations: Sequence[ServingObservation]) -> None:
    """ServingResultError where a run report states another element type than the fit's --dtype:
    its times are of that dtype, and fitting them as another would skew every factor."""
    asked = dtype if isinstance(dtype, str) else dtype.activations
    for o in observations:
        if o.dtype is not None and o.dtype != asked:
            raise ServingResultError(
                f"{o.source}: the run served in {o.dtype}, and --dtype asks the fit for {asked}: give --dtype {o.dtype}"
            )


def build_cases(
    cluster: ClusterSpec,
    config: DecoderConfig,
    files: Sequence[tuple[str, list[ServingObservation]]],
    settings: ServingSettings,
) -> list[ServingCase]:
    """Every observation of the result files with what the command line gives (module docstring)."""
    out = []
    flags = ("--replica", "--concurrency", "--micro-batches")
    for i, (_, observations) in enumerate(files):
        given = {flag: settings.for_file(i, len(files), flag) for flag in flags}
        for obs in observations:
            out.append(_case(cluster, config, obs, settings, given))
    return out


def mixed_iterations(obs: ServingObservation, settings: ServingSettings) -> bool:
    """Whether the run's engine carried prompt chunks in the decodes' iterations (the model's chunked
    prefill): as the command line says; else the engine's default, which for SGLang is no (without
    --enable-mixed-chunk it runs a prompt's chunks in prefill iterations of their own) and for the
    others yes."""
    if settings.chunked_prefill is not None:
        return settings.chunked_prefill
    return engine_mixes_prompts(obs.engine)


def _case(cluster, config, obs: ServingObservation, settings: ServingSettings, given: dict) -> ServingCase:
    text = given["--replica"] or obs.layout
    if text is None:
        raise ServingResultError(
            f"{obs.source}: a {obs.engine} result does not say the replica's layout: give --replica"
        )
    concurrency = given["--concurrency"] or obs.concurrency
    if concurrency is None:
        raise ServingResultError(
            f"{obs.source}: {obs.concurrency_note}, so the sequences in flight are unknown: give --concurrency "
            "(for N prompts sent at once, N if the engine's --max-num-seqs holds them)"
        )
    options = ServingOptions(
        allow_cpu=settings.allow_cpu,
        max_batched_tokens=settings.max_batched_tokens or obs.max_batched_tokens or DEFAULT_TOKEN_BUDGET,
        chunked_prefill=mixed_iterations(obs, settings),
    )
    workload = ServingWorkload(requests=obs.requests, tpot_slo_s=TPOT_SLO_RANGE_S[1], source=obs.source)
    ctx = ServingContext(cluster, config, workload, settings.dtype, options)
    where = "--replica" if given["--replica"] else f"{obs.source}: layout"
    try:
        layout = parse_layout(text, ctx.by_name)
    except LayoutError as exc:
        raise ServingResultError(f"{where} {text!r}: {exc}") from None
    stages = sum(seg.stages for seg in layout)
    micro_batches = given["--micro-batches"] or obs.micro_batches or stages
    if concurrency < micro_batches:
        raise ServingResultError(
            f"{obs.source}: concurrency {concurrency} is below its {micro_batches} micro-batches: give --concurrency"
        )
    if settings.closed_loop:
        _check_closed_loop(obs, micro_batches, concurrency)
    layers = _split(ctx, layout, obs, concurrency, micro_batches, stages)
    replica = ctx.replica(layout)
    _check_holds_weights(replica, obs, text, layers, micro_batches)
    if not settings.closed_loop:
        _check_steady_state(ctx, replica, obs, layers, concurrency, micro_batches)
    return ServingCase(
        obs=obs,
        replica=describe(layout, ctx.by_name),
        layout=layout,
        concurrency=concurrency,
        micro_batches=micro_batches,
        layers=layers,
        workload=workload,
        options=options,
        dtype=settings.dtype,
        kinds=tuple(dict.fromkeys(ctx.by_name[seg.class_name].kind.name for seg in layout)),
        grouped_kinds=tuple(dict.fromkeys(ctx.by_name[s.class_name].kind.name for s in layout if s.degree > 1)),
        closed_loop=settings.closed_loop,
        front_end_s=settings.front_end_s,
    )


def _check_closed_loop(obs: ServingObservation, micro_batches: int, concurrency: int) -> None:
    """--closed-loop simulates one micro-batch of requests of one shape, at most MOST_CONCURRENCY in
    flight (llm_planner.serving.closed_loop)."""
    if concurrency > CLOSED_LOOP_MOST:
        raise ServingResultError(
            f"{obs.source}: concurrency {concurrency:,}: --closed-loop simulates at most {CLOSED_LOOP_MOST:,} "
            "sequences in flight (leave out --closed-loop for the steady state)"
        )
    if micro_batches > 1:
        raise ServingResultError(
            f"{obs.source}: --closed-loop simulates one micro-batch; this run has {micro_batches} "
            "(give --micro-batches 1, or leave out --closed-loop)"
        )
    if len(obs.requests) != 1:
        raise ServingResultError(
            f"{obs.source}: --closed-loop sends requests of one shape; this run has {len(obs.requests)}"
        )


def _stages_over(replica: ReplicaModel, layers, concurrency: int, micro_batches: int) -> tuple[list[int], list[int]]:
    """The most layers each stage holds with `concurrency` in flight, and the stages given more."""
    caps = replica.caps(concurrency, micro_batches)
    return caps, [s for s, (n, cap) in enumerate(zip(layers, caps)) if n > cap]


def _check_holds_weights(replica: ReplicaModel, obs, text: str, layers, micro_batches: int) -> None:
    """The run's engine held the model on the replica, so a replica whose stages cannot hold their
    layers with one sequence a micro-batch (weights, workspace) is not the one it ran: a wrong
    --replica or --weights, which a fit would hide by driving the factors anywhere."""
    caps, over = _stages_over(replica, layers, micro_batches, micro_batches)
    if over:
        held = ", ".join(f"stage {s}: {layers[s]} layers, holds {caps[s]}" for s in over)
        raise ServingResultError(
            f"{obs.source}: the replica {text!r} cannot hold the model even with one sequence in flight "
            f"({held}): the engine ran on another; check --replica, --weights and --dtype"
        )


def _check_steady_state(ctx: ServingContext, replica: ReplicaModel, obs, layers, concurrency: int, micro_batches: int):
    """The steady state the fit scores holds `concurrency` sequences in flight: their KV caches in
    memory and their decodes with their prompt share within the token budget. A run past either
    had the engine hold fewer and queue the rest (or a concurrency that is not the engine's), and
    fitting it as held would drive the factors anywhere; so it is refused, with what to give."""
    caps, over = _stages_over(replica, layers, concurrency, micro_batches)
    if over:
        held = ", ".join(f"stage {s} holds {caps[s]} of its {layers[s]} layers" for s in over)
        raise ServingResultError(
            f"{obs.source}: {concurrency:,} sequences in flight do not fit the replica's memory in the model "
            f"({held}): the engine held fewer and queued the rest; give the concurrency it ran at "
            "(--concurrency), or fit the run as the closed loop it was (--closed-loop)"
        )
    if not replica.within_budget(concurrency, micro_batches):
        raise ServingResultError(
            f"{obs.source}: {concurrency:,} sequences in flight in {micro_batches} micro-batch(es) overrun the "
            f"token budget of {ctx.options.max_batched_tokens:,} (their decodes and prompt share do not fit an "
            "iteration, so no engine keeps them in flight): give the engine's budget (--max-batched-tokens) "
            "or the concurrency it ran at (--concurrency)"
        )


def _split(ctx: ServingContext, layout: Layout, obs, concurrency: int, micro_batches: int, stages: int):
    """The layer split held fixed in the fit (module docstring)."""
    num_layers = ctx.tasks.num_layers
    if stages > num_layers:
        raise ServingResultError(f"{obs.source}: {stages} pipeline stages for the model's {num_layers} layers")
    if obs.engine == "llm_planner":
        split = ctx.replica(layout).split_layers(concurrency, micro_batches)
        if split is not None:
            return split
    return even_split(num_layers, stages)


def even_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """vLLM's and SGLang's default split: equal parts, the remainder one layer each to the stages
    before the last (vllm/distributed/utils.py get_pp_indices)."""
    parts = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):
        parts[-i] += 1
    return tuple(parts)


def with_kind_values(cluster: ClusterSpec, values: dict[str, dict[str, float]]) -> ClusterSpec:
    """The cluster with the given fields of the named kinds replaced (kind -> field -> value)."""
    kinds = tuple(dataclasses.replace(k, **values[k.name]) if k.name in values else k for k in cluster.device_kinds)
    return dataclasses.replace(cluster, device_kinds=kinds)


def predict(cluster: ClusterSpec, config: DecoderConfig, case: ServingCase) -> dict[str, float]:
    """The case's figures by the serving model on `cluster` (module docstring)."""
    ctx = ServingContext(cluster, config, case.workload, case.dtype, case.options)
    score = score_replica(
        ctx,
        case.layout,
        concurrency=case.concurrency,
        micro_batches=case.micro_batches,
        layers=case.layers,
        closed_loop_rounds=ROUNDS if case.closed_loop else 0,
        front_end_s=case.front_end_s,
    )
    got = score.closed_loop or score.ev
    return {
        "tpot_s": got.tpot_s,
        "tokens_per_s": got.tokens_per_s,
        "ttft_s": got.ttft_s,
        "decode_step_s": score.decode_step_s,
    }
