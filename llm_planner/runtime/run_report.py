"""The run report: what each rank measured, and the plan's prediction beside it.

Per rank (all times in seconds, measured with time.perf_counter):

    tasks        task name -> total time of its executions (all steps, shards)
    task_calls   task name -> how many times it ran
    transfers    [{peer, direction, count, bytes, seconds}] per peer and direction
    compute_s    sum of task times
    comm_s       time in transfers (posting sends, receiving arrived messages)
    idle_s       time waiting for a message that had not arrived, or for sends to finish
    total_s      wall time of the run on this rank (after the model was built)
    overhead_s   total_s - compute_s - comm_s - idle_s: the runtime's own work
    build_s      time to build the rank's share of the model (not in total_s)
    dtype        the torch dtype the rank computed in
    weights      decoders: where the parameters came from and how many tensors the rank read
    prefill_tasks, prefill_task_calls
                 decoders: the part of tasks / task_calls spent in step 0 (the prompt's prefill);
                 the rest are single-token decode steps
    step_end_s   decoders, ranks that run a shard's last stage: [step, seconds since the run's
                 start when this rank finished that step's last stage for every stream]
    batch_end_s  graphs: [batch, seconds since the run's start when this rank finished its last
                 unit of that batch] (the batch has ended when every rank has)

The report (JSON) holds "ranks" and, beside the plan's figure, the same
quantity measured (llm_planner.measure.observe.end_to_end):

    predicted_s    the plan's objective_s: one pass (graphs), one decode step or the
                   prefill (decoders) of the whole batch; seconds per sample for
                   throughput plans (graphs: the steady state's period between two
                   batches' ends, over the batch)
    measured_s     that quantity measured in this run (measured_what says which)
    unit           "s" (one pass / step) or "s/sample" (throughput plans)
    wall_s         the whole run's wall time (the slowest rank's total_s): every
                   generated token, or the forward pass
    overhead_fraction  sum of overhead_s over sum of total_s
    weights        where the parameters came from ("seeded random" or "checkpoint")
    gpu_fell_back_to_cpu  the GPU devices whose ranks ran on the CPU (absent if none)

and the workload's outputs: decoders "tokens" (the generated ids of each
request, in request order, cut after EOS), "batches" (batches in flight),
"streams" (batch, shard and requests of each), "tokens_per_s" (tokens generated
over wall_s) and, for throughput plans, "predicted_samples_per_s" and
"measured_samples_per_s" (steady state: one sample is one token of one request
per decode step); graphs "output" (shape, sha256, sum and first values of the
output tensor; the first batch's) and "output_path" (the tensor, saved with torch.save),
"batches" (the batches the run streamed: 1 for a latency plan, 2 pipeline_depth + 2 for a
throughput plan), "pipeline_depth" (the output's level in the stage split: a batch spans
pipeline_depth + 1 wavefront slots; llm_planner.runtime.graph_run), "plan_batches_in_flight"
(the count the plan's memory check counted), each rank's
"most_batches_held" (the most batches whose values it had sent and not yet seen taken,
counted after each unit) and, with more than one
batch, "last_batch_output" (the last batch's output summarised; the same input, so the
same tensor).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llm_planner.core.atomic import write_atomic
from llm_planner.measure.observe import end_to_end


@dataclass
class RankStats:
    rank: int
    device: str
    torch_device: str
    tasks: dict[str, float] = field(default_factory=dict)
    task_calls: dict[str, int] = field(default_factory=dict)
    prefill_tasks: dict[str, float] = field(default_factory=dict)  # decoders: step 0's share of tasks
    prefill_task_calls: dict[str, int] = field(default_factory=dict)
    step_end_s: dict[int, float] = field(default_factory=dict)  # decoders: step -> when its last stage finished here
    batch_end_s: dict[int, float] = field(default_factory=dict)  # graphs: batch -> when its last unit finished here
    build_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # workload facts, e.g. where the weights came from
    started: float = 0.0
    total_s: float = 0.0
    stopped: bool = False

    def on_task(self, name: str, seconds: float) -> None:
        self.tasks[name] = self.tasks.get(name, 0.0) + seconds
        self.task_calls[name] = self.task_calls.get(name, 0) + 1

    def on_prefill_task(self, name: str, seconds: float) -> None:
        self.on_task(name, seconds)
        self.prefill_tasks[name] = self.prefill_tasks.get(name, 0.0) + seconds
        self.prefill_task_calls[name] = self.prefill_task_calls.get(name, 0) + 1

    def on_step_end(self, step: int) -> None:
        self.step_end_s[step] = time.perf_counter() - self.started

    def on_batch_end(self, batch: int) -> None:
        self.batch_end_s[batch] = time.perf_counter() - self.started

    def start(self) -> None:
        self.started = time.perf_counter()

    def stop(self) -> None:
        """End the measured run; a later call keeps the first end (a workload stops the clock before gathering
        outputs)."""
        if not self.stopped:
            self.total_s = time.perf_counter() - self.started
            self.stopped = True

    def to_dict(self, comm_stats) -> dict[str, Any]:
        compute = sum(self.tasks.values())
        return {
            "rank": self.rank,
            "device": self.device,
            "torch_device": self.torch_device,
            "tasks": dict(self.tasks),
            "task_calls": dict(self.task_calls),
            "transfers": comm_stats.transfers(),
            "compute_s": compute,
            "comm_s": comm_stats.transfer_s,
            "idle_s": comm_stats.idle_s,
            "total_s": self.total_s,
            "overhead_s": max(0.0, self.total_s - compute - comm_stats.transfer_s - comm_stats.idle_s),
            "build_s": self.build_s,
            **(
                {"prefill_tasks": dict(self.prefill_tasks), "prefill_task_calls": dict(self.prefill_task_calls)}
                if self.prefill_tasks
                else {}
            ),
            **({"step_end_s": [[k, v] for k, v in sorted(self.step_end_s.items())]} if self.step_end_s else {}),
            **({"batch_end_s": [[k, v] for k, v in sorted(self.batch_end_s.items())]} if self.batch_end_s else {}),
            **self.extra,
        }


def tensor_summary(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().to("cpu").contiguous()
    flat = t.reshape(-1).to(torch.float64)
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "sha256": hashlib.sha256(t.numpy().tobytes()).hexdigest(),
        "sum": float(flat.sum()),
        "first": [float(v) for v in flat[:8]],
    }


def build_report(*, plan, ranks: list[dict[str, Any]], workload: str, outputs: dict[str, Any]) -> dict[str, Any]:

    wall = max(r["total_s"] for r in ranks)
    total = sum(r["total_s"] for r in ranks)
    report = {"workload": workload, "objective": plan.objective, "wall_s": wall, **outputs, "ranks": ranks}
    measured, what = end_to_end(plan, report, "the run report")
    head = {
        "status": "ok",
        "workload": workload,
        "objective": plan.objective,
        "predicted_s": plan.objective_s,
        "measured_s": measured,
        "measured_what": what,
        "unit": "s/sample" if plan.objective == "throughput" else "s",
        "wall_s": wall,
        "overhead_fraction": (sum(r["overhead_s"] for r in ranks) / total) if total > 0 else 0.0,
        "weights": "checkpoint"
        if any(r.get("weights", {}).get("source") == "checkpoint" for r in ranks)
        else "seeded random",
    }
    fell_back = [r["device"] for r in ranks if r.get("gpu_fell_back_to_cpu")]
    if fell_back:
        head["gpu_fell_back_to_cpu"] = fell_back
    if "tokens" in outputs and wall > 0:
        head["tokens_per_s"] = sum(len(t) for t in outputs["tokens"]) / wall
    if plan.objective == "throughput" and measured > 0:
        head["predicted_samples_per_s"] = 1.0 / plan.objective_s if plan.objective_s > 0 else None
        head["measured_samples_per_s"] = 1.0 / measured
    return {**head, **outputs, "ranks": ranks}


def write_report(path: str | Path, report: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(report, indent=1) + "\n")
