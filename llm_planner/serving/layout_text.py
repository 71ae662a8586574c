"""A replica layout read back from text: the notation `describe` writes (llm_planner.serving.layout),
which plans store and `show` prints, and a compact form. Segments in pipeline order, joined by "->":

    <class>: <n> stage[s] x <each> [in 1 server | on <j> servers]    (describe's; the servers optional)
    <n> x <class>[tp<k>]                                               (compact: n stages of k devices)
    <n> x <class>[dpa<k>]                                              (compact: data-parallel attention)
    <n> x <class>[dpa<k>-deepep]                                       (compact: the same, tokens by DeepEP)
    <n> x <class>                                                      (compact: n stages of 1 device)

where <class> is "<server template>/<device kind>" (llm_planner.serving.classes) and <each> is
tp<k> for a tensor-parallel group of k devices, dpa<k> for a group of k with data-parallel
attention and the experts split over it (a mixture of experts: llm_planner.cost.dp_attention;
dpa<k>-deepep where DeepEP's kernels move the tokens to the experts), or
"1 GPU" / "1 CPU" / "1 device" for one device (as `describe` writes it for the class's kind). The
servers part, when given, must be the number the segment spans (ceil(n k / devices a server)); it
adds nothing the rest does not imply.

`parse_layout(describe(l), classes) == l` for every layout; what the text asks of the classes (a
degree the class forms, a block it can give, no more devices than it has) is checked here with a
LayoutError naming the segment and what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from llm_planner.serving.classes import ServerClass, block_sizes_in_server, is_dp
from llm_planner.serving.layout import Layout, Segment, device_word, layout_usage, servers_spanned, servers_text

_NAME = r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+"  # spec_fields.SAFE_NAME_CHARS on both sides of the "/"
_NUM = r"[0-9]{1,9}"  # ASCII digits only, as every count the tool reads
_DESCRIBED = re.compile(
    rf"(?P<cls>{_NAME})\s*:\s*(?P<n>{_NUM})\s+stages?\s+x\s+"
    rf"(?:(?P<group>tp|dpa)(?P<k>{_NUM})(?P<deepep>-deepep)?|1\s+(?P<unit>GPU|CPU|device))"
    rf"(?:\s+(?:in|on)\s+(?P<servers>{_NUM})\s+servers?)?"
)
_COMPACT = re.compile(
    rf"(?P<n>{_NUM})\s*x\s*(?P<cls>{_NAME})(?:\[(?P<group>tp|dpa)(?P<k>{_NUM})(?P<deepep>-deepep)?\])?"
)
EXPECTED = (
    "'<template>/<kind>: <n> stages x tp<k> [on <j> servers]' (or '1 GPU' for tp<k>, or dpa<k>[-deepep]), "
    "or '<n> x <template>/<kind>[tp<k>]' (or [dpa<k>[-deepep]], or without [tp<k>] for one device a stage)"
)


class LayoutError(ValueError):
    """A replica layout (or its split or operating point) that cannot be scored; the message says why."""


def parse_layout(text: str, classes: Mapping[str, ServerClass]) -> Layout:
    """The layout `text` writes (module docstring), checked against the cluster's classes."""
    parts = [part.strip() for part in text.split("->")]
    if not text.strip():
        raise LayoutError(f"no segment given: expected segments joined by '->', each {EXPECTED}")
    layout = tuple(_segment(i, part, classes) for i, part in enumerate(parts, start=1))
    for name, used in layout_usage(layout).items():
        sc = classes[name]
        if used > sc.num_devices:
            raise LayoutError(
                f"the replica takes {used} devices of {name} over its segments, more than the class has "
                f"({_count_text(sc)})"
            )
    return layout


