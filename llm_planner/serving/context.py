"""Everything a serving solve uses, built once from data: the model's serving tasks, the classes of
the cluster that may serve, their stage costs, the workload and its targets. The files they come
from are read in llm_planner.serving.inputs (`build_context` hands its paths there)."""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass

from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.gap import SERVING_REL_GAP as OPTIMAL_GAP
from llm_planner.core.gap import gap, status
from llm_planner.core.precision import Precision, as_precision, runs_on
from llm_planner.core.spec import ClusterSpec, check_memory_limited
from llm_planner.cost.eplb import check_redundant
from llm_planner.cost.moe_cost import check_imbalance, check_picks
from llm_planner.graph.decoder_presets import preset_of
from llm_planner.graph.hf_config import model_source, named_config
from llm_planner.graph.model_names import same_model
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.serving.classes import DP_ATTENTIONS, ServerClass, server_classes
from llm_planner.serving.engines import dp_attention_refusal
from llm_planner.serving.inputs import read_context_inputs
from llm_planner.serving.layer_time import profile_kind_name
from llm_planner.serving.layout import CostCache, Layout, Pattern, build_slots
from llm_planner.serving.links import ClassLinks, class_links
from llm_planner.serving.replica import ReplicaModel
from llm_planner.serving.tasks import DEFAULT_TOKEN_BUDGET, ServingTasks, build_serving_tasks, check_workload_window
from llm_planner.serving.workload import NoKindRunsError, ServingWorkload, WorkloadError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ServingOptions:
    allow_cpu: bool = False  # decoder stages on CPUs (never in groups)
    max_tp: int | None = None  # largest tensor-parallel degree offered (None: a whole server's kind)
    exportable: str | None = None  # "vllm" / "sglang": only layouts that engine's export runs (serving.engines)
    max_segments: int | None = None  # classes one replica may mix (None: 3, or 2 for large fleets)
    max_stages: int = 64  # pipeline stages of one replica
    max_micro_batches: int | None = None  # micro-batches in flight per replica (None: as many as stages)
    time_limit_s: float = 60.0
    max_batched_tokens: int = DEFAULT_TOKEN_BUDGET  # tokens one engine iteration may carry (costs.py)
    expert_imbalance: float = 1.0  # MoE: the busiest expert's rows over the mean (cost.moe_cost; 1: uniform)
    chunked_prefill: bool = True  # False: an engine running prompts whole (cost.chunks); `score` only
    dp_attention: bool = True  # MoE: offer groups with data-parallel attention (cost.dp_attention)
    deepep: bool = False  # MoE: offer those groups moving tokens with DeepEP too (cost.dp_attention)
    dp_imbalance: dict | None = None  # MoE: per dpaK size, its busiest member's rows over the mean (expert_load)
    # MoE: a measured router's chance per expert that one token reaches it (expert_load); None: uniform
    expert_picks: tuple[float, ...] | list[float] | None = None
    # MoE: the engines rebalance the experts of dpaK groups (EPLB) with this many redundant ones; None: off
    eplb: int | None = None


