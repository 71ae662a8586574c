"""A plan as the parallel configuration of a serving or training framework, when it has that form.

vLLM and Megatron-LM describe a layout by three sizes: tensor parallel t (the devices
of one stage, splitting every layer), pipeline parallel p (stages, each a contiguous
run of layers) and data parallel r (replicas of the pipeline, the batch split over
them), plus, for uneven pipelines, the layers of each stage. A plan has that form
when every shard runs on its own p stages, each stage one device or group of the
same degree t, each stage's tasks a contiguous run of the model in order (embed on
the first, lm_head on the last), and every replica cuts the layers the same way.
Anything else (a stage a task leaves and re-enters, stages of different degrees,
replicas cut differently, two shards on one stage) cannot be written in those
terms, and `export_plan` says which rule the plan breaks.

Written fields:
- vllm: tensor_parallel_size, pipeline_parallel_size, data_parallel_size,
  pp_layer_partition (vLLM reads it from the VLLM_PP_LAYER_PARTITION environment
  variable: layers per stage, comma-separated), and each replica's devices;
- megatron: tensor_model_parallel_size, pipeline_model_parallel_size,
  data_parallel_size, num_layers_per_stage (Megatron's uneven split is given by
  decoder_first/last_pipeline_num_layers: written when only the ends differ), and
  each replica's devices.
"""

from __future__ import annotations

from typing import Any

from llm_planner.core.plan import Plan
from llm_planner.core.tensor_groups import member_names

FRAMEWORKS = ("vllm", "megatron")


class ExportError(ValueError):
    """A plan that the framework's configuration cannot express; the message says why."""


def _stages(plan: Plan, shard: int, topo: list[str]) -> list[tuple[str, list[str]]]:
    """(device, its tasks in model order) for each stage of one shard, in model order; ExportError
    when a stage's tasks are not one contiguous run."""
    assignment = plan.shard_assignments[shard]
    stages: list[tuple[str, list[str]]] = []
    for task in topo:
        device = assignment[task]
        if stages and stages[-1][0] == device:
            stages[-1][1].append(task)
        elif any(d == device for d, _ in stages):
            raise ExportError(
                f"shard {shard}: device {device!r} runs {task!r} after leaving it for another stage: "
                "a pipeline stage must be one contiguous run of layers"
            )
        else:
            stages.append((device, [task]))
    return stages


def _layers(tasks: list[str], layer_of: dict[str, int | None]) -> int:
    return len({layer_of[t] for t in tasks if layer_of.get(t) is not None})


def regular_form(plan: Plan, topo: list[str], layer_of: dict[str, int | None]) -> dict[str, Any]:
    """t, p, r, layers per stage and the replicas' devices; ExportError naming the rule broken."""
    replicas = [_stages(plan, s, topo) for s in range(len(plan.shard_sizes))]
    degrees = {len(member_names(d)) for stages in replicas for d, _ in stages}
    if len(degrees) != 1:
        raise ExportError(
            f"stages of different tensor-parallel degrees {sorted(degrees)}: the frameworks use one degree everywhere"
        )
    splits = {tuple(_layers(tasks, layer_of) for _, tasks in stages) for stages in replicas}
    if len(splits) != 1:
        raise ExportError(
            f"the replicas cut the layers differently ({sorted(splits)}): "
            "every replica must use the same pipeline split"
        )
    used = [d for stages in replicas for d, _ in stages]
    if len(set(used)) != len(used):
        raise ExportError(
            "two shards share a stage's devices (a pipeline of micro-batches or shared replicas); "
            "the frameworks give each replica its own devices"
        )
    split = splits.pop()
    return {
        "tensor_parallel": degrees.pop(),
        "pipeline_parallel": len(split),
        "data_parallel": len(replicas),
        "layers_per_stage": list(split),
        "batch_per_replica": list(plan.shard_sizes),
        "replicas": [[member_names(d) for d, _ in stages] for stages in replicas],
    }


def export_plan(
    plan: Plan,
    framework: str,
    topo: list[str],
    layer_of: dict[str, int | None],
    cpu_devices: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The framework's configuration of the plan (module docstring); ExportError if it has no such form,
    among them a stage on one of `cpu_devices` (the frameworks run GPU stages only)."""
    if framework not in FRAMEWORKS:
        raise ExportError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    form = regular_form(plan, topo, layer_of)
    on_cpu = [d for stages in form["replicas"] for stage in stages for d in stage if d in cpu_devices]
    if on_cpu:
        raise ExportError(
            f"a stage runs on CPU device {on_cpu[0]}: the frameworks run GPU stages only "
            "(plan on a cluster spec without the CPU devices)"
        )
    if framework == "vllm":
        return {
            "tensor_parallel_size": form["tensor_parallel"],
            "pipeline_parallel_size": form["pipeline_parallel"],
            "data_parallel_size": form["data_parallel"],
            "pp_layer_partition": ",".join(map(str, form["layers_per_stage"])),
            "batch_per_replica": form["batch_per_replica"],
            "replicas": form["replicas"],
        }
    return _megatron(form)


def _megatron(form: dict[str, Any]) -> dict[str, Any]:
    """Megatron gives every data-parallel replica the same batch, and every pipeline stage the
    same layers but for the first and the last."""
    if len(set(form["batch_per_replica"])) > 1:
        raise ExportError(
            f"the replicas get different batches {form['batch_per_replica']}; Megatron's data parallelism "
            "gives each the same (vLLM's does not: try --export vllm)"
        )
    split = form["layers_per_stage"]
    out = {
        "tensor_model_parallel_size": form["tensor_parallel"],
        "pipeline_model_parallel_size": form["pipeline_parallel"],
        "data_parallel_size": form["data_parallel"],
        "num_layers_per_stage": split,
        "replicas": form["replicas"],
    }
    middle = split[1:-1] if len(split) > 2 else []
    if len(set(middle)) > 1:
        raise ExportError(
            f"layers per stage {split}: Megatron splits the layers evenly but for the first and last stage"
        )
    if len(set(split)) > 1:
        if len(split) == 2:
            raise ExportError(
                f"layers per stage {split}: Megatron's two stages take the same number of layers unless "
                "the first or last is set, which needs a third stage between them"
            )
        out.update(decoder_first_pipeline_num_layers=split[0], decoder_last_pipeline_num_layers=split[-1])
    return out