def _segment(i: int, part: str, classes: Mapping[str, ServerClass]) -> Segment:
    where = f"segment {i}"
    if not part:
        raise LayoutError(f"{where} is empty: expected {EXPECTED}")
    match = _DESCRIBED.fullmatch(part) or _COMPACT.fullmatch(part)
    if match is None:
        raise LayoutError(f"{where} {part!r}: expected {EXPECTED}")
    name = match["cls"]
    sc = classes.get(name)
    if sc is None:
        cpus = "" if any(c.kind.type == "cpu" for c in classes.values()) else " (CPU classes only with --allow-cpu)"
        raise LayoutError(f"{where}: unknown class {name!r}; the classes that may serve are {', '.join(classes)}{cpus}")
    stages, degree = int(match["n"]), int(match["k"] or 1)
    if stages < 1 or degree < 1:
        raise LayoutError(f"{where} {part!r}: stages and tp<k> must be at least 1")
    groups = match.groupdict()
    if groups.get("unit") and groups["unit"] != device_word(sc):
        raise LayoutError(f"{where}: a device of {name} is written '1 {device_word(sc)}', not '1 {groups['unit']}'")
    attention = ("dp-deepep" if match["deepep"] else "dp") if match["group"] == "dpa" else "tp"
    if match["deepep"] and match["group"] != "dpa":
        raise LayoutError(f"{where} {part!r}: -deepep goes with dpa<k> (a group with data-parallel attention) only")
    if is_dp(attention) and degree < 2:
        raise LayoutError(f"{where} {part!r}: dpa<k> is a group of k >= 2 devices")
    seg = Segment(name, degree, stages, attention)
    _check_block(where, seg, sc)
    given, spans = groups.get("servers"), servers_spanned(seg, sc)
    if given is not None and int(given) != spans:
        raise LayoutError(
            f"{where} {part!r}: {stages} stage(s) x {degree} device(s) of {name} ({sc.per_server} a server) "
            f"span {spans} server(s), not {int(given)}: write '{servers_text(spans)}' or leave it out"
        )
    return seg


def _check_block(where: str, seg: Segment, sc: ServerClass) -> None:
    """LayoutError when the class cannot form the segment's groups or give its block of devices."""
    if is_dp(seg.attention) and seg.degree not in sc.dp_degrees:
        formed = ", ".join(f"dpa{k}" for k in sc.dp_degrees) or "none"
        raise LayoutError(
            f"{where}: {sc.name} forms no group of {seg.degree} devices with data-parallel attention; those it forms "
            f"for this model are {formed} (a mixture of experts whose experts, with --eplb's redundant ones where "
            "given, split evenly over the group, inside a server or over a power of two of whole servers)"
        )
    if is_dp(seg.attention) and seg.attention not in sc.dp_attentions:
        raise LayoutError(f"{where}: dpa{seg.degree}-deepep moves tokens with DeepEP, which is offered with --deepep")
    if seg.attention == "tp" and seg.degree not in sc.degrees and not sc.kind.forms_tensor_groups:
        raise LayoutError(
            f"{where}: {sc.name} forms no tensor-parallel group: its kind does not form them (`tensor_parallel: "
            "false` in the spec, a CPU's default)"
        )
    if seg.attention == "tp" and seg.degree not in sc.degrees:
        formed = ", ".join(f"tp{k}" for k in sc.degrees if k > 1) or "none"
        raise LayoutError(
            f"{where}: {sc.name} forms no tensor-parallel group of {seg.degree} devices; the groups it forms "
            f"for this model are {formed} (a power of two dividing the {sc.per_server} devices of a server, or "
            "all of them, over which the model's heads, KV heads and MLP width divide)"
        )
    if seg.devices > sc.num_devices:
        raise LayoutError(
            f"{where}: {seg.stages} stage(s) x {seg.degree} device(s) = {seg.devices} devices of {sc.name}, more "
            f"than the class has ({_count_text(sc)})"
        )
    if not sc.block_ok(seg.devices):
        sizes = ", ".join(map(str, block_sizes_in_server(sc.per_server)))
        raise LayoutError(
            f"{where}: {seg.devices} devices of {sc.name} is no block a replica can take: inside one server "
            f"{sizes} devices, or whole servers (a multiple of {sc.per_server})"
        )


def _count_text(sc: ServerClass) -> str:
    return f"{sc.num_devices}: {sc.num_servers} server(s) x {sc.per_server}"
