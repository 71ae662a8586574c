"""Measured costs in memory: a profile's data, its task keys and link classes, and what the problem
builder (llm_planner.placement.problem.build_problem) takes from it.

This module reads no file: llm_planner.cost.profile reads and writes the file form, fits the
measurements and holds the rules of keys and groups in its docstring. Here:

- `Profile`, `TaskTiming`, `LinkTiming`: what a profile measured, per device kind and task
  key, and per link class;
- `task_key`, `group_key`, `link_class`, `all_reduce_key`: the names measurements are stored under;
- `task_pieces`, `link`: the measured cost piece of a task on a device (a group's "@group<k>"
  piece, else its "@tp<k>" piece plus its collectives) and the measured link of a device pair,
  None where the profile has none (the builder then keeps the cost model and the spec's link);
- `profile_coverage`: which (task, device kind) pairs and link classes a profile covers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from llm_planner.core.spec import ClusterSpec, DeviceSpec, LinkSpec
from llm_planner.cost import roofline as cost
from llm_planner.graph.ir import Task, TaskGraph
from llm_planner.graph.transformer import COSTLESS_FIELDS

INTER_NODE = "inter_node"


@dataclass(frozen=True, kw_only=True)
class TaskTiming:
    """Measured time of one task key on one device kind: t(b) = fixed_s + per_sample_s * b."""

    task: str  # a task this key was measured on (e.g. "block.0")
    batch_sizes: tuple[int, ...]
    median_s: tuple[float, ...]  # median over the repetitions, per batch size
    repetitions: int
    fixed_s: float
    per_sample_s: float

    def time_s(self, batch: int) -> float:
        return 0.0 if batch <= 0 else self.fixed_s + self.per_sample_s * batch


@dataclass(frozen=True, kw_only=True)
class LinkTiming:
    """Measured one-way message time over one link class: t(n) = latency_s + n / bw_bytes_per_s."""

    devices: tuple[str, str]  # the pair that measured it
    sizes_bytes: tuple[int, ...]
    median_s: tuple[float, ...]  # half the median round trip, per size
    repetitions: int
    latency_s: float
    bw_bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class Profile:
    cluster: str  # name of the cluster spec it was measured on
    model: dict[str, Any]  # the ModelSpec fields profiled
    settings: dict[str, Any]  # batch sizes, repetitions, warm-up, threads
    devices: dict[str, list[str]]  # device kind -> devices that measured it
    tasks: dict[str, dict[str, TaskTiming]]  # device kind -> task key -> timing
    links: dict[str, LinkTiming] = field(default_factory=dict)  # link class -> timing
    environment: dict[str, Any] = field(default_factory=dict)  # torch version, torch devices, for the record

    def timing(self, kind: str, key: str | None) -> TaskTiming | None:
        if key is None:
            return None
        return self.tasks.get(kind, {}).get(key)


# ----------------------------------------------------------------------------
# Task keys and link classes


def _short_hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:8]


def task_key(graph: TaskGraph, task: Task) -> str | None:
    """The key a profile stores `task`'s time under; None for graphs no builder made (llm_planner.cost.profile)."""
    meta = graph.meta_dict()
    dtype = meta.get("dtype")
    if "decoder_config" in meta:
        config = {k: v for k, v in dict(meta["decoder_config"]).items() if k not in COSTLESS_FIELDS}
        role = task.label("role", task.kind)
        return (
            f"{config.get('model_type')}:{_short_hash(config)}/{meta.get('phase')}:{meta.get('seq_len')}/{dtype}/{role}"
        )
    if meta.get("builder") in ("fx", "rwnn") and dtype is not None:
        return f"{graph.name}:{structure_hash(graph)}/{dtype}/{task.name}"
    return None


def structure_hash(graph: TaskGraph) -> str:
    """8 hex digits of the graph's task names, kinds and edges (not its costs)."""
    return _short_hash([[(t.name, t.kind) for t in graph.tasks], [(e.src, e.dst) for e in graph.edges]])


def link_class(cluster: ClusterSpec, a: DeviceSpec, b: DeviceSpec) -> str | None:
    """The name of the link class between two devices (None for the same device): `inter_node`, a
    region pair's `regions:A<->B` (ClusterSpec.between_regions), or `template:kindA<->kindB`."""
    if a.name == b.name:
        return None
    if a.node != b.node:
        path = cluster.link_path(a, b)
        if path == ("links", INTER_NODE):
            return INTER_NODE
        first, second = sorted(cluster.between_regions[path[2]].between)
        return f"regions:{first}<->{second}"
    first, second = sorted((a.kind, b.kind))
    return f"{a.node_template}:{first}<->{second}"


