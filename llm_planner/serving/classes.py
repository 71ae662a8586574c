"""Classes of interchangeable accelerators: one per (server template, device kind).

A fleet is a few server templates with a `count` each; every copy of a template is the same
hardware, so a serving plan needs to know only how many devices of each class a replica
uses, not which. A replica takes from a class either a block of s devices inside one server
(s a power of two dividing the server's count n, or n itself) or s = j n devices on j whole
servers. Such sizes divide one another (each divides n, and n divides every whole-server
block), so any set of blocks whose sizes add up to at most the class's devices packs into
its servers (first fit, largest first, fills servers without gaps): a count per class is
enough for the fleet problem (llm_planner.serving.fleet) and the packing is done once, at
the end (llm_planner.serving.assign).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_planner.core.spec import ClusterSpec, DeviceKindSpec, LinkSpec
from llm_planner.core.tensor_groups import group_degrees

# The attentions of a group with data-parallel attention, the experts split over it
# (llm_planner.cost.dp_attention), by how it moves tokens to the experts: "dp" gathers them
# (vLLM's default all2all backend), "dp-deepep" sends each only to its top-k experts' members with
# DeepEP's low-latency kernels (offered with --deepep). Values: the cost layer's all2all names.
DP_ALL2ALL = {"dp": "allgather_reducescatter", "dp-deepep": "deepep_low_latency"}
DP_ATTENTIONS = tuple(DP_ALL2ALL)


def is_dp(attention: str) -> bool:
    """Whether a stage's attention is data-parallel (either all-to-all)."""
    return attention in DP_ALL2ALL


@dataclass(frozen=True, kw_only=True)
class ServerClass:
    name: str  # "<template>/<kind>"
    template: str  # the NodeSpec's name
    kind: DeviceKindSpec
    per_server: int  # devices of the kind in one server (n)
    num_servers: int  # servers of the template
    intra_link: LinkSpec | None  # between two devices of the kind in one server; None with one device
    server_link: LinkSpec | None = None  # between two servers of the template; None with one server
    degrees: tuple[int, ...]  # tensor-parallel degrees a stage may use here (1 first)
    # degrees of groups with data-parallel attention, the experts split over the group (an MoE
    # model only: llm_planner.cost.dp_attention): inside a server, or whole servers (spans_servers)
    dp_degrees: tuple[int, ...] = ()
    dp_attentions: tuple[str, ...] = DP_ATTENTIONS[:1]  # how those groups may move tokens (DP_ALL2ALL)

    @property
    def shapes(self) -> tuple[tuple[int, str], ...]:
        """Every (degree, attention) a stage may take here: "tp" at each degree, then the
        data-parallel ones at each of theirs."""
        dp = tuple((k, a) for a in self.dp_attentions for k in self.dp_degrees)
        return tuple((k, "tp") for k in self.degrees) + dp

    @property
    def num_devices(self) -> int:
        return self.per_server * self.num_servers

    def spans_servers(self, degree: int) -> bool:
        """Whether a group of `degree` devices of the class spans servers (data-parallel attention only)."""
        return degree > self.per_server

    def span(self, degree: int) -> tuple[int, LinkSpec] | None:
        """(devices a server, the link between servers) for a group of `degree` over whole servers;
        None inside one server (llm_planner.cost.dp_attention.dp_layer_kernels's `span`)."""
        return (self.per_server, self.server_link) if self.spans_servers(degree) else None

    def block_ok(self, size: int) -> bool:
        """Whether a replica may take `size` devices of this class (module docstring)."""
        n = self.per_server
        if size <= n:
            return size in block_sizes_in_server(n)
        return size % n == 0 and size <= self.num_devices


def block_sizes_in_server(n: int) -> tuple[int, ...]:
    return (1, *group_degrees(n, n))


def server_classes(
    cluster: ClusterSpec,
    *,
    allow_cpu: bool,
    max_tp: int | None,
    shards_over,
    dp_over=None,
    dp_attentions: tuple[str, ...] = DP_ATTENTIONS[:1],
) -> tuple[ServerClass, ...]:
    """Every (template, kind) class of the cluster that serving may use, in spec order.

    CPUs only with allow_cpu; groups only over kinds whose spec allows them (`tensor_parallel`,
    false for CPUs unless the spec says otherwise); `shards_over(k)` says whether the model's
    tasks split over k devices (heads, KV heads and MLP width divisible by k); `dp_over(k)` (None:
    never) whether a group of k may run them with data-parallel attention, moving tokens by any of
    `dp_attentions`."""
    out = []
    devices = cluster.devices()
    for node in cluster.nodes:
        for kind_name, per_server in node.devices:
            kind = cluster.kind(kind_name)
            if kind.type == "cpu" and not allow_cpu:
                continue
            same = [d for d in devices if d.node_template == node.name and d.kind == kind_name]
            first_node = [d for d in same if d.node == same[0].node]
            link = cluster.link(first_node[0], first_node[1]) if len(first_node) > 1 else None
            limit = (max_tp or per_server) if kind.forms_tensor_groups else 1
            formed = group_degrees(per_server, limit)
            degrees = (1, *(k for k in formed if shards_over(k)))
            across = cluster.server_link(node.region, node.region) if node.count > 1 else None
            spans = _whole_servers(per_server, node.count, max_tp) if across is not None and link is not None else []
            dp_degrees = tuple(k for k in (*formed, *spans) if dp_over is not None and dp_over(k))
            out.append(
                ServerClass(
                    name=f"{node.name}/{kind_name}",
                    template=node.name,
                    kind=kind,
                    per_server=per_server,
                    num_servers=node.count,
                    intra_link=link,
                    server_link=across,
                    degrees=degrees,
                    dp_degrees=dp_degrees,
                    dp_attentions=dp_attentions,
                )
            )
    return tuple(out)


def _whole_servers(per_server: int, servers: int, max_tp: int | None) -> list[int]:
    """Degrees of groups over whole servers a data-parallel attention group may take: a power of
    two of servers (2, 4, ...) up to the template's count, at most max_tp devices."""
    out, j = [], 2
    while j <= servers and (max_tp is None or j * per_server <= max_tp):
        out.append(j * per_server)
        j *= 2
    return out
