"""Cost model: pure functions from (task, device, batch) and (edge, link, batch) to seconds.

Task time on a device for a sub-batch of b >= 1 samples is a convex piecewise
affine function of b, the roofline model (Williams, Waterman, Patterson,
"Roofline: an insightful visual performance model", CACM 2009):

    t(b) = overhead + max( F * b / (peak_flops * compute_eff),            (compute)
                           (W + A * b) / (mem_bw * mem_eff) )              (memory)

with F the FLOPs per sample, W the weight bytes (read once per call, whatever
b is), A the activation bytes per sample. t(0) = 0: a device that gets no
sample of a shard does no work. Each branch is affine in b, so
t(b) = max_j (fixed_j + slope_j * b) over the "pieces" returned by
`task_time_pieces`; the MILP uses the pieces directly, exactly.

Tasks with explicit times (profiles, imported workloads) bypass the roofline:
t(b) = time_s_by_kind[kind] * b.

Transfer time of an edge's tensor between two different devices for b samples
(the alpha-beta model, Hockney 1994):

    c(b) = latency + b * bytes_per_sample / bw  +  b * hop_s * hops

where hops counts the non-CPU ends of the transfer for explicit-cost edges that
are staged through host memory (accelerator -> CPU: 1; accelerator ->
accelerator: 2; CPU -> CPU: 0). It is 0 on the same device.
"""

from __future__ import annotations

from llm_planner.graph.ir import Edge, Task
from llm_planner.spec import DeviceKindSpec, LinkSpec

Piece = tuple[float, float]  # (fixed_s, per_sample_s)


class CostError(ValueError):
    """A task or device whose cost cannot be estimated (e.g. a dtype the device lacks)."""


def task_supported(task: Task, kind: DeviceKindSpec) -> bool:
    """Whether the task may run on a device of this kind at all."""
    if task.device_types and kind.type not in task.device_types:
        return False
    if task.time_s_by_kind:
        return any(name == kind.name for name, _ in task.time_s_by_kind)
    return True


def task_time_pieces(task: Task, kind: DeviceKindSpec, dtype: str) -> tuple[Piece, ...]:
    """Affine pieces whose maximum is the task's time for b >= 1 samples.

    Raises CostError for an unsupported task or a dtype the device has no peak for.
    """
    if not task_supported(task, kind):
        raise CostError(f"task {task.name!r} cannot run on device kind {kind.name!r}")
    if task.time_s_by_kind:
        return ((0.0, dict(task.time_s_by_kind)[kind.name]),)
    try:
        peak = kind.flops_for(dtype)
    except KeyError:
        raise CostError(f"device kind {kind.name!r} gives no peak_flops for dtype {dtype!r}") from None
    flops_per_s = peak * kind.compute_efficiency
    bytes_per_s = kind.mem_bw_bytes_per_s * kind.mem_efficiency
    compute = (kind.overhead_s, task.flops_per_sample / flops_per_s)
    memory = (kind.overhead_s + task.weight_bytes / bytes_per_s, task.bytes_per_sample / bytes_per_s)
    return (compute, memory)


def evaluate_pieces(pieces: tuple[Piece, ...], batch: int) -> float:
    """max_j(fixed_j + slope_j * b) for b >= 1, and 0 for b == 0."""
    if batch <= 0:
        return 0.0
    return max(fixed + slope * batch for fixed, slope in pieces)


def estimate_task_time_s(task: Task, kind: DeviceKindSpec, dtype: str, batch: int) -> float:
    """Time of `task` on one device of `kind` for a sub-batch of `batch` samples."""
    return evaluate_pieces(task_time_pieces(task, kind, dtype), batch)


def transfer_hops(src: DeviceKindSpec, dst: DeviceKindSpec) -> int:
    """Ends of a host-staged transfer that are not CPUs (0, 1 or 2)."""
    return int(src.type != "cpu") + int(dst.type != "cpu")


def transfer_pieces(edge: Edge, link: LinkSpec | None, hops: int) -> Piece:
    """(fixed_s, per_sample_s) of moving the edge's tensor over `link` (None: same device)."""
    if link is None:
        return (0.0, 0.0)
    per_sample = edge.bytes_per_sample / link.bw_bytes_per_s + edge.hop_s_per_sample * hops
    return (link.latency_s, per_sample)


def estimate_transfer_time_s(edge: Edge, link: LinkSpec | None, hops: int, batch: int) -> float:
    """Time to move the edge's tensor for `batch` samples; 0 on one device or for b == 0."""
    if link is None or batch <= 0:
        return 0.0
    fixed, slope = transfer_pieces(edge, link, hops)
    return fixed + slope * batch
