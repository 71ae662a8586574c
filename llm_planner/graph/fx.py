"""torch.fx graph builder: an nn.Module -> (GraphModule, TaskGraph), one task per fx node.

The task graph mirrors the traced GraphModule node for node, and task names are
the fx node names exactly, so the MPI runtime can partition the GraphModule by
the names in a plan. What each fx node becomes:

- `placeholder` -> a task of kind "input"; `output` -> a task of kind "output".
  Both do no work: 0 FLOPs and 0 activation bytes (their tensors are charged to
  the edges that leave or enter them).
- `call_module` -> kind = the submodule's class name ("Conv2d", "BatchNorm2d");
  `call_function` -> the function's name ("add", "relu"); `call_method` -> the
  method name ("flatten").
- `get_attr` nodes (parameters or buffers read directly in `forward`) are not
  tasks: they are folded into their users, whose weight_bytes include the
  tensor. A runtime that partitions the GraphModule must give each rank the
  get_attr nodes its tasks read.
- Calls of `nn.Identity` are removed from the GraphModule before measuring
  (their users read the Identity's input instead); they would be tasks that do
  nothing.

Numbers, measured by running the GraphModule once on the example inputs with an
fx Interpreter, each node under its own torch.utils.flop_counter.FlopCounterMode,
then divided by the batch size (dim 0 of the first tensor input):

    flops_per_sample   FLOPs of the node as FlopCounterMode counts them: 2 per
                       multiply-add of convolutions, matmuls and linear layers;
                       elementwise ops (BN in eval, ReLU, add, pooling) count 0
                       and are charged by the roofline through their bytes.
    bytes_per_sample   bytes of the node's tensor inputs + its outputs
                       (activations; views are counted as if copied).
    weight_bytes       parameters + buffers of the called submodule
                       (call_module), plus get_attr tensors the node reads.
    edge bytes         bytes of the producing node's output tensor(s).

Byte counts use the requested dtype for floating-point tensors (fp16: 2 bytes
per element, whatever dtype the module ran in); integer tensors keep their own
element size (BatchNorm's int64 `num_batches_tracked` counts 8 bytes).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Iterable

import torch
from torch import nn
from torch.fx import GraphModule, Interpreter, Node, Tracer
from torch.utils.flop_counter import FlopCounterMode

from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.graph.ir import Edge, GraphError, Task, TaskGraph

log = logging.getLogger(__name__)

RESNET_NAMES = ("resnet18", "resnet50")
RESNET_IMAGE_SIZE = 224
RESNET_NUM_CLASSES = 1000


class _LeafTracer(Tracer):
    """The default fx tracer, plus: instances of `leaf_classes` are not traced into."""

    def __init__(self, leaf_classes: tuple[type, ...]):
        super().__init__()
        self.leaf_classes = leaf_classes

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, self.leaf_classes) or super().is_leaf_module(m, module_qualified_name)


class _MeasuringInterpreter(Interpreter):
    """Runs the GraphModule, recording each node's FLOPs and output bytes."""

    def __init__(self, gm: GraphModule, elem_bytes: int):
        super().__init__(gm)
        self.elem_bytes = elem_bytes
        self.flops: dict[str, int] = {}
        self.out_bytes: dict[str, float] = {}

    def run_node(self, n: Node) -> Any:
        with FlopCounterMode(display=False) as counter:
            result = super().run_node(n)
        self.flops[n.name] = counter.get_total_flops()
        self.out_bytes[n.name] = _tensor_bytes(result, self.elem_bytes)
        return result


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _tensor_bytes(value: Any, elem_bytes: int) -> float:
    """Bytes of every tensor in `value`, floating-point ones at `elem_bytes` per element."""
    return float(sum(t.numel() * (elem_bytes if t.is_floating_point() else t.element_size()) for t in _tensors(value)))


def _module_bytes(module: nn.Module, elem_bytes: int) -> float:
    unique = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return _tensor_bytes(list(unique.values()), elem_bytes)


