"""What a run measured, lined up with what its plan asked for: the input of `measure` and `calibrate`.

A run report (llm_planner/runtime/run_report.py) sums each rank's task times over
every call; the plan predicts one pass. This module turns a report into
observations the cost model can be compared with, call by call:

- graph runs (CNN / RWNN, a forward pass per batch): a task runs once per
  data-parallel shard and batch on the device the shard's assignment names, for
  that shard's samples;
- decoder runs (greedy generation): a task runs once per generated token for
  every micro-batch (*stream*) of its shard, for that stream's requests. Step 0
  is the prefill of the prompt, the other steps decode one token each. A plan
  made for `phase: decode` is compared with the decode steps only, a
  `phase: prefill` plan with step 0 only.

So every (device, task) the run timed gives a TaskObservation: the measured
seconds of the calls compared, and the batch of each call. Transfers are the
receiving rank's time in `Recv` of messages that had arrived (waiting for a
message is idle time, not transfer time), per (sender, receiver) device pair.

End to end: graph latency plans compare the slowest rank's wall time of the
pass, graph throughput plans the period between the ends of the batches the
run streamed (`batches`, each rank's `batch_end_s`); decoders compare the time
of one decode step (the last step's end minus the first step's end, over the
decode steps) or, for prefill plans, the first step's end. Throughput plans
divide by the samples of a batch (requests of a step for decoders). Every error names the report file and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llm_planner.core.plan import Plan

WORKLOADS = ("graph", "decoder")
TORCH_TO_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


class MeasureError(ValueError):
    """A run report that cannot be compared with its plan; the message names the file and field."""


@dataclass(frozen=True, kw_only=True)
class TaskObservation:
    device: str
    task: str
    calls: tuple[tuple[int, int], ...]  # (samples per call, number of such calls) of the calls compared
    measured_s: float  # total measured time of those calls

    @property
    def num_calls(self) -> int:
        return sum(n for _, n in self.calls)


@dataclass(frozen=True, kw_only=True)
class TransferObservation:
    src: str  # sending device
    dst: str  # receiving device
    messages: int
    num_bytes: int
    measured_s: float  # the receiver's time in Recv of arrived messages


@dataclass(frozen=True, kw_only=True)
class RunObservations:
    source: str  # the report file
    workload: str  # "graph" | "decoder"
    phase: str  # "forward" (graphs), "decode" or "prefill" (decoders): which calls are compared
    passes: int  # passes of the plan the compared calls make up (decode steps counted, else the batches run)
    dtype: str  # the run's compute dtype as a cost-model name (fp32, fp16, bf16)
    tasks: tuple[TaskObservation, ...]
    unmeasured: tuple[tuple[str, str], ...]  # (device, task) the plan places but the runtime does not time
    transfers: tuple[TransferObservation, ...]
    end_to_end_s: float
    end_to_end_what: str


def _get(data: Any, key: str, source: str, where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise MeasureError(f"{source}: {where}{key}: missing required field")
    return data[key]


MOST_WALL_S = 86400.0  # a run report's forward pass: a day at most


def _number(value: Any, source: str, where: str, *, integer: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if ok and integer and value != int(value):
        ok = False
    if not ok:
        raise MeasureError(f"{source}: {where}: expected a {'whole ' if integer else ''}number >= 0, got {value!r}")
    return int(value) if integer else float(value)


def _mapping(value: Any, source: str, where: str, *, integer: bool = False) -> dict[str, float]:
    if not isinstance(value, dict):
        raise MeasureError(f"{source}: {where}: expected a mapping of task name to number, got {type(value).__name__}")
    return {str(k): _number(v, source, f"{where}.{k}", integer=integer) for k, v in value.items()}


def read_observations(plan: Plan, report: Any, source: str) -> RunObservations:
    """Line the report up with the plan's calls; MeasureError names the field that does not fit."""
    if not isinstance(report, dict):
        raise MeasureError(f"{source}: not a run report (expected a JSON object with 'ranks')")
    workload = _get(report, "workload", source, "")
    if workload not in WORKLOADS:
        raise MeasureError(f"{source}: workload: expected one of {WORKLOADS}, got {workload!r}")
    ranks = _get(report, "ranks", source, "")
    if not isinstance(ranks, list) or not ranks:
        raise MeasureError(f"{source}: ranks: expected a non-empty list")
    device_of: dict[int, str] = {}
    for r, entry in enumerate(ranks):
        device = _plan_device(entry, source, r)
        if device not in plan.devices_used():
            raise MeasureError(
                f"{source}: ranks[{r}].plan_device: {device!r} is not a device the plan uses {plan.devices_used()}"
            )
        rank = _number(_get(entry, "rank", source, f"ranks[{r}]."), source, f"ranks[{r}].rank", integer=True)
        if rank in device_of:  # a second entry of one rank: which of the two ran is not known
            raise MeasureError(f"{source}: ranks[{r}].rank: rank {rank} is listed twice")
        device_of[rank] = device
    if workload == "graph":
        passes = _graph_batches(report, source)
        phase, calls = "forward", _graph_calls(plan, passes)
    else:
        phase, passes, calls = _decoder_calls(plan, report, source)
    leaders = _leaders(ranks, source)
    tasks, unmeasured = _task_observations(leaders, calls, phase, source)
    dtype = TORCH_TO_DTYPE.get(str(ranks[0].get("dtype", "")), plan.inputs.dtype)
    if dtype == "fp32" and plan.inputs.dtype == "tf32":
        dtype = "tf32"
    e2e, what = end_to_end(plan, report, source)
    return RunObservations(
        source=source,
        workload=workload,
        phase=phase,
        passes=passes,
        dtype=dtype,
        tasks=tasks,
        unmeasured=unmeasured,
        transfers=_transfers(leaders, device_of, source),
        end_to_end_s=e2e,
        end_to_end_what=what,
    )


