"""A measured routing histogram of a mixture of experts (`--expert-load FILE`): how many tokens
each expert received, and the imbalance factors the serving model charges from it.

The file is YAML (or JSON) with one key, `tokens_per_expert`: a list of E counts (one histogram
for every MoE layer) or a list of such lists, one per MoE layer in order, as an engine's expert
load recorder gives them (counts, or any numbers proportional to them). From each layer's counts
n_e (share s_e = n_e / sum n):

    experts tensor-parallel (tpK)   the busiest expert's rows over the mean: E max_e s_e
    experts split over dpaK         the busiest member's rows over the mean: k max_j S_j, S_j the
                                    share of member j's experts, E/k consecutive ones (vLLM's and
                                    SGLang's default placement: expert e on member floor(e k / E)),
                                    or under EPLB (`--eplb R`) the (E + R)/k replicas EPLB's greedy
                                    gives it from the histogram (llm_planner.cost.eplb)

each averaged over the layers (a layer's time is linear in its factor, and the stages' layers are
taken alike). These are `--expert-imbalance`'s factor (llm_planner.cost.moe_cost: the expert GEMMs
charged as if every expert, or member, had the busiest one's rows) for the two layouts: a member
holding a block of experts averages its experts' skew, so the second is never above the first.
DeepEP's dispatch and combine (llm_planner.cost.dp_attention) charge the busiest member's share of
the pairs too. The experts each iteration's tokens reach (their weight reads) follow the histogram
too (`picks`): expert e is reached by one token with chance q_e = min(1, k s_e), so T tokens reach
sum_e (1 - (1 - q_e)^T) of them (llm_planner.graph.moe.experts_touched), fewer than under uniform
routing's E (1 - (1 - k/E)^T) wherever the router is skewed. The chances are sorted in each layer
and averaged rank by rank over the layers (the count depends on the chances, not on which expert
holds which); the count is concave in each chance, so the count of the averaged chances is at
least the layers' mean count (Jensen): the model errs slow, by no more than the layers differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llm_planner.core.fileio import read_document
from llm_planner.cost.eplb import member_loads, replicas
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.serving.workload import WorkloadError


class ExpertLoadError(WorkloadError):
    """An expert-load file that cannot be read; the message names the file and the field."""


@dataclass(frozen=True)
class ExpertLoad:
    source: str
    layers: tuple[tuple[float, ...], ...]  # tokens each expert received, per MoE layer measured

    @classmethod
    def uniform(cls, num_experts: int) -> ExpertLoad:
        """Uniform routing: one layer of equal loads (the member factors EPLB's placement gives it)."""
        return cls(source="uniform routing", layers=((1.0,) * num_experts,))

    def expert_imbalance(self) -> float:
        """The busiest expert's rows over the mean, averaged over the layers (module docstring)."""
        return _mean(len(counts) * max(counts) / sum(counts) for counts in self.layers)

    def member_imbalance(self, k: int, redundant: int | None = None, copies: list[list[int]] | None = None) -> float:
        """The busiest of k members' rows over the mean, each member E/k consecutive experts, or
        under EPLB with `redundant` replicas the placement llm_planner.cost.eplb gives (`copies`:
        each layer's replicas per expert, the same for every k, where the caller has them)."""
        if redundant is None:
            return _mean(k * max(_blocks(counts, k)) / sum(counts) for counts in self.layers)
        copies = copies or [replicas(counts, redundant) for counts in self.layers]
        return _mean(
            k * max(member_loads(counts, k, redundant, c)) / sum(counts) for counts, c in zip(self.layers, copies)
        )

    def picks(self, top_k: int) -> tuple[float, ...]:
        """Each expert's chance that one token reaches it, min(1, k s_e), sorted from the most
        reached and averaged rank by rank over the layers (module docstring)."""
        per_layer = [
            sorted((min(1.0, top_k * c / sum(counts)) for c in counts), reverse=True) for counts in self.layers
        ]
        return tuple(round(sum(col) / len(col), 6) for col in zip(*per_layer))

    def dp_imbalance(self, redundant: int | None = None) -> dict[int, float]:
        """member_imbalance for every group size that splits the experts (and EPLB's `redundant`
        replicas) evenly (k >= 2)."""
        slots = len(self.layers[0]) + (redundant or 0)
        copies = None if redundant is None else [replicas(counts, redundant) for counts in self.layers]
        sizes = (k for k in range(2, slots + 1) if slots % k == 0)
        return {k: round(self.member_imbalance(k, redundant, copies), 6) for k in sizes}


def _blocks(counts: tuple[float, ...], k: int) -> list[float]:
    size = len(counts) // k
    return [sum(counts[j * size : (j + 1) * size]) for j in range(k)]


def _mean(values) -> float:
    values = list(values)
    return max(1.0, sum(values) / len(values))


def read_expert_load(path: str, config: DecoderConfig) -> ExpertLoad:
    """The histogram in `path` for `config`'s experts; ExpertLoadError naming the file and field."""
    data = read_document(path, ExpertLoadError, finite=True)  # the loader every input file goes through
    if not config.is_moe:
        raise ExpertLoadError(f"--expert-load {path}: {config.name} has no experts (a dense model)")
    if not isinstance(data, dict) or set(data) != {"tokens_per_expert"}:
        raise ExpertLoadError(f"{path}: expected one key, tokens_per_expert (a list of counts, or one list per layer)")
    rows = data["tokens_per_expert"]
    if isinstance(rows, list) and rows and not isinstance(rows[0], list):
        rows = [rows]
    moe_layers = config.num_layers - config.first_dense_layers
    if not isinstance(rows, list) or not rows or len(rows) not in (1, moe_layers):
        raise ExpertLoadError(
            f"{path}: tokens_per_expert: expected one list of counts or {moe_layers} (one per MoE layer of "
            f"{config.name})"
        )
    return ExpertLoad(source=path, layers=tuple(_layer(path, i, row, config) for i, row in enumerate(rows)))


def _layer(path: str, i: int, row: Any, config: DecoderConfig) -> tuple[float, ...]:
    where = f"{path}: tokens_per_expert[{i}]"
    e = config.num_experts
    if not isinstance(row, list) or len(row) != e:
        raise ExpertLoadError(f"{where}: expected {e} counts ({config.name}'s experts)")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in row):
        raise ExpertLoadError(f"{where}: every count must be a finite number >= 0")
    if sum(row) <= 0:
        raise ExpertLoadError(f"{where}: no expert received a token")
    return tuple(float(x) for x in row)