def _fetch_attr(gm: GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _kind(gm: GraphModule, n: Node) -> str:
    if n.op == "placeholder":
        return "input"
    if n.op == "output":
        return "output"
    if n.op == "call_module":
        return type(gm.get_submodule(str(n.target))).__name__
    if n.op == "call_function":
        return getattr(n.target, "__name__", "function")
    return str(n.target)


def _target_label(n: Node) -> str:
    """A deterministic string for the node's target (no memory addresses)."""
    if n.op == "call_function":
        fn = n.target
        module = getattr(fn, "__module__", None) or ""
        return f"{module}.{getattr(fn, '__name__', 'function')}".lstrip(".")
    return str(n.target)


def _drop_identities(gm: GraphModule) -> int:
    """Remove calls of nn.Identity (users read the Identity's input). Returns how many."""
    dropped = 0
    for n in list(gm.graph.nodes):
        if n.op == "call_module" and isinstance(gm.get_submodule(str(n.target)), nn.Identity):
            if len(n.args) == 1 and not n.kwargs and isinstance(n.args[0], Node):
                n.replace_all_uses_with(n.args[0])
                gm.graph.erase_node(n)
                dropped += 1
    if dropped:
        gm.graph.lint()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return dropped


def _batch_size(example_inputs: tuple) -> int:
    for t in _tensors(list(example_inputs)):
        return int(t.shape[0]) if t.dim() > 0 and t.shape[0] > 0 else 1
    return 1


def trace_module(
    module: nn.Module,
    example_inputs: tuple,
    *,
    name: str,
    dtype: str = "fp32",
    leaf_modules: Iterable[type] = (),
) -> tuple[GraphModule, TaskGraph]:
    """Trace `module` with torch.fx and measure one task per fx node (see the module docstring).

    `leaf_modules` are classes the tracer keeps whole (one task per call), e.g.
    submodules with data-dependent control flow. The module runs once on
    `example_inputs` under torch.no_grad(); put it in eval mode first if that
    matters. Raises GraphError when tracing fails or the dtype is unknown.
    """
    if dtype not in DTYPE_BYTES:
        raise GraphError(f"model {name!r}: unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
    if not isinstance(example_inputs, tuple):
        raise GraphError(
            f"model {name!r}: example_inputs must be a tuple of positional inputs, got {type(example_inputs).__name__}"
        )
    if module.training:
        log.warning(
            "model %r is in training mode: measuring runs it once, which updates BatchNorm running statistics", name
        )
    tracer = _LeafTracer(tuple(leaf_modules))
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # fx raises TraceError, TypeError, AttributeError, ... from user code
        raise GraphError(
            f"model {name!r}: torch.fx cannot trace it ({type(exc).__name__}: {exc}); "
            "pass the submodule classes that fail as leaf_modules"
        ) from exc
    gm = GraphModule(tracer.root, graph, class_name=type(module).__name__)
    dropped = _drop_identities(gm)
    elem_bytes = DTYPE_BYTES[dtype]
    measure = _MeasuringInterpreter(gm, elem_bytes)
    with torch.no_grad():
        measure.run(*example_inputs)
    batch = _batch_size(example_inputs)
    task_graph = _task_graph(gm, measure, name=name, dtype=dtype, batch=batch)
    log.info(
        "traced %s: %d fx nodes, %d tasks (%d Identity calls dropped)",
        name,
        len(gm.graph.nodes),
        task_graph.num_tasks,
        dropped,
    )
    return gm, task_graph


def _task_graph(gm: GraphModule, measure: _MeasuringInterpreter, *, name: str, dtype: str, batch: int) -> TaskGraph:
    nodes = list(gm.graph.nodes)
    attr_bytes = {
        n.name: _tensor_bytes(_fetch_attr(gm, str(n.target)), measure.elem_bytes) for n in nodes if n.op == "get_attr"
    }
    tasks, edges = [], []
    for n in nodes:
        if n.op == "get_attr":
            continue
        inputs = [p for p in n.all_input_nodes if p.op != "get_attr"]
        weights = sum(attr_bytes[p.name] for p in n.all_input_nodes if p.op == "get_attr")
        if n.op == "call_module":
            weights += _module_bytes(gm.get_submodule(str(n.target)), measure.elem_bytes)
        if n.op in ("placeholder", "output"):
            flops, act = 0.0, 0.0
        else:
            flops = measure.flops[n.name] / batch
            act = (sum(measure.out_bytes[p.name] for p in inputs) + measure.out_bytes[n.name]) / batch
        tasks.append(
            Task(
                name=n.name,
                kind=_kind(gm, n),
                flops_per_sample=float(flops),
                bytes_per_sample=float(act),
                weight_bytes=float(weights),
                labels=(("fx_op", n.op), ("fx_target", _target_label(n))),
            )
        )
        edges += [Edge(src=p.name, dst=n.name, bytes_per_sample=measure.out_bytes[p.name] / batch) for p in inputs]
    meta = (("builder", "fx"), ("dtype", dtype), ("batch_size", batch))
    return TaskGraph(name=name, tasks=tuple(tasks), edges=tuple(edges), meta=meta).validate()


# ----------------------------------------------------------------------------
# ResNet from transformers


class ResNetLogits(nn.Module):
    """Pixel values -> logits of a transformers ResNetForImageClassification, in a traceable form.

    The HF forward checks the channel count and builds output dataclasses, which
    fx cannot trace; this calls the same submodules (shared, not copied) in the
    same order.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.resnet = model.resnet
        self.classifier = model.classifier

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.resnet.embedder.embedder(pixel_values)
        x = self.resnet.embedder.pooler(x)
        for stage in self.resnet.encoder.stages:
            x = stage(x)
        x = self.resnet.pooler(x)
        return self.classifier(x)


def resnet_config(name: str) -> Any:
    """The transformers ResNetConfig of a preset (ImageNet: 1000 classes)."""
    from transformers import ResNetConfig

    if name == "resnet18":
        return ResNetConfig(
            layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], num_labels=RESNET_NUM_CLASSES
        )
    if name == "resnet50":
        return ResNetConfig(num_labels=RESNET_NUM_CLASSES)
    raise GraphError(f"unknown ResNet {name!r} (known: {', '.join(RESNET_NAMES)})")


def build_resnet(
    name: str, seed: int = 0, *, dtype: str = "fp32"
) -> tuple[nn.Module, GraphModule, TaskGraph, torch.Tensor]:
    """A randomly initialised ResNet ("resnet18" or "resnet50"), traced.

    Returns (model, gm, graph, example_input): `model` is the transformers
    ResNetForImageClassification in eval mode (its output's `.logits`), `gm` the
    traced GraphModule (pixel values -> logits tensor), `graph` its task graph
    (byte counts in `dtype`) and `example_input` a 1x3x224x224 tensor. Nothing
    is downloaded; the global torch RNG is left untouched.
    """
    from transformers import ResNetForImageClassification

    config = resnet_config(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ResNetForImageClassification(config).eval()
        example = torch.randn(1, config.num_channels, RESNET_IMAGE_SIZE, RESNET_IMAGE_SIZE)
    gm, graph = trace_module(ResNetLogits(model).eval(), (example,), name=name, dtype=dtype)
    meta = (*graph.meta, ("model", name), ("input_shape", list(example.shape)))  # the seed changes weights only
    return model, gm, TaskGraph(name=name, tasks=graph.tasks, edges=graph.edges, meta=meta), example


@functools.lru_cache(maxsize=8)  # deterministic (seeded) and immutable: trace once per process
def build_resnet_graph(name: str, dtype: str = "fp16") -> TaskGraph:
    """The task graph of a ResNet preset (one task per conv / BN / activation / add)."""
    if name not in RESNET_NAMES:
        raise GraphError(f"unknown ResNet {name!r} (known: {', '.join(RESNET_NAMES)})")
    return build_resnet(name, seed=0, dtype=dtype)[2]
