"""What one engine iteration costs a stage whose group of k runs data-parallel attention with the
routed experts split over it (llm_planner.cost.dp_attention: vLLM's `--data-parallel-size k
--enable-expert-parallel`), and what each member holds, as llm_planner.serving.costs.StageCosts.

Each member is a data-parallel rank of 1/k of the stage's sequences: its decoder layers are the
kernels of cost.dp_attention (a dense first layer its own part alone); its end parts (embedding,
final norm, head) run whole on its own sequences, so their pieces are one device's with the
per-sequence slope divided by k (the time at b/k sequences); it holds every weight whole but the
routed experts, (E + R)/k replicas of them (R: EPLB's redundant experts, 0 without;
llm_planner.cost.eplb), the whole KV cache of 1/k of the sequences, and the workspace of its
own. A group over whole servers (ServerClass.spans_servers) gathers across their link. No
measured profile applies (profiles time tensor-parallel layers).
"""

from __future__ import annotations

from llm_planner.cost.dp_attention import dp_layer_kernels, member_weight_bytes
from llm_planner.cost.iteration import LayerKernels
from llm_planner.cost.roofline import group_task_time_pieces
from llm_planner.serving.classes import DP_ALL2ALL, ServerClass
from llm_planner.serving.costs import StageCosts, kernel_time, with_sequence_work
from llm_planner.serving.tasks import ServingTasks


def dp_stage_costs(tasks: ServingTasks, server_class: ServerClass, degree: int, attention: str = "dp") -> StageCosts:
    """The parts' costs on a group of `degree` devices of the class with data-parallel attention,
    moving tokens to the experts as `attention` says (classes.DP_ALL2ALL)."""
    kind = server_class.kind
    pieces, weights, workspace = {}, {}, {}
    for part, task in tasks.tasks.items():
        if part not in ("block", "dense"):  # timed by their kernels (below)
            whole = group_task_time_pieces(task, kind, 1, None, tasks.dtype)
            if part == "lm_head":  # the engine's work per sequence, on each rank's own sequences
                whole = with_sequence_work(whole, kind.serving_sequence_s)
            pieces[part] = tuple((fixed, slope / degree) for fixed, slope in whole)
        weights[part] = task.weight_bytes
        workspace[part] = task.workspace_bytes_per_sample / degree
    layers = {"block": tasks.config.moe_layer()} | ({"dense": tasks.config.dense_layer()} if tasks.dense_layers else {})
    for part, config in layers.items():
        redundant = (tasks.redundant_experts or 0) if part == "block" else 0
        weights[part] = member_weight_bytes(
            config, tasks.precision, kind, degree, tasks.tasks[part].weight_bytes, redundant
        )
    kernels = {part: _kernels(tasks, config, server_class, degree, attention) for part, config in layers.items()}
    times = {part: kernel_time(k, tasks, degree) for part, k in kernels.items()}
    pieces |= {part: t.pieces for part, t in times.items()}
    return StageCosts(
        server_class=server_class,
        degree=degree,
        pieces=pieces,
        weight_bytes=weights,
        kv_bytes_per_seq=tasks.tasks["block"].mem_bytes_per_sample / degree,
        workspace_bytes_per_seq=workspace,
        layer_time=times["block"],
        kernels=kernels["block"],
        tasks=tasks,
        dense_time=times.get("dense"),
        dense_kernels=kernels.get("dense"),
        attention=attention,
    )


def _kernels(tasks: ServingTasks, config, server_class: ServerClass, degree: int, attention: str) -> LayerKernels:
    """One layer's kernels on a member of the group (across servers where the group spans them)."""
    link, span, all2all = server_class.intra_link, server_class.span(degree), DP_ALL2ALL[attention]
    kind, imbalance = server_class.kind, tasks.imbalance_of(degree, attention)
    picks, redundant = (tasks.dp_picks, tasks.redundant_experts) if config.is_moe else (None, None)
    return dp_layer_kernels(config, tasks.precision, kind, degree, link, imbalance, span, all2all, picks, redundant)