class ServingContext:
    def __init__(
        self,
        cluster: ClusterSpec,
        config: DecoderConfig,
        workload: ServingWorkload,
        dtype: str | Precision,
        options: ServingOptions,
        profile=None,
    ):
        self.precision = as_precision(dtype)
        if options.expert_imbalance != 1.0 and not config.is_moe:
            raise WorkloadError(
                f"--expert-imbalance {options.expert_imbalance:g}: {config.name} has no experts (a dense model)"
            )
        _check_dp_attention(config, options)
        _check_deepep(config, options)
        if profile is not None:
            _check_profile(profile, self.precision, config, cluster)
        self.cluster, self.config, self.workload, self.options = cluster, config, workload, options
        self.dtype = self.precision.activations
        self.tasks: ServingTasks = _serving_tasks(config, workload, self.precision, options)
        classes = server_classes(
            cluster,
            allow_cpu=options.allow_cpu,
            max_tp=options.max_tp,
            shards_over=self.tasks.shards_over,
            dp_over=self.tasks.dp_over if _dp_attention(config, options) else None,
            dp_attentions=DP_ATTENTIONS if options.deepep else DP_ATTENTIONS[:1],
        )
        if not classes:
            raise WorkloadError(f"cluster {cluster.name!r} has no accelerator to serve on (CPUs only with --allow-cpu)")
        if options.eplb is not None:
            _check_eplb_groups(cluster, options, self.tasks, classes)
        # kinds that cannot run the precision serve no stage; why, by kind (named when nothing serves)
        self.classes, self.left_out = _able(cluster, classes, self.precision)
        self.by_name = {c.name: c for c in self.classes}
        self.cache = CostCache(self.tasks, self.classes, profile)
        self.links: ClassLinks = class_links(cluster, self.classes)
        self.between = self.links.between  # on a cluster of one server: its links between two classes
        self._best: dict = {}

    def unrestricted(self) -> ServingContext:
        """This context without --exportable: the same inputs, classes and cost caches (none of
        them depends on it), so the search of the unrestricted problem reuses what was computed
        (the best operating points too, but for vLLM's, whose sequences stay within the budget)."""
        other = copy.copy(self)
        other.options = dataclasses.replace(self.options, exportable=None)
        if self.options.exportable == "vllm":  # its replicas keep their sequences within the budget
            other._best = {}
        return other

    def with_token_budget(self, tokens: int) -> ServingContext:
        """This context at another per-iteration token budget: its tasks and cost cache built again,
        the inputs, their checks and the classes (none of which depends on the budget) kept."""
        other = copy.copy(self)
        other.options = dataclasses.replace(self.options, max_batched_tokens=tokens)
        other.tasks = _serving_tasks(self.config, self.workload, self.precision, other.options)
        other.cache = CostCache(other.tasks, self.classes, self.cache.profile)
        other._best = {}
        return other

    @property
    def capacity(self) -> dict[str, int]:
        return {c.name: c.num_devices for c in self.classes}

    def left_out_text(self) -> str:
        """The device kinds the precision left out and why, for messages ('' when none: _left_out_text)."""
        return _left_out_text(self.precision, self.left_out)

    def replica(self, layout: Layout) -> ReplicaModel:
        slots = build_slots(layout, self.cache, self.links)
        return ReplicaModel(
            self.tasks,
            slots,
            self.workload.tpot_slo_s,
            self.workload.ttft_slo_s,
            self.workload.mean_output_len,
            sequences_within_budget=self.options.exportable == "vllm",
        )

    def best(self, layout: Layout, micro_batches: list[int], fixed: tuple[int, ...] | None = None):
        """ReplicaModel.best of the layout at these micro-batch counts (and fixed split), computed once
        per context: the baselines share their layouts (megatron's is one of engineer-best's)."""
        key = (layout, tuple(micro_batches), fixed)
        if key not in self._best:
            self._best[key] = self.replica(layout).best(micro_batches, fixed=fixed)
        return self._best[key]


def _serving_tasks(
    config: DecoderConfig, workload: ServingWorkload, precision: Precision, options: ServingOptions
) -> ServingTasks:
    return build_serving_tasks(
        config,
        workload,
        precision,
        options.max_batched_tokens,
        check_imbalance(options.expert_imbalance),
        options.chunked_prefill,
        _dp_imbalance(config, options),
        _expert_picks(config, options),
        _eplb(config, options),
    )


def _left_out_text(precision: Precision, left_out: dict[str, str]) -> str:
    """'; left out as they cannot run <precision>: 'kind' (why), ...' ('' when no kind was left out)."""
    if not left_out:
        return ""
    kinds = ", ".join(f"{name!r} ({why})" for name, why in left_out.items())
    return f"; left out as they cannot run {precision.describe()}: {kinds}"


