"""Several chains for Helix's engine: one chain over every machine type, or one chain per type,
whichever the model (llm_planner.helix.engine) rates higher (docs/helix.md, "Separate chains").

A chain is a layout of llm_planner.helix.search's family over some machine types; chains that
share no machine run side by side, and their decode rates add up (each keeps its own queries in
flight, admitted against its own machines' KV cache). The candidates are the best single chain
over all types (search.best_stages), and one best chain per type (Helix's "separate pipelines",
each type's chain again the best of its own family), where a type whose machines cannot hold the
model on their own is left out. Identical machines stay counts: each candidate is one or a few
exact searches, never an enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_planner.helix.engine import Estimate, Network, estimate
from llm_planner.helix.search import Kind, best_stages, count_layouts


@dataclass(frozen=True)
class Chains:
    chains: tuple[tuple, ...]  # each a tuple of Stage, unordered
    estimate: Estimate  # of all chains together
    layouts: int  # in the families searched


def combined(estimates: list[Estimate]) -> Estimate:
    """Chains side by side: rates and queries add; the round is the mean a token takes (Little's law)."""
    tokens = sum(e.tokens_per_s for e in estimates)
    queries = sum(e.queries for e in estimates)
    return Estimate(tokens_per_s=tokens, queries=queries, round_s=queries / tokens if tokens else 0.0)


def best_chains(kinds: list[Kind], num_layers: int, prompt_len: float, network: Network) -> Chains | None:
    """The better of one chain over all types and one chain per type; None when neither holds the model."""
    tables = {k.name: k.table for k in kinds}
    candidates = []
    one = best_stages(kinds, num_layers, prompt_len, network)
    if one is not None:
        candidates.append(((one,), [estimate(list(one), tables, prompt_len, network)]))
    if len(kinds) > 1:
        per_type = [best_stages([k], num_layers, prompt_len, network) for k in kinds]
        chains = tuple(c for c in per_type if c is not None)
        if chains:
            candidates.append((chains, [estimate(list(c), tables, prompt_len, network) for c in chains]))
    if not candidates:
        return None
    layouts = count_layouts(kinds, num_layers) + (len(kinds) > 1) * _product(
        count_layouts([k], num_layers) + 1 for k in kinds
    )
    chains, estimates = max(candidates, key=lambda c: combined(c[1]).tokens_per_s)
    return Chains(chains=chains, estimate=combined(estimates), layouts=layouts)


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out
