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

W is the weights *streamed* per call: an embedding table (`weight_bytes_indexed`) is
held whole but only the rows of the batch's tokens are read, and those are in A.

Tasks with explicit times (profiles, imported workloads) bypass the roofline:
t(b) = time_s_by_kind[kind] * b.

On a tensor-parallel group of k devices (Megatron-LM layout: Shoeybi et al. 2019,
"Megatron-LM: training multi-billion parameter language models using model
parallelism", sec. 3), each member runs the roofline above with F / k, and W and A
split into their sharded part / k plus their replicated part (norms, residuals),
then the group runs the task's collectives over the node's link (alpha, beta), in
sequence with the compute (no overlap is assumed). Ring algorithms (Patarasuk and
Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC
2009; Thakur, Rabenseifner, Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005):

    all-reduce of n bytes:                2 (k - 1) alpha + 2 (k - 1) / k * n / beta
    all-gather of n bytes from each member: (k - 1) alpha +     (k - 1) * n / beta

with beta the link's bandwidth times the kind's collective efficiency (the share of it NCCL's
all-reduce reaches: DeviceKindSpec.collective_bw_efficiency). Both are affine in b (n is per
sample), so the group's time is again a maximum of
affine pieces: the collectives' time is added to every piece.

Transfer time of an edge's tensor between two different devices for b samples
(the alpha-beta model, Hockney 1994; `transfer_tables`, over every edge and pair):

    c(b) = latency + b * bytes_per_sample / bw  +  b * hop_s * hops

where hops counts the non-CPU ends of the transfer for explicit-cost edges that
are staged through host memory (accelerator -> CPU: 1; accelerator ->
accelerator: 2; CPU -> CPU: 0). It is 0 on the same device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from llm_planner.core.spec import DeviceKindSpec, LinkSpec
from llm_planner.graph.ir import Edge, Task

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class RooflineTerms:
    """What the roofline of one device (or one member of a tensor-parallel group) reads for a task,
    before the kind's efficiencies and overhead: the builder's pieces (`pieces_of`) and calibration's
    fit (llm_planner.measure.calibrate) both start from these."""

    flops_per_sample: float  # F (a member's share on a group)
    streamed_bytes: float  # W read once per call (weights less the indexed table)
    bytes_per_sample: float  # A
    peak_flops: float  # the kind's peak for the dtype
    mem_bw_bytes_per_s: float
    collective: Piece = (0.0, 0.0)  # (fixed_s, per_sample_s) of a group's collectives; none alone


def roofline_terms(
    task: Task, kind: DeviceKindSpec, dtype: str, k: int = 1, link: LinkSpec | None = None
) -> RooflineTerms:
    """The roofline terms of `task` on one device of `kind` (k = 1) or on each member of a group of k
    whose collectives cross `link`. Raises CostError for a task with explicit times, a dtype the kind
    has no peak for, or a task that does not shard over k."""
    if task.time_s_by_kind:
        raise CostError(f"task {task.name!r} has explicit times, not a roofline")
    if k > 1 and (not task.shards_over(k) or link is None):
        raise CostError(f"task {task.name!r} cannot run on a tensor-parallel group of {k}")
    try:
        peak = kind.flops_for(dtype)
    except KeyError:
        raise CostError(f"device kind {kind.name!r} gives no peak_flops for dtype {dtype!r}") from None
    member = shard_of(task, k) if k > 1 else task
    return RooflineTerms(
        flops_per_sample=member.flops_per_sample,
        streamed_bytes=member.weight_bytes - member.weight_bytes_indexed,
        bytes_per_sample=member.bytes_per_sample,
        peak_flops=peak,
        mem_bw_bytes_per_s=kind.mem_bw_bytes_per_s,
        collective=(
            collective_pieces(task, k, link, kind.collective_call_s, kind.collective_bw_efficiency)
            if k > 1
            else (0.0, 0.0)
        ),
    )


def pieces_of(terms: RooflineTerms, kind: DeviceKindSpec) -> tuple[Piece, Piece]:
    """The (compute, memory) affine pieces of the module docstring, with the kind's efficiencies and
    overhead and the collectives added to both."""
    flops_per_s = terms.peak_flops * kind.compute_efficiency
    bytes_per_s = terms.mem_bw_bytes_per_s * kind.mem_efficiency
    compute = (kind.overhead_s, terms.flops_per_sample / flops_per_s)
    memory = (kind.overhead_s + terms.streamed_bytes / bytes_per_s, terms.bytes_per_sample / bytes_per_s)
    if terms.collective == (0.0, 0.0):
        return (compute, memory)
    fixed, slope = terms.collective
    return ((compute[0] + fixed, compute[1] + slope), (memory[0] + fixed, memory[1] + slope))


def task_time_pieces(task: Task, kind: DeviceKindSpec, dtype: str) -> tuple[Piece, ...]:
    """Affine pieces whose maximum is the task's time for b >= 1 samples.

    Raises CostError for an unsupported task or a dtype the device has no peak for.
    """
    if not task_supported(task, kind):
        raise CostError(f"task {task.name!r} cannot run on device kind {kind.name!r}")
    if task.time_s_by_kind:
        return ((0.0, dict(task.time_s_by_kind)[kind.name]),)
    return pieces_of(roofline_terms(task, kind, dtype), kind)


def collective_pieces(task: Task, k: int, link: LinkSpec, call_s: float = 0.0, efficiency: float = 1.0) -> Piece:
    """(fixed_s, per_sample_s) of the task's collectives on a group of k over `link` (ring), each
    call paying `call_s` besides its link latencies (the kind's collective_call_s), the bytes moving
    at `efficiency` of the link's bandwidth (the kind's collective_bw_efficiency)."""
    if k <= 1:
        return (0.0, 0.0)
    calls = task.tp_allreduces + task.tp_allgathers
    fixed = calls * call_s + (2 * task.tp_allreduces + task.tp_allgathers) * (k - 1) * link.latency_s
    per_sample = (
        2 * (k - 1) / k * task.tp_allreduce_bytes_per_sample + (k - 1) * task.tp_allgather_bytes_per_sample
    ) / (link.bw_bytes_per_s * efficiency)
    return (fixed, per_sample)


def group_task_time_pieces(
    task: Task, kind: DeviceKindSpec, k: int, link: LinkSpec | None, dtype: str
) -> tuple[Piece, ...]:
    """Affine pieces of the task's time on a tensor-parallel group of k devices of `kind`
    whose collectives cross `link` (module docstring). k = 1 is task_time_pieces.

    Raises CostError when the task does not shard over k devices."""
    if k == 1:
        return task_time_pieces(task, kind, dtype)
    if not task_supported(task, kind):
        raise CostError(f"task {task.name!r} cannot run on device kind {kind.name!r}")
    if task.time_s_by_kind:  # explicit times: each member's is the task's, plus the collectives
        if not task.shards_over(k) or link is None:
            raise CostError(f"task {task.name!r} cannot run on a tensor-parallel group of {k}")
        fixed, slope = collective_pieces(task, k, link, kind.collective_call_s, kind.collective_bw_efficiency)
        return ((fixed, dict(task.time_s_by_kind)[kind.name] + slope),)
    return pieces_of(roofline_terms(task, kind, dtype, k, link), kind)


def shard_of(task: Task, k: int) -> Task:
    """What one member of a group of k runs and holds: 1/k of the sharded FLOPs, weights, bytes
    and per-sample memory (KV heads split too; MLA's latent cache replicated), the replicated parts whole."""

    def split(total: float, replicated: float) -> float:
        return (total - replicated) / k + replicated

    return dataclasses.replace(
        task,
        flops_per_sample=task.flops_per_sample / k,
        weight_bytes=split(task.weight_bytes, task.tp_replicated_weight_bytes),
        bytes_per_sample=split(task.bytes_per_sample, task.tp_replicated_bytes_per_sample),
        mem_bytes_per_sample=split(task.mem_bytes_per_sample, task.tp_replicated_mem_bytes_per_sample),
        weight_bytes_indexed=split(task.weight_bytes_indexed, task.tp_replicated_indexed_bytes),
        tp_divides=(),
        tp_replicated_weight_bytes=0.0,
        tp_replicated_indexed_bytes=0.0,
        tp_replicated_bytes_per_sample=0.0,
        tp_replicated_mem_bytes_per_sample=0.0,
    )


def evaluate_pieces(pieces: tuple[Piece, ...], batch: int) -> float:
    """max_j(fixed_j + slope_j * b) for b >= 1, and 0 for b == 0."""
    if batch <= 0:
        return 0.0
    return max(fixed + slope * batch for fixed, slope in pieces)


def estimate_task_time_s(task: Task, kind: DeviceKindSpec, dtype: str, batch: int) -> float:
    """Time of `task` on one device of `kind` for a sub-batch of `batch` samples."""
    return evaluate_pieces(task_time_pieces(task, kind, dtype), batch)


def transfer_s(link: LinkSpec | None, nbytes: float) -> float:
    """Time to move `nbytes` over `link` (the alpha-beta model of the module docstring: latency +
    bytes / bw); 0 on the same device (link None) or when nothing moves."""
    return 0.0 if link is None or nbytes <= 0 else link.latency_s + nbytes / link.bw_bytes_per_s


def transfer_hops(src: DeviceKindSpec, dst: DeviceKindSpec) -> int:
    """Ends of a host-staged transfer that are not CPUs (0, 1 or 2)."""
    return int(src.type != "cpu") + int(dst.type != "cpu")


def transfer_tables(
    edges: Sequence[Edge], links: Sequence[Sequence[LinkSpec | None]], kinds: Sequence[DeviceKindSpec]
) -> tuple[np.ndarray, np.ndarray]:
    """(fixed_s, per_sample_s), each [E, K, K]: moving each edge's tensor from device k (of kind
    kinds[k]) to device l over links[k][l], the alpha-beta formula of the module docstring
    (latency; bytes / bw + hop_s * hops), over every edge and pair at once; 0 where the link is
    None (the same device). The problem builder's transfer costs and a profile's measured links
    (llm_planner.cost.measured, taken by the builder) both come from here."""
    num_e, num_k = len(edges), len(kinds)
    latency = np.zeros((num_k, num_k))
    inv_bw = np.zeros((num_k, num_k))
    hops = np.zeros((num_k, num_k))
    for k in range(num_k):
        for l in range(num_k):
            link = links[k][l]
            if link is not None:
                latency[k, l] = link.latency_s
                inv_bw[k, l] = 1.0 / link.bw_bytes_per_s
                hops[k, l] = transfer_hops(kinds[k], kinds[l])
    edge_bytes = np.array([e.bytes_per_sample for e in edges], dtype=float).reshape(num_e, 1, 1)
    edge_hop = np.array([e.hop_s_per_sample for e in edges], dtype=float).reshape(num_e, 1, 1)
    fixed = np.broadcast_to(latency, (num_e, num_k, num_k)).copy()
    return fixed, edge_bytes * inv_bw[None] + edge_hop * hops[None]
