"""How a profile meets a problem: which (task, device kind) pairs and link classes it covers, and
the problem with its measured costs (the rules are in llm_planner.profile's docstring)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llm_planner import cost
from llm_planner.graph.ir import Task, TaskGraph
from llm_planner.profile import Profile, TaskTiming, all_reduce_key, group_key, link_class, task_key
from llm_planner.spec import ClusterSpec, DeviceSpec, LinkSpec

if TYPE_CHECKING:
    from llm_planner.problem.placement import PlacementProblem


@dataclass(frozen=True, kw_only=True)
class ProfileCoverage:
    """Which (task, device kind) pairs a profile covers, and which fall back to the roofline."""

    profiled: tuple[tuple[str, str], ...]  # (task, kind)
    fallback: tuple[tuple[str, str], ...]  # (task, kind) pairs that keep the roofline
    links_profiled: tuple[str, ...]
    links_fallback: tuple[str, ...]

    def fallback_tasks(self) -> dict[str, list[str]]:
        """Device kind -> tasks that fell back to the roofline on it."""
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


def _group_link(problem: PlacementProblem, profile: Profile, device: DeviceSpec) -> LinkSpec:
    """The link a group's collectives cross: measured for its class when the profile has it, else the spec's."""
    single = problem.cluster.device_map()
    a, b = single[device.members[0]], single[device.members[1]]
    return _profile_link(problem.cluster, profile, a, b) or problem.cluster.link(a, b)


def _group_collectives(
    problem: PlacementProblem, profile: Profile, task: Task, device: DeviceSpec
) -> tuple[float, float]:
    """(fixed_s, per_sample_s) of the task's collectives on the group: from a measured all-reduce of the group's
    class and degree when the profile has one (an all-gather of n bytes costs as an all-reduce of k n bytes),
    else the ring model over the group's link (cost.collective_pieces)."""
    single = problem.cluster.device_map()
    name = link_class(problem.cluster, single[device.members[0]], single[device.members[1]]) or ""
    measured = profile.links.get(all_reduce_key(name, device.degree))
    if measured is None:
        return cost.collective_pieces(task, device.degree, _group_link(problem, profile, device))
    calls = task.tp_allreduces + task.tp_allgathers
    moved = task.tp_allreduce_bytes_per_sample + device.degree * task.tp_allgather_bytes_per_sample
    return calls * measured.latency_s, moved / measured.bw_bytes_per_s


def _measured_piece(
    problem: PlacementProblem, profile: Profile, task: Task, device: DeviceSpec, timing: TaskTiming
) -> tuple[float, float]:
    if device.degree <= 1:
        return timing.fixed_s, timing.per_sample_s
    fixed, slope = _group_collectives(problem, profile, task, device)
    return timing.fixed_s + fixed, timing.per_sample_s + slope


def apply_profile(problem: PlacementProblem, profile: Profile) -> PlacementProblem:
    """The problem with measured task and link costs wherever the profile has them (see the module docstring)."""
    graph, devices = problem.graph, problem.devices
    pieces = problem.time_pieces.copy()
    for i, task in enumerate(graph.tasks):
        key = task_key(graph, task)
        for k, device in enumerate(devices):
            if not problem.supported[i, k]:
                continue
            joint = (
                profile.timing(device.kind, group_key(key, device.degree, joint=True)) if device.degree > 1 else None
            )
            if joint is not None:
                pieces[i, k, :] = (joint.fixed_s, joint.per_sample_s)
                continue
            timing = profile.timing(device.kind, group_key(key, device.degree))
            if timing is not None:
                pieces[i, k, :] = _measured_piece(problem, profile, task, device, timing)
    comm_fixed, comm_slope = _measured_transfers(problem, profile)
    return dataclasses.replace(problem, time_pieces=pieces, comm_fixed=comm_fixed, comm_slope=comm_slope)


def _measured_transfers(problem: PlacementProblem, profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    """The problem's transfer tables with cost.transfer_tables over the measured link of every pair
    whose link class the profile has."""
    devices = problem.devices
    links = [
        [None if k == l else _profile_link(problem.cluster, profile, a, b) for l, b in enumerate(devices)]
        for k, a in enumerate(devices)
    ]
    measured = np.array([[link is not None for link in row] for row in links], dtype=bool)
    if not measured.any():
        return problem.comm_fixed, problem.comm_slope
    kinds = [problem.cluster.kind(d.kind) for d in devices]
    fixed, slope = cost.transfer_tables(problem.graph.edges, links, kinds)
    return np.where(measured, fixed, problem.comm_fixed), np.where(measured, slope, problem.comm_slope)


def _profile_link(cluster: ClusterSpec, profile: Profile, a: DeviceSpec, b: DeviceSpec) -> LinkSpec | None:
    measured = profile.links.get(link_class(cluster, a, b) or "")
    return None if measured is None else LinkSpec(bw_bytes_per_s=measured.bw_bytes_per_s, latency_s=measured.latency_s)