Calls = dict[tuple[str, str], list[tuple[int, int]]]


def _plan_device(entry: Any, source: str, r: int) -> str:
    """The plan's device a rank served: its group's name for a tensor-parallel member, else its device."""
    device = _get(entry, "device", source, f"ranks[{r}].")
    return str(entry.get("plan_device") or device)


def _leaders(ranks: list, source: str) -> list:
    """One rank per plan device: a group's first member (each member times the group's tasks alike)."""
    seen: dict[str, Any] = {}
    for r, entry in enumerate(ranks):
        seen.setdefault(_plan_device(entry, source, r), dict(entry, device=_plan_device(entry, source, r)))
    return list(seen.values())


def _graph_calls(plan: Plan, batches: int) -> Calls:
    calls: Calls = {}
    for size, assignment in zip(plan.shard_sizes, plan.shard_assignments):
        for task, device in assignment.items():
            calls.setdefault((device, task), []).append((int(size), batches))
    return calls


def _graph_batches(report: dict, source: str) -> int:
    """The batches a graph run ran (`batches`; 1 where a report predates the field), each one pass."""
    batches = report.get("batches", 1)
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise MeasureError(f"{source}: batches: expected the batches the run ran, an integer >= 1, got {batches!r}")
    return batches


def _decoder_calls(plan: Plan, report: dict, source: str) -> tuple[str, int, Calls]:
    phase = str(plan.inputs.model.get("phase", "decode"))
    steps = _number(_get(report, "max_new_tokens", source, ""), source, "max_new_tokens", integer=True)
    if phase == "decode" and steps < 2:
        raise MeasureError(
            f"{source}: max_new_tokens: {steps}; a decode-phase plan is compared with decode steps, "
            "so the run needs at least 2 new tokens"
        )
    counted = steps - 1 if phase == "decode" else 1
    streams = _get(report, "streams", source, "")
    if not isinstance(streams, list) or not streams:
        raise MeasureError(f"{source}: streams: expected a non-empty list of {{shard, requests}}")
    calls: Calls = {}
    for j, stream in enumerate(streams):
        shard = _number(_get(stream, "shard", source, f"streams[{j}]."), source, f"streams[{j}].shard", integer=True)
        requests = _get(stream, "requests", source, f"streams[{j}].")
        if shard >= len(plan.shard_assignments) or not isinstance(requests, list) or not requests:
            raise MeasureError(
                f"{source}: streams[{j}]: shard {shard} with requests {requests!r} does not fit the plan's "
                f"{len(plan.shard_assignments)} shard(s)"
            )
        for task, device in plan.shard_assignments[shard].items():
            calls.setdefault((device, task), []).append((len(requests), counted))
    batches = int(report.get("batches", 1)) if isinstance(report.get("batches", 1), int) else 1
    return phase, counted * max(1, batches), calls  # passes: each batch in flight makes one per step