def _able(
    cluster: ClusterSpec, classes: tuple[ServerClass, ...], precision: Precision
) -> tuple[tuple[ServerClass, ...], dict[str, str]]:
    """(the classes whose kind runs `precision` (llm_planner.core.precision.runs_on), the reason of
    each kind that cannot: it is never given a stage); NoKindRunsError naming the precision and every
    kind's reason when no kind can."""
    why = {kind.name: runs_on(precision, kind.type, kind.peak_dtypes) for kind in (sc.kind for sc in classes)}
    able = tuple(sc for sc in classes if why[sc.kind.name] is None)
    if not able:
        reasons = "; ".join(f"{name!r}: {reason}" for name, reason in why.items())
        raise NoKindRunsError(
            f"{_flags(precision)}: no device kind of {cluster.source} that may serve runs it ({reasons})"
        )
    left_out = {name: reason for name, reason in why.items() if reason is not None}
    for name, reason in left_out.items():
        log.info("device kind %r serves no stage of this plan: %s (%s)", name, reason, precision.describe())
    return able, left_out


def _flags(p: Precision) -> str:
    """The flags that asked for precision `p`, for messages."""
    if not p.quantized:
        return f"--dtype {p.activations}"
    return f"--weights {p.weights_label} --kv-cache-dtype {'fp8' if p.kv_cache == 'fp8' else 'auto'} ({p.describe()})"


def build_context(
    cluster_path: str,
    model: str,
    workload: ServingWorkload,
    dtype: str | Precision,
    options: ServingOptions,
    profile_path: str | None = None,
) -> ServingContext:
    """The context of the files named (serving.inputs reads them): what a plan and its verifier build."""
    read = read_context_inputs(cluster_path, model, profile_path)
    check_workload_window(read["config"], workload, model_source(model))
    cluster = read["cluster"]
    usable = {k.name for k in cluster.device_kinds if k.type != "cpu" or options.allow_cpu}
    check_memory_limited(cluster, usable, "serving plans (the KV cache a device holds is sized by its memory)")
    _warn_engine_mismatch(cluster, options)
    return ServingContext(cluster, read["config"], workload, dtype, options, read["profile"])


def _warn_engine_mismatch(cluster: ClusterSpec, options: ServingOptions) -> None:
    """A plan made to export to one engine, costed with another engine's factor set (`engine:` on a kind)."""
    if not options.exportable:
        return
    other = sorted(
        {f"{k.name} ({k.engine})" for k in cluster.device_kinds if k.engine and k.engine != options.exportable}
    )
    if other:
        log.warning(
            "%s: kinds %s take another engine's factors than %s's, which the plan is made to export to: "
            "its figures are that engine's",
            cluster.source,
            ", ".join(other),
            options.exportable,
        )


def usable_bytes(ctx: ServingContext, p: Pattern) -> list[float]:
    """Usable memory of a device of each stage."""
    out = []
    for seg in p.layout:
        out += [ctx.by_name[seg.class_name].kind.usable_mem_bytes] * seg.stages
    return out


def status_of(tokens: float, bound: float) -> tuple[float, str]:
    """A serving plan's gap to its upper bound and the status it supports (llm_planner.core.gap)."""
    g = gap(tokens, bound, maximize=True)
    return g, status(g, OPTIMAL_GAP)


def _dp_imbalance(config: DecoderConfig, options: ServingOptions) -> dict[int, float] | None:
    """The per-group-size factors, checked: WorkloadError for a dense model, a size below 2 or a
    factor below 1 (llm_planner.serving.expert_load)."""
    if not options.dp_imbalance:
        return None
    if not config.is_moe:
        raise WorkloadError(f"--expert-load: {config.name} has no experts (a dense model)")
    out = {}
    for k, factor in options.dp_imbalance.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise WorkloadError(f"dp_imbalance: a group size is a whole number >= 2, got {k!r}")
        try:
            out[k] = check_imbalance(factor)
        except ValueError as exc:
            raise WorkloadError(f"dp_imbalance[{k}]: {exc}") from None
    return out


def _check_dp_attention(config: DecoderConfig, options: ServingOptions) -> None:
    """WorkloadError for turning data-parallel attention off on a dense model, whose groups never run it."""
    if not options.dp_attention and not config.is_moe:
        raise WorkloadError(
            f"--no-dp-attention: {config.name} has no experts (a dense model), so its groups are tensor-parallel "
            "only: drop the flag"
        )


