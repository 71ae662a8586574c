"""Partitioned fx graphs: a plan's assignment splits a GraphModule into stages.

A *stage* is a group of fx nodes on one device that runs as one submodule
(a GraphModule holding only the parameters its nodes use). Stages must form a
DAG, or two ranks would wait on each other; a device whose nodes would form a
cycle between ranks (A -> B -> A) gets several stages. The split:

    level(n) = max over inputs p of n:  level(p)       if device(p) == device(n)
                                        level(p) + 1   otherwise          (0 for sources)
    stage(n) = (device(n), level(n))

Every edge between two stages goes from a lower level to a higher one, so the
stages form a DAG; a rank that runs its stages in increasing level never waits
on a stage that waits on it (proof by induction on the level).

Placeholders are values the rank holding them provides (no stage); the output
node is assembled by the rank holding it. `get_attr` nodes are not tasks (see
llm_planner.graph.fx): each stage that reads one gets its own copy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Hashable

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node


class GraphPlanError(ValueError):
    """A plan whose tasks do not match the traced model."""


@dataclass(frozen=True, kw_only=True)
class GraphStage:
    owner: Hashable  # device (or rank) that runs the stage
    level: int
    nodes: tuple[str, ...]  # fx node names, in graph order (get_attr copies included)
    inputs: tuple[str, ...]  # values made elsewhere (other stages or placeholders)
    outputs: tuple[str, ...]  # values other stages or the output node read

    @property
    def name(self) -> str:
        return f"{self.owner}@{self.level}"


@dataclass(frozen=True, kw_only=True)
class GraphSplit:
    stages: tuple[GraphStage, ...]  # in increasing level
    placeholders: dict[str, Hashable]  # placeholder name -> owner
    output_owner: Hashable
    output_inputs: tuple[str, ...]  # values the output node reads
    producer: dict[str, Hashable]  # value name -> owner that makes it

    def consumers(self, value: str) -> set[Hashable]:
        """Owners that read `value` (stages and the output node)."""
        out = {s.owner for s in self.stages if value in s.inputs}
        if value in self.output_inputs:
            out.add(self.output_owner)
        return out


def check_assignment(gm: GraphModule, assignment: dict[str, Any], *, source: str) -> None:
    """Raise GraphPlanError unless the plan places every compute node of `gm` and nothing else."""
    names = {n.name for n in gm.graph.nodes if n.op != "get_attr"}
    required = {n.name for n in gm.graph.nodes if n.op not in ("get_attr", "placeholder", "output")}
    missing = sorted(required - set(assignment))
    unknown = sorted(set(assignment) - names)
    if missing or unknown:
        raise GraphPlanError(
            f"{source}: the plan does not match the traced model: {len(missing)} node(s) not placed {missing[:5]}, "
            f"{len(unknown)} task(s) not in the model {unknown[:5]}"
        )


def split_graph(gm: GraphModule, assignment: dict[str, Hashable]) -> GraphSplit:
    """Stages of `gm` under `assignment` (node name -> owner); see the module docstring."""
    nodes = list(gm.graph.nodes)
    owner: dict[str, Hashable] = {}
    level: dict[str, int] = {}
    for n in nodes:
        if n.op == "get_attr":
            continue
        ins = [p for p in n.all_input_nodes if p.op != "get_attr"]
        if n.name in assignment:
            owner[n.name] = assignment[n.name]
        elif n.op == "placeholder":  # not a task in the plan: give it to its first user
            first = next((u for u in n.users if u.name in assignment), None)
            owner[n.name] = assignment[first.name] if first is not None else next(iter(assignment.values()))
        elif n.op == "output":
            owner[n.name] = owner[ins[-1].name] if ins else next(iter(assignment.values()))
        else:
            raise GraphPlanError(f"fx node {n.name!r} is not placed by the plan")
        level[n.name] = max((level[p.name] + (owner[p.name] != owner[n.name]) for p in ins), default=0)
    out_node = next(n for n in nodes if n.op == "output")
    groups: dict[tuple[Hashable, int], list[Node]] = {}
    for n in nodes:
        if n.op not in ("get_attr", "placeholder", "output"):
            groups.setdefault((owner[n.name], level[n.name]), []).append(n)
    members = {n.name: key for key, group in groups.items() for n in group}
    stages = []
    for key, group in sorted(groups.items(), key=lambda kv: (kv[0][1], str(kv[0][0]))):
        stages.append(_stage(key, group, members, out_node))
    output_inputs = tuple(p.name for p in out_node.all_input_nodes if p.op != "get_attr")
    placeholders = {n.name: owner[n.name] for n in nodes if n.op == "placeholder"}
    producer = {name: key[0] for name, key in members.items()} | placeholders
    return GraphSplit(
        stages=tuple(stages),
        placeholders=placeholders,
        output_owner=owner[out_node.name],
        output_inputs=output_inputs,
        producer=producer,
    )


def _stage(key: tuple[Hashable, int], group: list[Node], members: dict[str, Any], out_node: Node) -> GraphStage:
    inside = {n.name for n in group}
    attrs: list[str] = []
    inputs: list[str] = []
    for n in group:
        for p in n.all_input_nodes:
            if p.op == "get_attr":
                attrs.append(p.name) if p.name not in attrs else None
            elif p.name not in inside and p.name not in inputs:
                inputs.append(p.name)
    outputs = [n.name for n in group if any(u.name not in inside or u is out_node for u in n.users)]
    order = {n.name: i for i, n in enumerate(out_node.graph.nodes)}
    names = sorted([*attrs, *inside], key=order.__getitem__)
    return GraphStage(owner=key[0], level=key[1], nodes=tuple(names), inputs=tuple(inputs), outputs=tuple(outputs))


def stage_module(gm: GraphModule, stage: GraphStage) -> GraphModule:
    """A GraphModule computing `stage`: forward(*inputs) -> tuple of outputs; holds only the parameters it uses."""
    by_name = {n.name: n for n in gm.graph.nodes}
    graph = Graph()
    env: dict[Node, Node] = {}
    for name in stage.inputs:
        env[by_name[name]] = graph.placeholder(name)
    for name in stage.nodes:
        env[by_name[name]] = graph.node_copy(by_name[name], lambda p: env[p])
    graph.output(tuple(env[by_name[name]] for name in stage.outputs))
    return GraphModule(gm, graph, class_name=f"Stage_{stage.level}")


class TimedInterpreter(Interpreter):
    """Runs a stage node by node, recording each node's time (synchronising CUDA when used)."""

    def __init__(self, module: GraphModule, times: dict[str, float], *, sync_cuda: bool = False):
        super().__init__(module, garbage_collect_values=True)
        self.times, self.sync_cuda = times, sync_cuda

    def run_node(self, n: Node) -> Any:
        if n.op in ("placeholder", "output", "get_attr"):
            return super().run_node(n)
        start = time.perf_counter()
        value = super().run_node(n)
        if self.sync_cuda:
            torch.cuda.synchronize()
        self.times[n.name] = self.times.get(n.name, 0.0) + time.perf_counter() - start
        return value


