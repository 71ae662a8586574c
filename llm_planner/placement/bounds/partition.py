"""The partition bound: a latency bound for a batch that may be split.

For a batch that may be split, the path LP of
one copy of the graph per shard, for each partition of Q into at most S shard
sizes, with the copies sharing the devices' load and memory rows: a plan whose
shards have those sizes gives a feasible point (each shard its own copy), so
the least such LP over the partitions bounds every plan (docs/objectives.md,
"Shard partitions").
"""

from __future__ import annotations

import functools
import heapq
import logging
import math
from dataclasses import replace

import numpy as np

from llm_planner.graph.ir import TaskGraph
from llm_planner.placement.bounds.load import shard_lp_bound
from llm_planner.placement.bounds.path_lp import path_lp_bound
from llm_planner.placement.bounds.times import task_times
from llm_planner.placement.problem import PlacementProblem

log = logging.getLogger(__name__)

# The partition bound (docs/objectives.md "Shard partitions"): how far it may go.
MAX_PARTITIONS = 64  # more partitions of Q into at most S parts: the bound is not computed
MAX_PARTITION_LPS = 16  # union LPs solved at most; the partitions left count with their cheap bound
MAX_PARTITION_TASKS = 4_000  # a union of more tasks (copies x tasks) counts with its cheap bound


def partitions(total: int, most: int, largest: int | None = None):
    """Every partition of `total` into at most `most` parts, parts in non-increasing order."""
    largest = total if largest is None else largest
    if total == 0:
        yield ()
        return
    if most == 0:
        return
    for first in range(min(total, largest), 0, -1):
        for rest in partitions(total - first, most - 1, first):
            yield (first, *rest)


def count_partitions(total: int, most: int) -> int:
    """len(list(partitions(total, most))), without listing them: p(n, k) = p(n, k - 1) + p(n - k, k)
    counts partitions of n into parts of size at most k, the same number as into at most k parts."""
    table = [[1] + [0] * total for _ in range(most + 1)]  # table[k][n]
    for k in range(1, most + 1):
        for n in range(1, total + 1):
            table[k][n] = table[k - 1][n] + (table[k][n - k] if n >= k else 0)
    return table[most][total]


def shard_copies(problem: PlacementProblem, sizes: tuple[int, ...]) -> PlacementProblem:
    """One copy of the graph per shard size, as a one-shard problem of one sample whose copy j
    takes task i's time and edge e's transfer time at sizes[j] samples; copy j's per-sample
    memory is that of sizes[j] samples, and only copy 0 holds weights (the path LP with
    `copies=len(sizes)` counts them where any copy runs the task)."""
    n = problem.num_tasks
    tasks, edges, pieces, comm, weights, per_sample = [], [], [], [], [], []
    for j, b in enumerate(sizes):
        tasks += [replace(t, name=f"{t.name}#{j}") for t in problem.graph.tasks]
        edges += [replace(e, src=f"{e.src}#{j}", dst=f"{e.dst}#{j}") for e in problem.graph.edges]
        piece = np.zeros((n, problem.num_devices, 1, 2))
        piece[:, :, 0, 0] = np.where(problem.supported, task_times(problem, b), 0.0)
        pieces.append(piece)
        comm.append(problem.comm_fixed + problem.comm_slope * b)
        weights.append(problem.weight_bytes if j == 0 else np.zeros(n))
        per_sample.append(problem.mem_bytes_per_sample * b)
    s = len(sizes)
    return replace(
        problem,
        graph=TaskGraph(name=f"{problem.graph.name}{list(sizes)}", tasks=tuple(tasks), edges=tuple(edges)),
        batch_size=1,
        max_shards=1,
        time_pieces=np.concatenate(pieces),
        supported=np.tile(problem.supported, (s, 1)),
        edge_src=np.concatenate([problem.edge_src + j * n for j in range(s)]),
        edge_dst=np.concatenate([problem.edge_dst + j * n for j in range(s)]),
        comm_fixed=np.concatenate(comm),
        comm_slope=np.zeros((s * problem.num_edges, *problem.comm_slope.shape[1:])),
        weight_bytes=np.concatenate(weights),
        mem_bytes_per_sample=np.concatenate(per_sample),
        mem_counts=np.tile(problem.mem_counts, (s, 1)),
        hop_s_per_sample=np.tile(problem.hop_s_per_sample, s),
        token_loop=None,  # a relaxation: the decode loop's hand-off is >= 0
    )


