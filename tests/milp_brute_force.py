"""Brute-force optima of small placement problems, written independently of the MILP.

Enumerates shard sizes, every assignment of every (shard, task) to a device, and
for latency every global order of the items (a list schedule in each order; some
order reproduces any optimal schedule), using only the problem's cost accessors
(task_time, transfer_time), the decode loop's token hand-off arrays (token_fixed, token_slope:
a step ends no sooner than each shard's lm_head finish plus its ids' trip back to embed; in
throughput, charged to both ends like a cut edge) and memory arrays: not problem.schedule, not the
verifier.
Devices that share a physical device (a tensor-parallel group and its members, two
overlapping groups) are never both used.

A throughput plan must also fit its steady state (docs/objectives.md, Memory): weights once
and the per-sample memory of each of its B batches in flight on every device. B is the plan's,
ceil(makespan / max load) of the schedule the planner gives an assignment (make_plan: the one
schedule every solver writes), so it is read from there; the memory sum is the brute force's own.
"""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np

from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.schedule import make_plan


def partitions(total: int, parts: int, largest: int | None = None) -> list[tuple[int, ...]]:
    """Non-increasing tuples of at most `parts` positive integers summing to `total`."""
    largest = total if largest is None else largest
    if total == 0:
        return [()]
    if parts == 0:
        return []
    return [(b, *rest) for b in range(min(total, largest), 0, -1) for rest in partitions(total - b, parts - 1, b)]


def feasible_assignments(
    p: PlacementProblem, sizes: tuple[int, ...], contiguous: bool, exclusive: bool = True
) -> np.ndarray:
    """Every supported assignment [M, shards * N] that keeps groups together, fits memory (weights once
    per device, per-sample memory per shard) and, if asked, keeps each device's tasks contiguous."""
    n = p.num_tasks
    choices = [np.flatnonzero(p.supported[i % n]).tolist() for i in range(len(sizes) * n)]
    a = np.array(list(itertools.product(*choices)), dtype=int).reshape(-1, len(sizes) * n)
    keep = np.ones(len(a), dtype=bool)
    for s in range(len(sizes)):
        for group in p.colocate_groups():
            keep &= (a[:, [s * n + i for i in group]] == a[:, [s * n + group[0]]]).all(axis=1)
    for k, l in itertools.combinations(range(p.num_devices), 2):  # tensor-parallel groups: exclusive
        if exclusive and set(p.device_members[k]) & set(p.device_members[l]):
            keep &= ~((a == k).any(axis=1) & (a == l).any(axis=1))
    for k in range(p.num_devices):
        on_k = (a == k).reshape(len(a), len(sizes), n) & p.mem_counts[:, k]
        used = (on_k.any(axis=1) * p.weight_bytes).sum(axis=1) + (
            on_k * np.array(sizes)[:, None] * p.mem_bytes_per_sample
        ).sum(axis=(1, 2))
        keep &= used <= p.mem_capacity[k]
    if contiguous:
        reach = (
            nx.to_numpy_array(
                nx.transitive_closure_dag(p.graph.to_networkx()), nodelist=[t.name for t in p.graph.tasks]
            )
            > 0
        )
        for s in range(len(sizes)):
            for k in range(p.num_devices):
                m = a[:, s * n : (s + 1) * n] == k
                after, before = (m @ reach) > 0, (m @ reach.T) > 0
                keep &= ~(after & before & ~m).any(axis=1)
    return a[keep]


