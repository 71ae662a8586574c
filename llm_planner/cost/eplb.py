"""Expert-parallel load balancing (EPLB, DeepSeek-V3's; vLLM and SGLang `--enable-eplb`): where the
engine puts the routed experts of a group with data-parallel attention when it rebalances them
from the load it observes, and what that placement leaves on each member.

With R redundant experts, a group of k members holds E + R expert replicas, (E + R) / k on each
(the engines ask that k divide E + R). From the load of each expert (its tokens, or any numbers
proportional to them):

    replicate  R times, one more replica of the expert whose load per replica is the largest; an
               expert's tokens are split evenly over its replicas
    pack       the replicas from the heaviest down, each to the least loaded member that still has
               a free slot

which is the greedy of DeepSeek's `eplb` package (its global policy; the engines run it on the load
they record). `member_loads` gives each member's load after it; the busiest member over the mean
is the imbalance a group is charged (llm_planner.serving.expert_load). `replica_picks` turns the
chances that one token reaches each expert (graph.moe.experts_touched) into the replicas': a
replica of an expert with r replicas is reached with 1/r of its expert's chance, so the weights an
iteration's tokens read count every replica they reach.
"""

from __future__ import annotations


def replicas(loads: tuple[float, ...] | list[float], redundant: int) -> list[int]:
    """Replicas per expert after `redundant` rounds of replicating the busiest per replica."""
    count = [1] * len(loads)
    for _ in range(redundant):
        busiest = max(range(len(loads)), key=lambda e: (loads[e] / count[e], -e))
        count[busiest] += 1
    return count


def member_loads(loads: tuple[float, ...] | list[float], k: int, redundant: int) -> list[float]:
    """Each of k members' load after EPLB places the E + `redundant` replicas (module docstring);
    ValueError unless k divides E + `redundant`."""
    slots, left = divmod(len(loads) + redundant, k)
    if left or slots == 0:
        raise ValueError(f"{len(loads)} experts and {redundant} redundant do not split evenly over {k} members")
    copies = replicas(loads, redundant)
    items = sorted(((loads[e] / copies[e], e) for e in range(len(loads)) for _ in range(copies[e])), reverse=True)
    total, used = [0.0] * k, [0] * k
    for load, _ in items:
        member = min((j for j in range(k) if used[j] < slots), key=lambda j: (total[j], j))
        total[member] += load
        used[member] += 1
    return total


def replica_picks(picks: tuple[float, ...], redundant: int) -> tuple[float, ...]:
    """The chance one token reaches each replica, from each expert's chance `picks` (module
    docstring), the most reached first."""
    copies = replicas(picks, redundant)
    return tuple(sorted((q / c for q, c in zip(picks, copies) for _ in range(c)), reverse=True))