def group_key(key: str | None, degree: int, joint: bool = False) -> str | None:
    """The profile key of a task on a group of `degree` devices: one member's share timed alone ("@tp<k>"),
    or the group's task as the group runs it, collectives included ("@group<k>")."""
    if key is None or degree <= 1:
        return key
    return f"{key}@group{degree}" if joint else f"{key}@tp{degree}"


def all_reduce_key(link_class_name: str, degree: int) -> str:
    """The `links` entry of an all-reduce among `degree` devices of a link class: t(n bytes) = latency + n / bw."""
    return f"{link_class_name}@all_reduce{degree}"


# ----------------------------------------------------------------------------
# What the problem builder takes from a profile


def link(cluster: ClusterSpec, profile: Profile, a: DeviceSpec, b: DeviceSpec) -> LinkSpec | None:
    """The measured link between two devices when the profile has their link class, else None."""
    measured = profile.links.get(link_class(cluster, a, b) or "")
    return None if measured is None else LinkSpec(bw_bytes_per_s=measured.bw_bytes_per_s, latency_s=measured.latency_s)


def task_pieces(
    cluster: ClusterSpec, profile: Profile, key: str | None, task: Task, device: DeviceSpec
) -> tuple[cost.Piece, ...] | None:
    """The single measured piece (fixed_s, per_sample_s) of `task` (profile key `key`) on `device`, or None
    where the profile has no entry: on a group, its "@group<k>" timing, else its "@tp<k>" timing plus the
    group's collectives (_group_collectives)."""
    if device.degree > 1:
        joint = profile.timing(device.kind, group_key(key, device.degree, joint=True))
        if joint is not None:
            return ((joint.fixed_s, joint.per_sample_s),)
    timing = profile.timing(device.kind, group_key(key, device.degree))
    if timing is None:
        return None
    if device.degree <= 1:
        return ((timing.fixed_s, timing.per_sample_s),)
    fixed, slope = _group_collectives(cluster, profile, task, device)
    return ((timing.fixed_s + fixed, timing.per_sample_s + slope),)


def _group_collectives(cluster: ClusterSpec, profile: Profile, task: Task, device: DeviceSpec) -> tuple[float, float]:
    """(fixed_s, per_sample_s) of the task's collectives on the group: from a measured all-reduce of the group's
    class and degree when the profile has one (an all-gather of n bytes costs as an all-reduce of k n bytes),
    else the ring model (cost.collective_pieces) over the group's link, measured when the profile has its class,
    each call paying the kind's collective_call_s as in the roofline (a measured all-reduce includes its own)."""
    single = cluster.device_map()
    a, b = single[device.members[0]], single[device.members[1]]
    measured = profile.links.get(all_reduce_key(link_class(cluster, a, b) or "", device.degree))
    if measured is None:
        spec_link = link(cluster, profile, a, b) or cluster.link(a, b)
        kind = cluster.kind(device.kind)
        return cost.collective_pieces(
            task, device.degree, spec_link, kind.collective_call_s, kind.collective_bw_efficiency
        )
    calls = task.tp_allreduces + task.tp_allgathers
    moved = task.tp_allreduce_bytes_per_sample + device.degree * task.tp_allgather_bytes_per_sample
    return calls * measured.latency_s, moved / measured.bw_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class ProfileCoverage:
    """Which (task, device kind) pairs a profile covers, and which fall back to the cost model."""

    profiled: tuple[tuple[str, str], ...]  # (task, kind)
    fallback: tuple[tuple[str, str], ...]  # (task, kind) pairs that keep the cost model
    links_profiled: tuple[str, ...]
    links_fallback: tuple[str, ...]

    def fallback_tasks(self) -> dict[str, list[str]]:
        """Device kind -> tasks that fell back to the cost model on it."""
        out: dict[str, list[str]] = {}
        for task, kind in self.fallback:
            out.setdefault(kind, []).append(task)
        return out


def profile_coverage(graph: TaskGraph, cluster: ClusterSpec, profile: Profile) -> ProfileCoverage:
    """Pairs of (task, device kind the task may run on) with and without a measurement, and the same for link
    classes."""
    used = {d.kind for d in cluster.devices()}
    kinds = [k for k in cluster.device_kinds if k.name in used]
    profiled, fallback = [], []
    for task in graph.tasks:
        key = task_key(graph, task)
        for kind in kinds:
            if cost.task_supported(task, kind):
                (profiled if profile.timing(kind.name, key) is not None else fallback).append((task.name, kind.name))
    classes = sorted(
        {c for a in cluster.devices() for b in cluster.devices() if (c := link_class(cluster, a, b)) is not None}
    )
    return ProfileCoverage(
        profiled=tuple(profiled),
        fallback=tuple(fallback),
        links_profiled=tuple(c for c in classes if c in profile.links),
        links_fallback=tuple(c for c in classes if c not in profile.links),
    )