def _check_deepep(config: DecoderConfig, options: ServingOptions) -> None:
    """WorkloadError for DeepEP where no group would run it (a dense model, groups with
    data-parallel attention turned off)."""
    if not options.deepep:
        return
    if not config.is_moe:
        raise WorkloadError(f"--deepep (dpa<k>-deepep): {config.name} has no experts (a dense model)")
    if not options.dp_attention:
        raise WorkloadError(
            "--deepep: moves tokens in groups with data-parallel attention, which --no-dp-attention turns off"
        )


def _dp_attention(config: DecoderConfig, options: ServingOptions) -> bool:
    """Whether stages may run data-parallel attention: asked for, a mixture of experts, and run by
    the engine the plan must export to (llm_planner.serving.engines.dp_attention_refusal)."""
    wanted = options.dp_attention and config.is_moe
    return wanted and dp_attention_refusal(options.exportable, config.hf_model_type) is None


def _kind_label(kind) -> str:
    return f"{kind.name} (catalog {kind.catalog})" if kind.catalog else kind.name


def _check_profile(profile, precision: Precision, config: DecoderConfig, cluster: ClusterSpec) -> None:
    """WorkloadError where a measured serving profile cannot stand for this plan's layers: a mixture of
    experts, times in another format than the plan's (`profile_format_refusal`), or no device kind it names."""
    if config.is_moe:
        raise WorkloadError(
            f"--profile: a measured serving profile times dense layers; {config.name} is a mixture of "
            "experts: plan it without --profile"
        )
    why = profile_format_refusal(profile, precision)
    if why is not None:
        raise WorkloadError(f"--profile {profile.path}: {why}")
    if not any(profile_kind_name(profile, kind) for kind in cluster.device_kinds):
        raise WorkloadError(
            f"--profile {profile.path}: its device kinds ({', '.join(e.kind for e in profile.kinds)}) name no "
            f"device kind of {cluster.name!r} nor a catalog entry one names "
            f"(its kinds: {', '.join(_kind_label(k) for k in cluster.device_kinds)})"
        )
    _check_profile_model(profile, config)


def _check_profile_model(profile, config: DecoderConfig) -> None:
    """WorkloadError where the profile names a model whose layers have other shapes than this one's
    (its times are of other GEMMs and another attention); a warning where it names a model the
    planner does not know under another name than this one's."""
    if not profile.model or same_model(profile.model, config.name):
        return
    timed = named_config(profile.model) or preset_of(profile.model)
    if timed is not None and layer_shape(timed) != layer_shape(config):
        raise WorkloadError(
            f"--profile {profile.path}: it times the layers of {profile.model!r} ({_shape_text(timed)}), and "
            f"{config.name} has other layers ({_shape_text(config)}): its times do not stand for them; "
            f"profile {config.name} (profile-serving, import vidur) or leave out --profile"
        )
    log.warning(
        "--profile %s: it times the layers of %r, the model is %r: its times stand for this model's layers "
        "only if the two are the same model under other names",
        profile.path,
        profile.model,
        config.name,
    )


def layer_shape(config: DecoderConfig) -> tuple[int, ...]:
    """What a decoder layer's times depend on: widths and heads."""
    head_dim = config.head_dim or config.hidden_size // config.num_heads
    return (config.hidden_size, config.intermediate_size, config.num_heads, config.num_kv_heads, head_dim)


def _shape_text(config: DecoderConfig) -> str:
    hidden, inner, heads, kv, _ = layer_shape(config)
    return f"hidden {hidden}, MLP {inner}, {heads} heads, {kv} KV heads"


