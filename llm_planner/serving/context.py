"""Everything a serving solve reads, built once: the model's serving tasks, the classes of
the cluster that may serve, their stage costs, the workload and its targets."""

from __future__ import annotations

from dataclasses import dataclass

from llm_planner.core.spec import ClusterSpec, LinkSpec, load_cluster
from llm_planner.cost.serving_profile import load_serving_profile
from llm_planner.graph.transformer import DecoderConfig, named_config
from llm_planner.serving.classes import ServerClass, server_classes
from llm_planner.serving.costs import ServingTasks, build_serving_tasks
from llm_planner.serving.layout import CostCache, Layout, Pattern, build_slots
from llm_planner.serving.replica import ReplicaModel
from llm_planner.serving.workload import ServingWorkload, WorkloadError

OPTIMAL_GAP = 1e-6  # a plan within this share of the bound is called optimal


@dataclass(frozen=True, kw_only=True)
class ServingOptions:
    allow_cpu: bool = False  # decoder stages on CPUs (never in groups)
    max_tp: int | None = None  # largest tensor-parallel degree offered (None: a whole server's kind)
    exportable: str | None = None  # "vllm": only layouts vLLM can run
    max_segments: int | None = None  # classes one replica may mix (None: 3, or 2 for large fleets)
    max_stages: int = 64  # pipeline stages of one replica
    max_micro_batches: int | None = None  # micro-batches in flight per replica (None: as many as stages)
    time_limit_s: float = 60.0


class ServingContext:
    def __init__(
        self,
        cluster: ClusterSpec,
        config: DecoderConfig,
        workload: ServingWorkload,
        dtype: str,
        options: ServingOptions,
        layer_time=None,
    ):
        self.cluster, self.config, self.workload, self.dtype, self.options = cluster, config, workload, dtype, options
        self.tasks: ServingTasks = build_serving_tasks(config, workload, dtype)
        self.classes: tuple[ServerClass, ...] = server_classes(
            cluster, allow_cpu=options.allow_cpu, max_tp=options.max_tp, shards_over=self.tasks.shards_over
        )
        if not self.classes:
            raise WorkloadError(f"cluster {cluster.name!r} has no accelerator to serve on (CPUs only with --allow-cpu)")
        _check_dtype(cluster, self.classes, dtype)
        self.by_name = {c.name: c for c in self.classes}
        self.cache = CostCache(self.tasks, self.classes, layer_time)
        self.between = _one_server_links(cluster, self.classes) if cluster.inter_node is None else {}

    @property
    def capacity(self) -> dict[str, int]:
        return {c.name: c.num_devices for c in self.classes}

    def replica(self, layout: Layout) -> ReplicaModel:
        slots = build_slots(layout, self.cache, self.cluster.inter_node, self.between)
        return ReplicaModel(
            self.tasks, slots, self.workload.tpot_slo_s, self.workload.ttft_slo_s, self.workload.mean_output_len
        )


def _check_dtype(cluster: ClusterSpec, classes: tuple[ServerClass, ...], dtype: str) -> None:
    """WorkloadError naming --dtype and the cluster file when a kind that may serve has no peak for `dtype`."""
    for kind in dict.fromkeys(sc.kind for sc in classes):
        given = [name for name, _ in kind.peak_flops]
        if dtype not in given:
            raise WorkloadError(
                f"--dtype {dtype}: device kind {kind.name!r} of {cluster.source} gives no peak_flops for it "
                f"(it gives {', '.join(given) or 'none'})"
            )


def _one_server_links(cluster: ClusterSpec, classes: tuple[ServerClass, ...]) -> dict[tuple[str, str], LinkSpec]:
    """On a cluster of one server: the server's link from a device of each class to one of every
    other class (a class's own link is its `intra_link`)."""
    devices = cluster.devices()
    first = {
        sc.name: next(d for d in devices if d.node_template == sc.template and d.kind == sc.kind.name) for sc in classes
    }
    out = {}
    for a in classes:
        for b in classes:
            link = cluster.link(first[a.name], first[b.name]) if a is not b else None
            if link is not None:
                out[(a.name, b.name)] = link
    return out


def decoder_config(name: str) -> DecoderConfig:
    config = named_config(name)
    if config is None:
        raise WorkloadError(f"--model {name!r}: --objective serving needs a decoder preset or a config.json")
    return config


class MeasuredLayerTime:
    """A device kind's measured block time at b sequences in flight per iteration: the decode table
    at b plus the prefill table at b E[P]/E[O] prompt tokens, both piecewise linear; `breakpoints`
    are the b where its slope may change (llm_planner.serving.bound needs them)."""

    def __init__(self, profile, kind: str, ratio: float):
        entry = profile.kind(kind)
        if entry.prefill is None and ratio > 0:
            raise WorkloadError(f"{profile.path}: kinds.{kind}: no prefill_layer_s, needed to charge the prompts")
        self.profile, self.kind, self.ratio = profile, kind, ratio
        points = set(entry.decode.sizes) | set(_zero_crossings(entry.decode))
        if entry.prefill is not None and ratio > 0:
            points |= {size / ratio for size in (*entry.prefill.sizes, *_zero_crossings(entry.prefill))}
        self.breakpoints = tuple(sorted(p for p in points if p > 0))

    def __call__(self, b: float) -> float:
        return self.profile.layer_time_s(self.kind, b, b * self.ratio)


def _zero_crossings(table) -> list[float]:
    """Where a table's extended end segments reach 0 (it is floored there, so its slope changes):
    with these among the breakpoints the time is linear between any two of them."""
    xs, ys, out = table.sizes, table.seconds, []
    for i in (0, len(xs) - 2):
        if ys[i + 1] != ys[i]:
            out.append(xs[i] - ys[i] * (xs[i + 1] - xs[i]) / (ys[i + 1] - ys[i]))
    return out


def layer_time_from_profile(profile_path: str | None, workload: ServingWorkload):
    """kind name -> its MeasuredLayerTime (None for kinds the profile does not name)."""
    if profile_path is None:
        return None
    profile = load_serving_profile(profile_path)
    names = {entry.kind for entry in profile.kinds}

    def for_kind(kind: str):
        return MeasuredLayerTime(profile, kind, workload.prefill_per_output) if kind in names else None

    return for_kind


def build_context(
    cluster_path: str,
    model: str,
    workload: ServingWorkload,
    dtype: str,
    options: ServingOptions,
    profile_path: str | None = None,
) -> ServingContext:
    cluster = load_cluster(cluster_path)
    return ServingContext(
        cluster, decoder_config(model), workload, dtype, options, layer_time_from_profile(profile_path, workload)
    )


def usable_bytes(ctx: ServingContext, p: Pattern) -> list[float]:
    """Usable memory of a device of each stage."""
    out = []
    for seg in p.layout:
        out += [ctx.by_name[seg.class_name].kind.usable_mem_bytes] * seg.stages
    return out


def status_of(tokens: float, bound: float) -> tuple[float, str]:
    gap = max(0.0, 1.0 - tokens / bound) if bound > 0 else 1.0
    return gap, ("optimal" if gap <= OPTIMAL_GAP else "heuristic")
