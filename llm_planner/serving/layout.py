"""Replica layouts: which classes, degrees and stage counts a replica uses, in pipeline order,
and the links between its stages.

A layout is a tuple of segments (class, degree k, stages n, attention): n consecutive pipeline
stages, each a group of k devices of the class (k = 1: one device), taking a block of n k devices
of the class (llm_planner.serving.classes: inside one server, or whole servers).
Inside a segment two consecutive stages share a server when the block is inside one server,
or when both fall in the same server of a whole-server block (n k / servers stages a server,
filled in order); then the class's link joins them, otherwise the link between two servers of
the class's region (llm_planner.serving.links). Two segments run on different servers
(conservative where a server holds two kinds: a CPU stage beside a GPU stage of the same server is
charged the network too) and hand on over the link between their classes' regions, and so does the
token's return from the last stage to the first unless the whole replica is one block inside one
server; on a cluster of one server, which has no link between servers, those hand-offs take the
server's link between the two kinds. A group runs the layers tensor-parallel (attention "tp"), or,
for a mixture of experts, with data-parallel attention and the experts split over the group
("dp": llm_planner.cost.dp_attention; "dp-deepep" moving tokens with DeepEP), where the class
offers it (ServerClass.dp_degrees, dp_attentions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llm_planner.serving.classes import ServerClass, is_dp
from llm_planner.serving.costs import StageCosts, stage_costs
from llm_planner.serving.dp_costs import dp_stage_costs
from llm_planner.serving.links import ClassLinks
from llm_planner.serving.replica import ReplicaEval, StageSlot
from llm_planner.serving.tasks import ServingTasks


@dataclass(frozen=True)
class Segment:
    class_name: str
    degree: int
    stages: int
    attention: str = "tp"  # or one of classes.DP_ATTENTIONS: data-parallel attention (module docstring)

    @property
    def devices(self) -> int:
        return self.degree * self.stages


Layout = tuple[Segment, ...]


def segment_fields(seg: Segment) -> dict:
    """A segment as a plan's replica states it (`attention` only where data-parallel)."""
    out = {"class": seg.class_name, "degree": seg.degree, "stages": seg.stages}
    return out | ({"attention": seg.attention} if seg.attention != "tp" else {})


def stage_attention(segments: list[dict]) -> list[str]:
    """Each stage's attention ("tp" or one of DP_ATTENTIONS) from a plan's replica segments (segment_fields)."""
    return [seg.get("attention", "tp") for seg in segments for _ in range(seg["stages"])]


def segment_of(fields: dict) -> Segment:
    """The segment a plan's checked replica states (segment_fields)."""
    return Segment(fields["class"], fields["degree"], fields["stages"], fields.get("attention", "tp"))


class CostCache:
    """StageCosts per (class, degree, attention), computed once."""

    def __init__(self, tasks: ServingTasks, classes: tuple[ServerClass, ...], profile=None):
        self.tasks, self.classes = tasks, {c.name: c for c in classes}
        self.profile = profile  # a measured serving profile or None (stage_costs decides where it applies)
        self._cache: dict[tuple[str, int, str], StageCosts] = {}

    def get(self, class_name: str, degree: int, attention: str = "tp") -> StageCosts:
        key = (class_name, degree, attention)
        if key not in self._cache:
            sc = self.classes[class_name]
            if attention == "tp":
                self._cache[key] = stage_costs(self.tasks, sc, degree, self.profile)
            else:
                self._cache[key] = dp_stage_costs(self.tasks, sc, degree, attention)
        return self._cache[key]

    def of(self, seg: Segment) -> StageCosts:
        """The costs of one stage of the segment."""
        return self.get(seg.class_name, seg.degree, seg.attention)

    def shapes(self, sc: ServerClass) -> list[StageCosts]:
        """The costs of every group a stage of the class may be (ServerClass.shapes), in its order."""
        return [self.get(sc.name, k, attention) for k, attention in sc.shapes]


def same_server_after(seg: Segment, sc: ServerClass, i: int) -> bool:
    """Whether stage i and stage i + 1 of the segment run in one server."""
    if seg.devices <= sc.per_server:
        return True
    if sc.spans_servers(seg.degree):  # each stage's group is whole servers of its own
        return False
    per_server = sc.per_server // seg.degree
    return (i + 1) % per_server != 0