def _task_observations(ranks: list, calls: Calls, phase: str, source: str):
    by_device = {entry["device"]: (r, entry) for r, entry in enumerate(ranks)}
    tasks, unmeasured = [], []
    seen: set[tuple[str, str]] = set()
    for (device, task), groups in calls.items():
        if device not in by_device:
            raise MeasureError(f"{source}: ranks: no rank reports device {device!r}, which the plan uses")
        r, entry = by_device[device]
        times = _mapping(_get(entry, "tasks", source, f"ranks[{r}]."), source, f"ranks[{r}].tasks")
        counts = _mapping(
            _get(entry, "task_calls", source, f"ranks[{r}]."), source, f"ranks[{r}].task_calls", integer=True
        )
        if task not in times:
            unmeasured.append((device, task))
            continue
        seen.add((device, task))
        seconds, num, field = times[task], int(counts.get(task, 0)), "task_calls"
        if phase in ("decode", "prefill"):
            pre_t = _mapping(_get(entry, "prefill_tasks", source, f"ranks[{r}]."), source, f"ranks[{r}].prefill_tasks")
            pre_n = _mapping(
                _get(entry, "prefill_task_calls", source, f"ranks[{r}]."),
                source,
                f"ranks[{r}].prefill_task_calls",
                integer=True,
            )
            if phase == "decode":
                seconds, num = max(0.0, seconds - pre_t.get(task, 0.0)), num - int(pre_n.get(task, 0))
            else:
                seconds, num, field = pre_t.get(task, 0.0), int(pre_n.get(task, 0)), "prefill_task_calls"
        want = sum(n for _, n in groups)
        if num != want:
            raise MeasureError(
                f"{source}: ranks[{r}].{field}.{task}: {num} {phase} call(s), but the plan and the run's "
                f"streams imply {want}"
            )
        tasks.append(TaskObservation(device=device, task=task, calls=tuple(groups), measured_s=seconds))
    for device, (r, entry) in by_device.items():
        for task in entry.get("tasks", {}):
            if (device, task) not in seen:
                raise MeasureError(
                    f"{source}: ranks[{r}].tasks.{task}: the plan does not put task {task!r} on {device}"
                )
    return tuple(tasks), tuple(unmeasured)


def _transfers(ranks: list, device_of: dict[int, str], source: str) -> tuple[TransferObservation, ...]:
    out = []
    for r, entry in enumerate(ranks):
        items = _get(entry, "transfers", source, f"ranks[{r}].")
        if not isinstance(items, list):
            raise MeasureError(f"{source}: ranks[{r}].transfers: expected a list")
        for j, t in enumerate(items):
            where = f"ranks[{r}].transfers[{j}]"
            direction = _get(t, "direction", source, where + ".")
            if direction not in ("send", "recv"):
                raise MeasureError(f"{source}: {where}.direction: expected send or recv, got {direction!r}")
            if direction != "recv":
                continue
            peer = _number(_get(t, "peer", source, where + "."), source, where + ".peer", integer=True)
            if peer not in device_of:
                raise MeasureError(f"{source}: {where}.peer: rank {peer} is not in the report")
            seen = TransferObservation(
                src=device_of[peer],
                dst=entry["device"],
                messages=_number(_get(t, "count", source, where + "."), source, where + ".count", integer=True),
                num_bytes=_number(_get(t, "bytes", source, where + "."), source, where + ".bytes", integer=True),
                measured_s=_number(_get(t, "seconds", source, where + "."), source, where + ".seconds"),
            )
            if seen.messages == 0 and (seen.num_bytes or seen.measured_s):
                raise MeasureError(f"{source}: {where}.count: 0 messages cannot carry bytes or take time")
            out.append(seen)
    return tuple(out)


