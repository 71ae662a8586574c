"""The links a replica's hand-offs take between two blocks of classes (llm_planner.serving.layout).

A class is one server template's devices of one kind (llm_planner.serving.classes), and a template's
servers sit in one region (docs/cluster-spec.md, "links"), so servers of one type in two regions are
two classes and every class-to-class link is one known link:
- on a cluster of several servers, a hand-off from a block of class a to a block of class b on
  another server takes the link between a server of a's region and one of b's
  (ClusterSpec.server_link: the `between_regions` rule for the pair, else `inter_node`); where a's
  region has no link between two of its servers (its only server), two blocks of a share that
  server and its `intra_link`;
- on a cluster of one server, a hand-off between two classes takes the server's link between their
  kinds (`between`), and one between two blocks of a class the class's `intra_link`.

The bounds (bound_cells, bound_prices) charge a stage the least hand-off over every link a stage of
its class may use (`out_of`: to its class itself only where the class has devices beside the
stage's, for a second block); a single link (or None) given instead of ClassLinks is read as a
cluster whose servers are all joined by it (`as_class_links`), None as a cluster of one server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_planner.core.spec import ClusterSpec, LinkSpec
from llm_planner.serving.classes import ServerClass


@dataclass(frozen=True)
class ClassLinks:
    one_server: bool  # the cluster is one server: no link between servers
    across: Mapping[tuple[str, str], LinkSpec | None]  # (class a, class b) -> a hand-off's link (docstring)
    between: Mapping[tuple[str, str], LinkSpec] = field(default_factory=dict)  # one server: its links by classes

    def handoff(self, a: str, b: str) -> LinkSpec | None:
        """The link from a block of class a to another block of class b."""
        return self.across.get((a, b))

    def out_of(self, a: str, itself: bool = True) -> tuple[LinkSpec, ...]:
        """Every link a block of class a hands on over to a block of another class, and to another
        block of class a when `itself` (distinct, in class order)."""
        out = []
        for (src, dst), link in self.across.items():
            if src == a and (itself or dst != a) and link is not None and link not in out:
                out.append(link)
        return tuple(out)


def class_links(cluster: ClusterSpec, classes: tuple[ServerClass, ...]) -> ClassLinks:
    """The links between every two classes of the cluster (module docstring)."""
    if len(cluster.node_names()) == 1:
        between = _one_server_links(cluster, classes)
        pairs = [(a, b) for a in classes for b in classes]
        across = {(a.name, b.name): a.intra_link if a is b else between.get((a.name, b.name)) for a, b in pairs}
        return ClassLinks(one_server=True, across=across, between=between)
    across = {}
    for a in classes:
        for b in classes:
            link = cluster.server_link(cluster.region_of(a.template), cluster.region_of(b.template))
            across[(a.name, b.name)] = a.intra_link if link is None and a is b else link
    return ClassLinks(one_server=False, across=across)


def uniform_links(inter: LinkSpec | None, classes: tuple[ServerClass, ...]) -> ClassLinks:
    """Every two servers joined by `inter`; None: a cluster of one server whose links are not known
    (the bounds then charge no hand-off between two classes)."""
    if inter is None:
        return ClassLinks(one_server=True, across={})
    return ClassLinks(one_server=False, across={(a.name, b.name): inter for a in classes for b in classes})


def as_class_links(links: ClassLinks | LinkSpec | None, classes: tuple[ServerClass, ...]) -> ClassLinks:
    return links if isinstance(links, ClassLinks) else uniform_links(links, classes)


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