def build_slots(layout: Layout, cache: CostCache, links: ClassLinks) -> list[StageSlot]:
    """Each stage's costs and the link it hands on over (module docstring; the links between two
    classes' blocks: llm_planner.serving.links)."""
    across = links.handoff
    slots = []
    total = sum(seg.stages for seg in layout)
    for j, seg in enumerate(layout):
        sc = cache.classes[seg.class_name]
        costs = cache.of(seg)
        for i in range(seg.stages):
            if i + 1 < seg.stages:
                link = sc.intra_link if same_server_after(seg, sc, i) else across(seg.class_name, seg.class_name)
            elif j + 1 < len(layout):
                link = across(seg.class_name, layout[j + 1].class_name)
            else:  # the last stage: the token goes back to the first
                one_server = len(layout) == 1 and seg.devices <= sc.per_server
                link = (
                    None
                    if total == 1
                    else (sc.intra_link if one_server else across(seg.class_name, layout[0].class_name))
                )
            slots.append(StageSlot(costs=costs, link_next=link))
    return slots


def runs_somewhere(layout: Layout) -> bool:
    """Whether some engine runs the layout: a group with data-parallel attention only as the whole
    replica, one stage (vLLM and SGLang run it so, and the project's runtime: llm_planner.serving.engines,
    llm_planner.runtime.serve_dp). The search and engineer-best keep to such layouts; the bounds and
    `score` take any."""
    return all(seg.attention == "tp" for seg in layout) or (len(layout) == 1 and layout[0].stages == 1)


def layout_usage(layout: Layout) -> dict[str, int]:
    """Devices of each class one replica of the layout takes."""
    out: dict[str, int] = {}
    for seg in layout:
        out[seg.class_name] = out.get(seg.class_name, 0) + seg.devices
    return out


def layout_ok(layout: Layout, classes: dict[str, ServerClass]) -> bool:
    """Every segment a block its class may give (llm_planner.serving.classes), the class's
    devices enough for all its segments, no two neighbours of one class (they are one segment),
    and a class only at the two ends when it appears twice (search.with_ends)."""
    if any(not classes[seg.class_name].block_ok(seg.devices) for seg in layout):
        return False
    if any(n > classes[name].num_devices for name, n in layout_usage(layout).items()):
        return False
    if any(a.class_name == b.class_name for a, b in zip(layout, layout[1:])):
        return False
    names = [seg.class_name for seg in layout]
    repeated = [name for name in set(names) if names.count(name) > 1]
    return not repeated or (repeated == [names[0]] and names.count(names[0]) == 2 and names[-1] == names[0])


def describe(layout: Layout, classes: Mapping[str, ServerClass]) -> str:
    """A replica layout as the plan file stores it and the CLI prints it (the one place that
    writes it): each segment's class, its pipeline stages and each stage's devices, and the
    servers the segment spans, segments in pipeline order joined by " -> ", e.g.
    "h100-server/h100-80g: 4 stages x tp4 on 2 servers -> v100-server/v100-32g: 1 stage x 1 GPU in 1 server"."""
    return " -> ".join(_describe_segment(seg, classes[seg.class_name]) for seg in layout)


def _describe_segment(seg: Segment, sc: ServerClass) -> str:
    stages = f"{seg.stages} stage" + ("s" if seg.stages > 1 else "")
    each = group_text(seg.degree, seg.attention) if seg.degree > 1 else "1 " + device_word(sc)
    return f"{seg.class_name}: {stages} x {each} {servers_text(servers_spanned(seg, sc))}"


def group_text(degree: int, attention: str) -> str:
    """A group as the notation writes it: tp<k> (tensor-parallel), dpa<k> (data-parallel
    attention, the experts split over the k), dpa<k>-deepep (the same, tokens moved by DeepEP)."""
    if not is_dp(attention):
        return f"tp{degree}"
    return f"dpa{degree}" + ("-deepep" if attention == "dp-deepep" else "")


def device_word(sc: ServerClass) -> str:
    """What `describe` calls one device of the class."""
    return {"cpu": "CPU", "gpu": "GPU"}.get(sc.kind.type, "device")


def servers_spanned(seg: Segment, sc: ServerClass) -> int:
    """Servers the segment's block of devices spans (a block inside one server, or whole servers)."""
    return -(-seg.devices // sc.per_server)


def servers_text(servers: int) -> str:
    return "in 1 server" if servers == 1 else f"on {servers} servers"


@dataclass(frozen=True, kw_only=True)
class Pattern:
    """A layout at its operating point: what the fleet problem counts copies of."""

    layout: Layout
    ev: ReplicaEval

    @property
    def usage(self) -> dict[str, int]:
        return layout_usage(self.layout)