def _graph_end_to_end(plan: Plan, report: dict, source: str, per_sample: bool) -> tuple[float, str]:
    """A latency plan's forward pass (the slowest rank's wall time); a throughput plan's steady-state period
    per sample: the mean time between the ends of the batches that end in the run's steady state (a batch
    ends when its last rank does; llm_planner.runtime.graph_run), over the batch. A report of one batch
    (from before graph runs streamed batches) reads its pass per sample, high against a pipelined plan."""
    wall = _number(_get(report, "wall_s", source, ""), source, "wall_s")
    if not 0 < wall <= MOST_WALL_S:
        raise MeasureError(f"{source}: wall_s: a forward pass takes more than 0 s and at most a day, got {wall!r}")
    if not per_sample:
        return wall, "latency of one forward pass (slowest rank's wall time)"
    batches, size = _graph_batches(report, source), plan.batch_size
    if batches == 1:
        return wall / size, f"seconds per sample: the forward pass of {size} samples / {size}"
    depth = _number(_get(report, "pipeline_depth", source, ""), source, "pipeline_depth", integer=True)
    steady = batches - depth  # batches 0 .. steady - 1 end in the steady state
    if depth < 1 or steady < 2:
        raise MeasureError(
            f"{source}: pipeline_depth: {depth} with {batches} batches leaves fewer than 2 batch ends in the "
            "steady state; a run streams 2 depth + 2 batches"
        )
    ends = _ends(report, source, "batch_end_s")
    if sorted(ends) != list(range(batches)):
        raise MeasureError(
            f"{source}: ranks[*].batch_end_s: expected the end of each of the {batches} batches, got {sorted(ends)}"
        )
    period = (ends[steady - 1] - ends[0]) / (steady - 1)
    if not period > 0:
        raise MeasureError(f"{source}: ranks[*].batch_end_s: the batches' ends must increase, got {ends}")
    what = f"seconds per sample: the steady state's period between batch ends (mean of {steady - 1}) / {size} samples"
    return period / size, what


def _step_ends(report: dict, source: str) -> dict[int, float]:
    return _ends(report, source, "step_end_s")


def _ends(report: dict, source: str, field: str) -> dict[int, float]:
    """{step or batch: the latest end any rank reports for it} from the ranks' `field` pairs."""
    ends: dict[int, float] = {}
    for r, entry in enumerate(report["ranks"]):
        pairs = entry.get(field, [])
        if not isinstance(pairs, list):
            raise MeasureError(f"{source}: ranks[{r}].{field}: expected a list of [index, seconds] pairs")
        for j, pair in enumerate(pairs):
            where = f"ranks[{r}].{field}[{j}]"
            if not (isinstance(pair, list) and len(pair) == 2):
                raise MeasureError(f"{source}: {where}: expected [index, seconds], got {pair!r}")
            index = _number(pair[0], source, f"{where}[0]", integer=True)
            ends[index] = max(ends.get(index, 0.0), _number(pair[1], source, f"{where}[1]"))
    return ends


def end_to_end(plan: Plan, report: dict, source: str) -> tuple[float, str]:
    """The run's figure that is the same quantity as the plan's objective_s, and what it is.

    Graphs: the forward pass (the slowest rank's wall time, `wall_s`), for throughput plans the steady
    state's period between batch ends (`_graph_end_to_end`). Decoders: one
    decode step (the mean over the steps after the prefill, from the step ends) or,
    for prefill plans, the prefill (the end of step 0). Throughput plans divide by the
    samples in flight: the requests of every stream."""
    per_sample = plan.objective == "throughput"
    stated = report.get("objective", plan.objective)
    if stated != plan.objective:
        raise MeasureError(f"{source}: objective: the run was of a {stated!r} plan, this plan is {plan.objective!r}")
    if _get(report, "workload", source, "") == "graph":
        return _graph_end_to_end(plan, report, source, per_sample)
    phase = str(plan.inputs.model.get("phase", "decode"))
    ends = _step_ends(report, source)
    steps = int(report["max_new_tokens"])
    if sorted(ends) != list(range(steps)):
        raise MeasureError(
            f"{source}: ranks[*].step_end_s: expected the end of each of the {steps} steps, got steps {sorted(ends)}"
        )
    requests = sum(len(s["requests"]) for s in report["streams"])
    if phase == "prefill":
        value, what = ends[0], "prefill latency (end of step 0)"
    else:
        value, what = (
            (ends[steps - 1] - ends[0]) / (steps - 1),
            f"one decode step (mean of {steps - 1} steps after the prefill)",
        )
    if per_sample:
        return value / requests, f"seconds per sample: {what} / {requests} requests"
    return value, what