def run_split_locally(gm: GraphModule, split: GraphSplit, *inputs: Any) -> Any:
    """Run every stage in one process, in level order (the single-process check of a split)."""
    env = dict(zip(split.placeholders, inputs))
    for stage in split.stages:
        outs = stage_module(gm, stage)(*(env[name] for name in stage.inputs))
        env.update(zip(stage.outputs, outs))
    return assemble_output(output_template(gm), env)


@dataclass(frozen=True)
class ValueRef:
    """A reference to a node's value inside an output template."""

    name: str


def output_template(gm: GraphModule) -> Any:
    """The structure of gm's output with each node replaced by a ValueRef (keeps no reference to gm)."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    return _detach(out_node.args[0])


def _detach(arg: Any) -> Any:
    if isinstance(arg, Node):
        return ValueRef(arg.name)
    if isinstance(arg, (tuple, list)):
        return tuple(_detach(a) for a in arg) if isinstance(arg, tuple) else [_detach(a) for a in arg]
    if isinstance(arg, dict):
        return {k: _detach(v) for k, v in arg.items()}
    return arg


def assemble_output(template: Any, env: dict[str, Any]) -> Any:
    """Fill an output template with the values in `env`."""
    if isinstance(template, ValueRef):
        return env[template.name]
    if isinstance(template, tuple):
        return tuple(assemble_output(a, env) for a in template)
    if isinstance(template, list):
        return [assemble_output(a, env) for a in template]
    if isinstance(template, dict):
        return {k: assemble_output(v, env) for k, v in template.items()}
    return template


# ----------------------------------------------------------------------------
# Models by name


def build_graph_model(model: dict[str, Any]) -> tuple[GraphModule, torch.Tensor]:
    """The traced GraphModule and example input of a plan's CNN / RWNN model."""
    name = str(model.get("name", ""))
    seed = int(model.get("seed", 0))
    dtype = str(model.get("dtype", "fp32"))
    from llm_planner.graph import fx, rwnn

    if name in fx.RESNET_NAMES:
        _, gm, _, example = fx.build_resnet(name, seed, dtype=dtype)
        return gm, example
    if rwnn.is_rwnn_name(name):
        from llm_planner.graph import rwnn_torch

        _, gm, _, example = rwnn_torch.build_rwnn(name, seed, dtype=dtype)
        return gm, example
    raise GraphPlanError(f"model {name!r}: the runtime runs decoders, {', '.join(fx.RESNET_NAMES)} and rwnn-* models")


def make_batch(example: torch.Tensor, batch_size: int, seed: int) -> torch.Tensor:
    """The input batch of a run: `batch_size` samples shaped like `example`, from a fixed seed."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randn((batch_size, *example.shape[1:]), generator=generator, dtype=torch.float32).to(example.dtype)
