"""Tensor-parallel groups: sets of identical devices of one node that run a task together.

A group is k >= 2 devices of one kind in one node; the node's link between two
devices of that kind carries its collectives. Only kinds whose `tensor_parallel` is true
form groups: GPUs and accelerators by default, CPUs only when the spec says so
(spec.TENSOR_PARALLEL_DEFAULT). The planner offers *aligned*
groups only: the devices of a kind in a node, in spec order, cut into blocks of
k starting at 0, for k a power of two that divides the number n of such devices,
and k = n itself (the whole class). That loses no plan up to a permutation of
identical devices: in any set of disjoint groups of such sizes, moving the
groups to the top of the class, larger first, and single devices to the bottom,
keeps every group aligned (each size divides every larger one and n). It is
also what Megatron-LM and vLLM do (tensor-parallel ranks are consecutive GPUs).

A group's name lists its first and last member: "h100-server-0/h100-80g:0-7".
In plan files a group is written as the list of its members' names.

Interchangeable devices (`device_class`): two placement devices (single devices or groups)
are interchangeable when they have the same server template, kind and degree. In a cluster
spec a device's costs depend only on its kind and degree (a group's collectives run over
its server's link between devices of its kind), and its links only on the kinds and the
server template; so any permutation of a class's devices inside one server, and of the
copies of a template, maps a plan onto a plan with the same costs. A pair and a single
device of one kind are not interchangeable: the pair runs a sharded task faster. Every
solver, bound and baseline that exploits symmetry reads this one answer.
"""

from __future__ import annotations

import re
from collections import defaultdict

from llm_planner.core.spec import ClusterSpec, DeviceSpec

_NAME = re.compile(r"^(?P<node>[^/]+)/(?P<kind>[^:]+):(?P<first>\d+)-(?P<last>\d+)$", re.ASCII)


DeviceClass = tuple[str, str, int]  # (server template, kind, degree)


def device_class(device: DeviceSpec) -> DeviceClass:
    """(server template, kind, degree): devices with equal classes are interchangeable, inside
    one server directly and across copies of a template by the servers' permutation (module
    docstring). Degree 1 for a single device, k for a tensor-parallel group of k members."""
    return (device.node_template, device.kind, device.degree)


class GroupError(ValueError):
    """A group that the cluster cannot form; the message says why."""


def group_degrees(count: int, max_tp: int) -> list[int]:
    """Degrees k >= 2 offered for a class of `count` identical devices: powers of two dividing
    count, and count itself, at most max_tp."""
    out = [k for k in range(2, count + 1) if (k & (k - 1) == 0 and count % k == 0) or k == count]
    return [k for k in out if k <= max_tp]


def group_name(first: DeviceSpec, last: DeviceSpec) -> str:
    return f"{first.node}/{first.kind}:{first.index}-{last.index}"


def is_group_name(name: str) -> bool:
    return _NAME.match(name) is not None


def member_names(name: str) -> list[str]:
    """The devices of a group name ("n/k:0-3" -> ["n/k:0", ..., "n/k:3"]); [name] for a device."""
    m = _NAME.match(name)
    if m is None:
        return [name]
    first, last = int(m["first"]), int(m["last"])
    return [f"{m['node']}/{m['kind']}:{j}" for j in range(first, last + 1)]


def tensor_groups(cluster: ClusterSpec, max_tp: int) -> tuple[DeviceSpec, ...]:
    """Every aligned group of degree 2..max_tp of the cluster over the kinds that may form groups
    (`tensor_parallel` in the spec: GPUs and accelerators by default, CPUs only when it says
    so), as devices with `members` set (ordered by node, kind, degree, first member)."""
    classes: dict[tuple[str, str], list[DeviceSpec]] = defaultdict(list)
    for d in cluster.devices():
        if cluster.kind(d.kind).forms_tensor_groups:
            classes[(d.node, d.kind)].append(d)
    out = []
    for members in classes.values():
        for k in group_degrees(len(members), max_tp):
            for start in range(0, len(members) - k + 1, k):
                block = members[start : start + k]
                out.append(
                    DeviceSpec(
                        name=group_name(block[0], block[-1]),
                        kind=block[0].kind,
                        node=block[0].node,
                        node_template=block[0].node_template,
                        index=block[0].index,
                        hostname=block[0].hostname,
                        members=tuple(d.name for d in block),
                    )
                )
    return tuple(out)


def group_from_members(cluster: ClusterSpec, names: list[str], max_tp: int | None = None) -> str:
    """The group name of a list of device names (a plan file's group); GroupError when the
    cluster offers no such group (unknown device, two nodes or kinds, not an aligned block):
    the groups of `tensor_groups`, checked without listing them."""
    if len(names) < 2:
        raise GroupError(f"a group needs at least 2 devices, got {names}")
    known = cluster.device_map()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise GroupError(f"unknown device(s) {unknown} in group {names}")
    members = [known[n] for n in names]
    if len({(d.node, d.kind) for d in members}) > 1:
        raise GroupError(f"group {names} mixes nodes or device kinds; a group is devices of one kind in one node")
    kind = cluster.kind(members[0].kind)
    if not kind.forms_tensor_groups:
        raise GroupError(
            f"group {names}: devices of kind {kind.name!r} ({kind.type}) do not form tensor-parallel groups "
            "(the cluster spec's device_kinds[].tensor_parallel)"
        )
    k, first = len(members), members[0].index
    template = next(node for node in cluster.nodes if node.name == members[0].node_template)
    count = dict(template.devices)[members[0].kind]
    if (
        [d.index for d in members] != list(range(first, first + k))
        or first % k
        or k not in group_degrees(count, max_tp or k)
    ):
        raise GroupError(
            f"group {names} is not an aligned block of its devices (degree a power of two dividing their count, "
            "or all of them, members consecutive from a multiple of the degree)"
        )
    return group_name(members[0], members[-1])