def profile_format_refusal(profile, precision: Precision) -> str | None:
    """Why the profile's times are not the plan's formats (None: they are). An fp8 profile times W8A8
    projections (profile-serving --dtype fp8): it stands for fp8 weights, whatever the activation
    dtype. Any other profile's times are in its dtype: weights and activations of that size, and a
    KV cache in it too where it times attention."""
    if profile.dtype == "fp8":
        if _times_attention(profile):  # whole layers (version 1) or attention: a KV cache of a format it does not state
            return (
                "an fp8 profile stands for W8A8 projections only (profile-serving --dtype fp8); this one also "
                "times attention or whole layers, whose KV cache format it does not state"
            )
        if precision.weights == "fp8":
            return None
        return (
            f"its times are fp8 (W8A8) projections, the weights asked for {precision.weights_label}: "
            f"give --weights fp8, or profile in {precision.activations}"
        )
    if precision.weights != precision.activations:
        return (
            f"its times are in {profile.dtype}, the weights asked for in {precision.weights_label}: profile fp8 "
            "weights with profile-serving --dtype fp8; leave out --profile for other formats"
        )
    if DTYPE_BYTES.get(profile.dtype) != DTYPE_BYTES[precision.activations]:
        return (
            f"its times are in {profile.dtype}, the layers asked for in {precision.activations}: give "
            f"--dtype {profile.dtype} or profile in {precision.activations}"
        )
    if precision.kv_cache != precision.activations and _times_attention(profile):
        return (
            f"its decode attention reads a {profile.dtype} KV cache, the one asked for is {precision.kv_cache}: "
            "profile without --attention, or leave out --profile"
        )
    return None


def _times_attention(profile) -> bool:
    """Whether a version 2 profile has a decode attention table (a version 1 table times whole layers)."""
    if profile.version == 1:
        return True
    return any(t.attn_decode is not None for entry in profile.kinds for t in entry.degrees)


def _eplb(config: DecoderConfig, options: ServingOptions) -> int | None:
    """options.eplb checked: None, or a whole number >= 0 of redundant experts for an MoE model
    whose plan may use groups with data-parallel attention (where EPLB places experts)."""
    redundant = options.eplb
    if redundant is None:
        return None
    if not config.is_moe:
        raise WorkloadError(f"--eplb: {config.name} has no experts (a dense model)")
    try:
        check_redundant(redundant, config.num_experts)
    except ValueError as exc:
        raise WorkloadError(f"--eplb: {exc}") from None
    if not options.dp_attention:
        raise WorkloadError(
            "--eplb rebalances the experts of groups with data-parallel attention, which --no-dp-attention "
            "leaves out: drop one of them"
        )
    return redundant


def _check_eplb_groups(cluster: ClusterSpec, options: ServingOptions, tasks: ServingTasks, classes) -> None:
    """WorkloadError naming --eplb when its redundant experts leave no group with data-parallel
    attention (k must divide E + R), or when none is offered (an engine the plan must export to
    that runs none); a warning naming the group sizes E alone allowed and E + R does not."""
    sizes = sorted({k for c in classes for k in c.dp_degrees})
    e, r = tasks.config.num_experts, options.eplb
    if not sizes:
        raise WorkloadError(
            f"--eplb {r}: no group of this plan runs data-parallel attention, where EPLB places experts: its "
            f"{e} + {r} replicas split over no dpaK group of this cluster and model (k must divide E + R and "
            "the experts' width), or the engine given to --exportable runs none"
        )
    plain = dataclasses.replace(tasks, redundant_experts=None)  # the sizes E alone splits over
    without = server_classes(
        cluster,
        allow_cpu=options.allow_cpu,
        max_tp=options.max_tp,
        shards_over=plain.shards_over,
        dp_over=plain.dp_over if _dp_attention(tasks.config, options) else None,
    )
    lost = sorted({k for c in without for k in c.dp_degrees} - set(sizes))
    if lost:
        log.warning(
            "--eplb %d: %d + %d replicas do not split over dpa%s, which %d experts alone would",
            r,
            e,
            r,
            ", dpa".join(map(str, lost)),
            e,
        )


def _expert_picks(config: DecoderConfig, options: ServingOptions) -> tuple[float, ...] | None:
    """options.expert_picks checked against the model: one chance in [0, 1] per routed expert."""
    picks = options.expert_picks
    if picks is None:
        return None
    if not config.is_moe:
        raise WorkloadError(f"expert_picks: {config.name} has no experts (a dense model)")
    try:
        picks = check_picks(picks)
    except ValueError as exc:
        raise WorkloadError(f"expert_picks: {exc}") from None
    if len(picks) != config.num_experts:
        raise WorkloadError(f"expert_picks: {len(picks)} values for {config.name}'s {config.num_experts} experts")
    return picks
