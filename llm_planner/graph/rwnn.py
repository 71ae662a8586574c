"""Randomly wired neural networks (RWNN), analytically: a task graph without torch.

Xie, Kirillov, Girshick, He, "Exploring Randomly Wired Neural Networks for Image
Recognition", ICCV 2019. Each stage is a random undirected graph from a
networkx generator, as in the paper:

    "ws": watts_strogatz_graph(n, k=4, p=0.75)   (k = n, a complete graph, for n <= 4)
    "er": erdos_renyi_graph(n, p=0.2)            (dense for large n: about 0.1 n^2 edges)
    "ba": barabasi_albert_graph(n, m=5)          (m = n - 1 for n <= 5)

A stage of one node has no edges. Edges are oriented from the lower to the
higher node index, which makes a DAG (the paper's orientation).

The network follows the paper's small-computation regime: a stem of two 3x3
stride-2 convolutions (the paper's conv1, conv2) takes the image to 1/4 of its
side, then S random stages each halve the side and (from the second on) double
the channels: stage s has C_s = channels * 2^s channels at H_s x H_s pixels,
H_s = ceil(H_{s-1} / 2), H_{-1} = ceil(ceil(image_size / 2) / 2), C_{-1} = channels
(224 px, 3 stages: 28, 14, 7 pixels, like the paper's conv3-conv5). Tasks:

    images      the network input (kind "input", the fx placeholder), feeds stem
    stem        3x3 conv stride 2, 3 -> C/2 - BN - ReLU - 3x3 conv stride 2, C/2 -> C - BN
    s{s}_in     ReLU - 3x3 conv stride 2, C_{s-1} -> C_s - BN; the stage's input task,
                it feeds every node with no predecessor
    s{s}_n{j}   aggregation sum_i sigmoid(w_i) x_i over its d inputs, then
                ReLU - 3x3 depthwise conv - 1x1 pointwise conv - BN, C_s -> C_s
    s{s}_out    the stage's output task: mean of every node with no successor;
                feeds s{s+1}_in, or the head
    head        global average pool - linear C_{S-1} -> num_classes (the paper's
                extra 1x1 conv to 1280 channels is left out)
    output      the network output (kind "output")

Task names are the fx node names of llm_planner.graph.rwnn_torch's module, so a
plan made on this graph runs there. Numbers per sample (E = bytes per element
of `dtype`, HW = H_s^2, d = in-degree), in the convention of the fx builder
(llm_planner.graph.fx): FLOPs are 2 per multiply-add of convolutions and linear
layers; elementwise work (ReLU, BN, aggregation, mean, pooling) is memory-bound
and charged through bytes:

    stem      FLOPs = 2 * 9 (3 C/2 H_a^2 + C/2 C H_b^2)   weights = (9 * 3 C/2 + 9 C/2 C + 4 C/2 + 4 C) E + 16
    stage in  FLOPs = 2 * 9 C_{s-1} C_s HW              weights = (9 C_{s-1} C_s + 4 C_s) E + 8
    node      FLOPs = 2 (9 C + C^2) HW                  weights = (d + 9 C + C^2 + 4 C) E + 8
    stage out FLOPs = 0                                 weights = 0
    head      FLOPs = 2 C num_classes                   weights = (C + 1) num_classes E
    bytes_per_sample = (inputs + output) activation bytes; an edge carries its
    producer's output, C_s HW E. (C/2 = max(1, C // 2); H_a, H_b: the stem's two
    output sides; the 8 bytes are each BatchNorm's int64 counter.)

With the defaults, rwnn-ws-3x32 is about 1.35 GFLOPs per image (0.67 G
multiply-adds; the paper's small RandWire-WS: 583 M) and 5.3 M parameters (5.6 M).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

import networkx as nx

from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.graph.ir import MAX_TASKS, Edge, GraphError, Task, TaskGraph

GENERATORS = {
    "ws": "Watts-Strogatz k=4 p=0.75",
    "er": "Erdos-Renyi p=0.2",
    "ba": "Barabasi-Albert m=5",
}
PRESET_STAGES = 3
PRESET_NODES = (32, 64, 128, 256)
DEFAULT_CHANNELS = 78  # the paper's small-computation regime
DEFAULT_IMAGE_SIZE = 224
DEFAULT_NUM_CLASSES = 1000
INPUT_NAME = "images"  # the fx placeholder name (the forward argument)
STEM_NAME = "stem"
HEAD_NAME = "head"
OUTPUT_NAME = "output"
BN_COUNTER_BYTES = 8  # BatchNorm2d's num_batches_tracked, an int64 buffer

MAX_STAGES = 8  # published randomly wired networks have 3-5 stages (docs/inputs.md)
_NAME = re.compile(r"^rwnn-(?P<gen>[a-z]+)-(?P<stages>\d+)x(?P<nodes>\d+)$", re.ASCII)


def node_name(stage: int, node: int) -> str:
    return f"s{stage}_n{node}"


def stage_input_name(stage: int) -> str:
    return f"s{stage}_in"


def stage_output_name(stage: int) -> str:
    return f"s{stage}_out"


def _check(generator: str, num_stages: int, nodes_per_stage: int) -> None:
    if generator not in GENERATORS:
        raise GraphError(f"rwnn: unknown generator {generator!r} (known: {', '.join(GENERATORS)})")
    if num_stages < 1:
        raise GraphError(f"rwnn: num_stages must be >= 1, got {num_stages}")
    if nodes_per_stage < 1:
        raise GraphError(f"rwnn: nodes_per_stage must be >= 1, got {nodes_per_stage}")
    if num_stages > MAX_STAGES:  # each stage doubles the channels: 600 stages overflowed a float
        raise GraphError(
            f"rwnn: num_stages must be at most {MAX_STAGES} (the channels double a stage), got {num_stages}"
        )
    if num_stages * (nodes_per_stage + 2) > MAX_TASKS:  # checked before a stage is wired: 99999x99999 ran out of memory
        raise GraphError(
            f"rwnn: {num_stages} stages of {nodes_per_stage} nodes exceed the {MAX_TASKS:,} tasks a graph may have"
        )


def stage_dag(generator: str, num_nodes: int, *, seed: int, stage: int) -> nx.DiGraph:
    """The wiring of one stage: nodes 0..n-1, edges oriented from lower to higher index.

    The random source is seeded by (seed, stage) only, so the same seed gives the
    same DAG here and in rwnn_torch, in any process.
    """
    _check(generator, 1, num_nodes)
    rng = random.Random(f"rwnn:{seed}:{stage}")
    n = num_nodes
    if n == 1:
        undirected = nx.empty_graph(1)
    elif generator == "ws":
        undirected = nx.watts_strogatz_graph(n, min(4, n), 0.75, seed=rng)
    elif generator == "er":
        undirected = nx.erdos_renyi_graph(n, 0.2, seed=rng)
    else:
        undirected = nx.barabasi_albert_graph(n, min(5, n - 1), seed=rng)
    dag = nx.DiGraph()
    dag.add_nodes_from(range(n))
    dag.add_edges_from((min(u, v), max(u, v)) for u, v in undirected.edges())
    return dag


@dataclass(frozen=True, kw_only=True)
class StemShape:
    image_size: int
    mid_channels: int  # after the first conv
    mid_size: int
    channels: int  # after the second conv
    size: int


@dataclass(frozen=True, kw_only=True)
class StageShape:
    in_channels: int
    channels: int
    in_size: int  # spatial side of the stage's input
    size: int  # spatial side inside the stage


def _halve(side: int) -> int:
    """Output side of a 3x3 conv with stride 2 and padding 1."""
    return math.ceil(side / 2)


def stem_shape(channels: int, image_size: int) -> StemShape:
    mid = _halve(image_size)
    return StemShape(
        image_size=image_size, mid_channels=max(1, channels // 2), mid_size=mid, channels=channels, size=_halve(mid)
    )


def stage_shapes(num_stages: int, channels: int, image_size: int) -> list[StageShape]:
    """Per stage: the side halves and, from the second stage on, the channels double."""
    stem = stem_shape(channels, image_size)
    shapes, c_in, h_in = [], stem.channels, stem.size
    for s in range(num_stages):
        c, h = channels * 2**s, _halve(h_in)
        shapes.append(StageShape(in_channels=c_in, channels=c, in_size=h_in, size=h))
        c_in, h_in = c, h
    return shapes


def _labels(op: str, target: str) -> tuple[tuple[str, str], ...]:
    """The labels the fx builder writes, so both graphs are equal task for task."""
    return (("fx_op", op), ("fx_target", target))


def _stage_tasks(stage: int, dag: nx.DiGraph, shape: StageShape, e: int) -> tuple[list[Task], list[Edge]]:
    c, hw = shape.channels, shape.size**2
    out_bytes = float(c * hw * e)
    in_bytes = float(shape.in_channels * shape.in_size**2 * e)
    s_in, s_out = stage_input_name(stage), stage_output_name(stage)
    tasks = [
        Task(
            name=s_in,
            kind="RwnnStageInput",
            flops_per_sample=float(2 * 9 * shape.in_channels * c * hw),
            bytes_per_sample=in_bytes + out_bytes,
            weight_bytes=float((9 * shape.in_channels * c + 4 * c) * e + BN_COUNTER_BYTES),
            labels=_labels("call_module", s_in),
        )
    ]
    edges = []
    node_flops = float(2 * (9 * c + c * c) * hw)
    for j in range(dag.number_of_nodes()):
        preds = [node_name(stage, i) for i in sorted(dag.predecessors(j))] or [s_in]
        name = node_name(stage, j)
        tasks.append(
            Task(
                name=name,
                kind="RwnnNode",
                flops_per_sample=node_flops,
                bytes_per_sample=(len(preds) + 1) * out_bytes,
                weight_bytes=float((len(preds) + 9 * c + c * c + 4 * c) * e + BN_COUNTER_BYTES),
                labels=_labels("call_module", name),
            )
        )
        edges += [Edge(src=p, dst=name, bytes_per_sample=out_bytes) for p in preds]
    sinks = [node_name(stage, j) for j in range(dag.number_of_nodes()) if dag.out_degree(j) == 0]
    tasks.append(
        Task(
            name=s_out,
            kind="RwnnStageOutput",
            bytes_per_sample=(len(sinks) + 1) * out_bytes,
            labels=_labels("call_module", s_out),
        )
    )
    edges += [Edge(src=p, dst=s_out, bytes_per_sample=out_bytes) for p in sinks]
    return tasks, edges


def _stem_task(stem: StemShape, e: int) -> Task:
    c_mid, c = stem.mid_channels, stem.channels
    flops = 2 * 9 * (3 * c_mid * stem.mid_size**2 + c_mid * c * stem.size**2)
    weights = (9 * 3 * c_mid + 9 * c_mid * c + 4 * c_mid + 4 * c) * e + 2 * BN_COUNTER_BYTES
    return Task(
        name=STEM_NAME,
        kind="RwnnStem",
        flops_per_sample=float(flops),
        bytes_per_sample=float((3 * stem.image_size**2 + c * stem.size**2) * e),
        weight_bytes=float(weights),
        labels=_labels("call_module", STEM_NAME),
    )


def build_rwnn_graph(
    generator: str,
    num_stages: int,
    nodes_per_stage: int,
    *,
    seed: int,
    channels: int = DEFAULT_CHANNELS,
    image_size: int = DEFAULT_IMAGE_SIZE,
    dtype: str = "fp16",
    num_classes: int = DEFAULT_NUM_CLASSES,
) -> TaskGraph:
    """The task graph of a randomly wired network (see the module docstring for the numbers)."""
    _check(generator, num_stages, nodes_per_stage)
    if dtype not in DTYPE_BYTES:
        raise GraphError(f"rwnn: unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
    if channels < 1 or image_size < 1 or num_classes < 1:
        raise GraphError(
            f"rwnn: channels, image_size and num_classes must be >= 1, got {channels}, {image_size}, {num_classes}"
        )
    e = DTYPE_BYTES[dtype]
    shapes = stage_shapes(num_stages, channels, image_size)
    stem = stem_shape(channels, image_size)
    tasks = [Task(name=INPUT_NAME, kind="input", labels=_labels("placeholder", INPUT_NAME)), _stem_task(stem, e)]
    edges = [Edge(src=INPUT_NAME, dst=STEM_NAME, bytes_per_sample=float(3 * image_size**2 * e))]
    prev = STEM_NAME
    for s, shape in enumerate(shapes):
        dag = stage_dag(generator, nodes_per_stage, seed=seed, stage=s)
        stage_tasks, stage_edges = _stage_tasks(s, dag, shape, e)
        edges.append(
            Edge(src=prev, dst=stage_input_name(s), bytes_per_sample=float(shape.in_channels * shape.in_size**2 * e))
        )
        tasks += stage_tasks
        edges += stage_edges
        prev = stage_output_name(s)
    last = shapes[-1]
    last_bytes = float(last.channels * last.size**2 * e)
    tasks.append(
        Task(
            name=HEAD_NAME,
            kind="RwnnHead",
            flops_per_sample=float(2 * last.channels * num_classes),
            bytes_per_sample=last_bytes + num_classes * e,
            weight_bytes=float((last.channels + 1) * num_classes * e),
            labels=_labels("call_module", HEAD_NAME),
        )
    )
    tasks.append(Task(name=OUTPUT_NAME, kind="output", labels=_labels("output", OUTPUT_NAME)))
    edges += [
        Edge(src=prev, dst=HEAD_NAME, bytes_per_sample=last_bytes),
        Edge(src=HEAD_NAME, dst=OUTPUT_NAME, bytes_per_sample=float(num_classes * e)),
    ]
    meta = (
        ("builder", "rwnn"),
        ("generator", generator),
        ("num_stages", num_stages),
        ("nodes_per_stage", nodes_per_stage),
        ("seed", seed),
        ("channels", channels),
        ("image_size", image_size),
        ("num_classes", num_classes),
        ("dtype", dtype),
    )
    name = f"rwnn-{generator}-{num_stages}x{nodes_per_stage}"
    return TaskGraph(name=name, tasks=tuple(tasks), edges=tuple(edges), meta=meta).validate()


# ----------------------------------------------------------------------------
# Names ("rwnn-ws-3x32") and presets


def is_rwnn_name(name: str) -> bool:
    """Whether `name` is meant as an RWNN ("rwnn-..."); a malformed one fails in parse_rwnn_name."""
    return name.startswith("rwnn-")


def parse_rwnn_name(name: str) -> tuple[str, int, int]:
    """ "rwnn-<generator>-<stages>x<nodes per stage>" -> (generator, stages, nodes per stage)."""
    match = _NAME.match(name)
    if not match:
        raise GraphError(
            f"model {name!r}: an RWNN name reads "
            f"rwnn-<{'|'.join(GENERATORS)}>-<stages>x<nodes per stage>, e.g. rwnn-ws-3x32"
        )
    generator, stages, nodes = match["gen"], int(match["stages"]), int(match["nodes"])
    try:
        _check(generator, stages, nodes)
    except GraphError as exc:
        raise GraphError(f"model {name!r}: {exc}") from None
    return generator, stages, nodes


def build_rwnn_graph_from_name(name: str, *, seed: int = 0, dtype: str = "fp16") -> TaskGraph:
    generator, stages, nodes = parse_rwnn_name(name)
    return build_rwnn_graph(generator, stages, nodes, seed=seed, dtype=dtype)


def preset_descriptions() -> list[tuple[str, str]]:
    """(name, description) of the presets rwnn-{ws,er,ba}-3x{32,64,128,256}; any rwnn-G-SxN also works."""
    return [
        (
            f"rwnn-{gen}-{PRESET_STAGES}x{n}",
            f"randomly wired network ({desc}), {PRESET_STAGES} stages x {n} nodes, "
            f"C={DEFAULT_CHANNELS}, {DEFAULT_IMAGE_SIZE}x{DEFAULT_IMAGE_SIZE} input, wiring from --seed",
        )
        for gen, desc in GENERATORS.items()
        for n in PRESET_NODES
    ]