def brute_latency(p: PlacementProblem, sizes: tuple[int, ...], a: np.ndarray) -> float:
    """Min over assignments and over every global order of the items of the list schedule in that order."""
    n, rows = p.num_tasks, np.arange(len(a))
    items = nx.DiGraph()
    items.add_nodes_from(range(len(sizes) * n))
    items.add_edges_from(
        (s * n + int(u), s * n + int(v)) for s in range(len(sizes)) for u, v in zip(p.edge_src, p.edge_dst)
    )
    dur = np.array(
        [
            [p.task_time(j % n, k, sizes[j // n]) if p.supported[j % n, k] else 0.0 for k in range(p.num_devices)]
            for j in range(len(sizes) * n)
        ]
    )
    comm = {
        (s * n + int(u), s * n + int(v)): np.array(
            [[p.transfer_time(e, k, l, sizes[s]) for l in range(p.num_devices)] for k in range(p.num_devices)]
        )
        for s in range(len(sizes))
        for e, (u, v) in enumerate(zip(p.edge_src, p.edge_dst))
    }
    best = math.inf
    for order in nx.all_topological_sorts(items):
        free = np.zeros((len(a), p.num_devices))
        finish = np.zeros(a.shape)
        for j in order:
            k = a[:, j]
            ready = np.zeros(len(a))
            for u in items.predecessors(j):
                ready = np.maximum(ready, finish[:, u] + comm[(u, j)][a[:, u], k])
            finish[:, j] = np.maximum(free[rows, k], ready) + dur[j, k]
            free[rows, k] = finish[:, j]
        end = finish.max(axis=1)
        if p.token_loop is not None:  # the next step starts when each shard's sampled ids are back at embed
            for s, b in enumerate(sizes):
                end = np.maximum(end, finish[:, s * n + p.token_loop[0]] + _token_s(p, a, s, b))
        best = min(best, float(end.min()))
    return best


def _token_s(p: PlacementProblem, a: np.ndarray, s: int, b: int) -> np.ndarray:
    """Per assignment row: shard s's decode-loop hand-off, the sampled ids from lm_head's device to
    embed's (its fixed and per-sample costs; nothing when they share a device or the shard is empty)."""
    n = p.num_tasks
    head, embed = a[:, s * n + p.token_loop[0]], a[:, s * n + p.token_loop[1]]
    cost = p.token_fixed[head, embed] + p.token_slope[head, embed] * b
    return np.where((head != embed) & (b > 0), cost, 0.0)


def brute_throughput(p: PlacementProblem, sizes: tuple[int, ...], a: np.ndarray) -> float:
    """Min over assignments of the busiest device's load per batch, over Q (problem.py's two models)."""
    n, rows = p.num_tasks, np.arange(len(a))
    load = np.zeros((len(a), p.num_devices))
    for s, b in enumerate(sizes):
        dev = a[:, s * n : (s + 1) * n]
        for i in range(n):
            load[rows, dev[:, i]] += [p.task_time(i, k, b) for k in dev[:, i]]
        for u in range(n):
            out = [int(v) for e_u, v in zip(p.edge_src, p.edge_dst) if e_u == u]
            if p.throughput_model == "direct":
                for e in (e for e in range(p.num_edges) if p.edge_src[e] == u):
                    v = int(p.edge_dst[e])
                    c = np.array([p.transfer_time(e, k, l, b) for k, l in zip(dev[:, u], dev[:, v])])
                    load[rows, dev[:, u]] += c
                    load[rows, dev[:, v]] += np.where(dev[:, u] != dev[:, v], c, 0.0)
                continue
            hop = p.hop_s_per_sample[u] * b
            for k in range(p.num_devices):
                if p.is_cpu[k] or not out:
                    continue
                leaves = (dev[:, u] == k) & (dev[:, out] != k).any(axis=1)
                enters = (dev[:, u] != k) & (dev[:, out] == k).any(axis=1)
                load[:, k] += hop * (leaves.astype(float) + enters)
        if p.token_loop is not None:  # the decode loop's hand-off, on both its ends like a cut edge
            token = _token_s(p, a, s, b)
            for end in p.token_loop:
                np.add.at(load, (rows, dev[:, end]), token)
    per_batch = load.max(axis=1)
    for j in np.argsort(per_batch, kind="stable"):  # the best assignment whose steady state fits
        if steady_state_fits(p, sizes, a[j]):
            return float(per_batch[j]) / p.batch_size
    return math.inf


def steady_state_fits(p: PlacementProblem, sizes: tuple[int, ...], row: np.ndarray) -> bool:
    """Whether weights once plus B batches' per-sample memory fit every device (module docstring)."""
    n = p.num_tasks
    assigns = [row[s * n : (s + 1) * n].tolist() for s in range(len(sizes))]
    plan = make_plan(p, list(sizes), assigns, solver="brute", status="heuristic", started_at=0.0, lower_bound_s=0.0)
    if plan.batches_in_flight == 1:  # one batch: feasible_assignments checked it
        return True
    on = np.zeros((len(sizes), n, p.num_devices), dtype=bool)
    for s, devices in enumerate(assigns):
        on[s, np.arange(n), devices] = True
    on &= p.mem_counts[None]
    per_sample = (on * np.array(sizes)[:, None, None] * p.mem_bytes_per_sample[None, :, None]).sum(axis=(0, 1))
    used = (on.any(axis=0) * p.weight_bytes[:, None]).sum(axis=0) + plan.batches_in_flight * per_sample
    return bool((used <= p.mem_capacity).all())


def brute_force(p: PlacementProblem, *, contiguous: bool = False, exclusive: bool = True) -> float:
    """The optimum; `exclusive=False` drops exclusivity (to show a test that it binds)."""
    best = math.inf
    for sizes in partitions(p.batch_size, p.max_shards):
        a = feasible_assignments(p, sizes, contiguous, exclusive)
        if len(a):
            best = min(best, (brute_latency if p.objective == "latency" else brute_throughput)(p, sizes, a))
    return best