def partition_bound(problem: PlacementProblem, floor: float = 0.0, load=None) -> float:
    """A latency bound for a batch that may be split: min over the partitions P = (b_1 >= ... >= b_s)
    of Q into at most S parts of the path LP of `shard_copies(problem, P)`, each shard's own copy
    of the graph with all copies sharing the devices' time and memory (docs/objectives.md).

    Three bounds per partition, each at least the one before: cheap, LP(s) of the shard-count
    bound (`load(s)`, shard_lp_bound by default); light, the larger of that and the union LP
    without its head and tail rows; full, with them. With at most MAX_PARTITIONS partitions,
    every one is a candidate (`_best_first`); with more, one per number of shards
    (`_by_shard_count`). Once the least bound is at most `floor` (a bound the caller already
    has), the result is `floor`."""

    q, most = problem.batch_size, min(problem.batch_size, problem.max_shards)
    if problem.objective != "latency" or most < 2:
        return floor
    load = load or functools.lru_cache(maxsize=None)(lambda s: shard_lp_bound(problem, s))
    if count_partitions(q, most) <= MAX_PARTITIONS:
        value = _best_first(problem, list(partitions(q, most)), load)
    else:
        value = _by_shard_count(problem, most, load, floor)
    return max(floor, value)


def _raise(problem: PlacementProblem, p: tuple[int, ...], value: float, stage: int) -> float:
    """A partition's bound after its light (stage 0 -> 1) or full (1 -> 2) union LP."""
    return max(value, path_lp_bound(shard_copies(problem, p), 1, head_tail=stage == 1, copies=len(p)))


def _best_first(problem: PlacementProblem, candidates: list[tuple[int, ...]], load) -> float:
    """The least bound over `candidates`: the one whose bound is least so far is raised to its next
    bound until that least one is final (full; or light once MAX_PARTITION_LPS full LPs were
    solved or when its union exceeds MAX_PARTITION_TASKS tasks). No other can then be lower, and
    candidates never reached keep their cheap bound without costing a union LP."""
    heap = [(load(len(p)), 0, p) for p in candidates]  # (bound, stage: 0 cheap, 1 light, 2 full, partition)
    heapq.heapify(heap)
    full_lps = 0
    while True:
        value, stage, p = heap[0]
        small = len(p) * problem.num_tasks <= MAX_PARTITION_TASKS
        if stage == 2 or not small or (stage == 1 and full_lps >= MAX_PARTITION_LPS):
            log.debug("partition bound: %d full union LPs, %.6g s, set by %s", full_lps, value, p)
            return value
        full_lps += stage == 1
        heapq.heapreplace(heap, (_raise(problem, p, value, stage), stage + 1, p))


def _by_shard_count(problem: PlacementProblem, most: int, load, floor: float) -> float:
    """Too many partitions: for each s, the sizes (ceil(Q / s), 1, ..., 1) stand for every partition
    into s parts (its largest part has at least ceil(Q / s) samples, the others at least 1, and the
    union LP only rises with the sizes: times by F1, per-sample memory). LP(s) rises with s
    (bounds/load.py), so once LP(s) reaches the least bound found, no larger s can be lower; and
    once the least is at most `floor`, the caller's bound stands."""
    q, best, full_lps = problem.batch_size, math.inf, 0
    for s in range(1, most + 1):
        value = load(s)
        if value >= best or best <= floor:
            break
        p = (math.ceil(q / s),) + (1,) * (s - 1)
        if len(p) * problem.num_tasks > MAX_PARTITION_TASKS:
            best = min(best, value)
            break
        value = _raise(problem, p, value, 0)
        if value < best and full_lps < MAX_PARTITION_LPS:
            value, full_lps = _raise(problem, p, value, 1), full_lps + 1
        best = min(best, value)
    log.debug("partition bound by shard count: %d full union LPs, %.6g s", full_lps, best)
    return best
