"""Expert-parallel load balancing (EPLB, DeepSeek-V3's; vLLM and SGLang `--enable-eplb`): where the
engine puts the routed experts of a group with data-parallel attention when it rebalances them
from the load it observes, and what that placement leaves on each member.

With R redundant experts, a group of k members holds E + R expert replicas, (E + R) / k on each
(the engines ask that k divide E + R). From the load of each expert (its tokens, or any numbers
proportional to them):

    replicate  R times, one more replica of the expert whose load per replica is the largest
               (the lower expert on a tie); an expert's tokens are split evenly over its replicas
    pack       the replicas from the heaviest down, each to the least loaded member that still has
               a free slot (the lower member on a tie)

which is the greedy of DeepSeek's `eplb` package (its global policy; the engines run it on the load
they record). `member_loads` gives each member's load after it; the busiest member over the mean
is the imbalance a group is charged (llm_planner.serving.expert_load). `replica_picks` turns the
chances that one token reaches each expert (graph.moe.experts_touched) into the replicas': a
replica of an expert with r replicas is reached with 1/r of its expert's chance, so the weights an
iteration's tokens read count every replica they reach.

R is at most E (`check_redundant`): past one replica more of every expert the placement has
nothing left to balance, and the engines' own examples keep R at a fraction of E.
"""

from __future__ import annotations

import heapq

MAX_REDUNDANT = 4096  # the most redundant experts a flag or plan file may state (R <= E is checked against the model)


def check_redundant(redundant: object, num_experts: int) -> int:
    """`redundant` as a count of redundant experts; ValueError unless a whole number from 0 to E."""
    if isinstance(redundant, bool) or not isinstance(redundant, int) or not 0 <= redundant <= num_experts:
        raise ValueError(f"a whole number of redundant experts from 0 to the model's {num_experts}, got {redundant!r}")
    return redundant


def replicas(loads: tuple[float, ...] | list[float], redundant: int) -> list[int]:
    """Replicas per expert after `redundant` rounds of replicating the busiest per replica."""
    count = [1] * len(loads)
    heap = [(-load, e) for e, load in enumerate(loads)]
    heapq.heapify(heap)
    for _ in range(redundant):
        _, e = heapq.heappop(heap)
        count[e] += 1
        heapq.heappush(heap, (-loads[e] / count[e], e))
    return count


def member_loads(
    loads: tuple[float, ...] | list[float], k: int, redundant: int, copies: list[int] | None = None
) -> list[float]:
    """Each of k members' load after EPLB places the E + `redundant` replicas (module docstring;
    `copies`: replicas(loads, redundant) where the caller has it); ValueError unless k divides
    E + `redundant`."""
    slots, left = divmod(len(loads) + redundant, k)
    if left or slots == 0:
        raise ValueError(f"{len(loads)} experts and {redundant} redundant do not split evenly over {k} members")
    copies = copies or replicas(loads, redundant)
    items = sorted(((loads[e] / copies[e], -e) for e in range(len(loads)) for _ in range(copies[e])), reverse=True)
    total, free = [0.0] * k, [(0.0, j) for j in range(k)]  # members with a free slot, least loaded first
    used = [0] * k
    for load, _ in items:
        _, member = heapq.heappop(free)
        total[member] += load
        used[member] += 1
        if used[member] < slots:
            heapq.heappush(free, (total[member], member))
    return total


def replica_picks(picks: tuple[float, ...], redundant: int) -> tuple[float, ...]:
    """The chance one token reaches each replica, from each expert's chance `picks` (module
    docstring), the most reached first."""
    copies = replicas(picks, redundant)
    return tuple(sorted((q / c for q, c in zip(picks, copies) for _ in range(c)), reverse=True))
