"""The runnable randomly wired network: an nn.Module built from llm_planner.graph.rwnn's wiring.

Every task of the analytic graph is one submodule registered on the network
under the task's name (s0_in, s0_n5, s0_out, head), so tracing with those
classes as fx leaves gives fx node names equal to the analytic task names, and
a plan made on the analytic graph partitions this module's GraphModule. The
same seed gives the same wiring (rwnn.stage_dag) here and there.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import GraphModule

from llm_planner.graph import fx, rwnn
from llm_planner.graph.ir import TaskGraph


class RwnnStem(nn.Module):
    """3x3 conv stride 2 - BN - ReLU - 3x3 conv stride 2 - BN (the paper's conv1 and conv2)."""

    def __init__(self, mid_channels: int, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, mid_channels, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid_channels)
        self.conv2 = nn.Conv2d(mid_channels, channels, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(images)))))


class RwnnStageInput(nn.Module):
    """ReLU - 3x3 conv stride 2 - BN: the stage's down-sampling entry."""

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(torch.relu(x)))


class RwnnNode(nn.Module):
    """One random-graph node: sum_i sigmoid(w_i) x_i, then ReLU - separable 3x3 conv - BN."""

    def __init__(self, channels: int, num_inputs: int):
        super().__init__()
        self.agg_weight = nn.Parameter(torch.zeros(num_inputs))
        self.depthwise = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels, bias=False)
        self.pointwise = nn.Conv2d(channels, channels, kernel_size=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        w = torch.sigmoid(self.agg_weight)
        x = inputs[0] * w[0]
        for i in range(1, len(inputs)):
            x = x + inputs[i] * w[i]
        return self.bn(self.pointwise(self.depthwise(torch.relu(x))))


class RwnnStageOutput(nn.Module):
    """Mean of the stage's sink nodes."""

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        x = inputs[0]
        for t in inputs[1:]:
            x = x + t
        return x / len(inputs)


class RwnnHead(nn.Module):
    """Global average pool - linear classifier."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


LEAF_MODULES = (RwnnStem, RwnnStageInput, RwnnNode, RwnnStageOutput, RwnnHead)


class RandomlyWiredNetwork(nn.Module):
    """images [B, 3, H, W] -> logits [B, num_classes], wired by rwnn.stage_dag(generator, n, seed, stage)."""

    def __init__(
        self,
        generator: str,
        num_stages: int,
        nodes_per_stage: int,
        seed: int,
        channels: int = rwnn.DEFAULT_CHANNELS,
        num_classes: int = rwnn.DEFAULT_NUM_CLASSES,
    ):
        super().__init__()
        # Spatial sizes do not change the module; any image size works.
        shapes = rwnn.stage_shapes(num_stages, channels, image_size=1)
        stem = rwnn.stem_shape(channels, image_size=1)
        self.add_module(rwnn.STEM_NAME, RwnnStem(stem.mid_channels, stem.channels))
        self.num_stages = num_stages
        self.preds: list[list[list[int]]] = []  # [stage][node] -> predecessor nodes, sorted
        self.sinks: list[list[int]] = []  # [stage] -> nodes with no successor, sorted
        for s, shape in enumerate(shapes):
            dag = rwnn.stage_dag(generator, nodes_per_stage, seed=seed, stage=s)
            self.add_module(rwnn.stage_input_name(s), RwnnStageInput(shape.in_channels, shape.channels))
            preds = [sorted(dag.predecessors(j)) for j in range(nodes_per_stage)]
            for j, p in enumerate(preds):
                self.add_module(rwnn.node_name(s, j), RwnnNode(shape.channels, max(1, len(p))))
            self.add_module(rwnn.stage_output_name(s), RwnnStageOutput())
            self.preds.append(preds)
            self.sinks.append([j for j in range(nodes_per_stage) if dag.out_degree(j) == 0])
        self.add_module(rwnn.HEAD_NAME, RwnnHead(shapes[-1].channels, num_classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = getattr(self, rwnn.STEM_NAME)(images)
        for s in range(self.num_stages):
            stage_in = getattr(self, rwnn.stage_input_name(s))(x)
            outs: list[torch.Tensor] = []
            for j, preds in enumerate(self.preds[s]):
                inputs = [outs[i] for i in preds] if preds else [stage_in]
                outs.append(getattr(self, rwnn.node_name(s, j))(inputs))
            x = getattr(self, rwnn.stage_output_name(s))([outs[j] for j in self.sinks[s]])
        return getattr(self, rwnn.HEAD_NAME)(x)


def build_rwnn(
    name: str,
    seed: int = 0,
    channels: int = rwnn.DEFAULT_CHANNELS,
    image_size: int = rwnn.DEFAULT_IMAGE_SIZE,
    *,
    dtype: str = "fp16",
    num_classes: int = rwnn.DEFAULT_NUM_CLASSES,
) -> tuple[RandomlyWiredNetwork, GraphModule, TaskGraph, torch.Tensor]:
    """An RWNN preset name ("rwnn-ws-3x32") -> (module in eval mode, GraphModule, traced task graph, 1x3xHxW input).

    Weights and the example input come from torch.manual_seed(seed) inside a
    forked RNG (the global torch RNG is left untouched); the wiring from `seed`.
    """
    generator, num_stages, nodes = rwnn.parse_rwnn_name(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = RandomlyWiredNetwork(
            generator, num_stages, nodes, seed, channels=channels, num_classes=num_classes
        ).eval()
        example = torch.randn(1, 3, image_size, image_size)
    gm, graph = fx.trace_module(module, (example,), name=name, dtype=dtype, leaf_modules=LEAF_MODULES)
    return module, gm, graph, example
