"""Several chains for Helix's engine, each run as its own Helix deployment
(llm_planner.helix.deployments; docs/helix.md, "Separate chains").

A chain is a layout of llm_planner.helix.search's family over some machines; chains that share
no machine run side by side, and their decode rates add up (each keeps its own queries in
flight, admitted against its own machines' KV cache). `candidate_chains` gives the candidates:
the best single chain over all types (search.best_stages); one best chain per type (Helix's
"separate pipelines", each type's chain again the best of its own family, a type whose machines
cannot hold the model on their own left out); and, for every k from 2 up to the copies of the
model the machines can hold (at most MAX_SPLIT), k chains that each take 1/k of every type's
machines (the remainders to the first chains), each the best of its family: narrower stages,
which Helix's max flow cannot leave half idle. llm_planner.helix.plan picks among them by the
estimate routed as Helix routes (llm_planner.helix.flow); `best_chains` is the chain model's
pick. Identical machines stay counts: each candidate is a few exact searches, never an
enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_planner.helix.engine import Estimate, Network, estimate
from llm_planner.helix.search import Kind, best_stages, count_layouts

MAX_SPLIT = 8  # the most equal chains (each 1/k of every type's machines) tried


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


def candidate_chains(kinds: list[Kind], num_layers: int, prompt_len: float, network: Network) -> list[Chains]:
    """Every candidate (module docstring): one chain over all types, one chain per type, and k
    chains that each take 1/k of every type's machines, for each k the machines can hold."""
    tables = {k.name: k.table for k in kinds}
    out = []
    one = best_stages(kinds, num_layers, prompt_len, network)
    if one is not None:
        out.append(_chains((one,), tables, prompt_len, network, count_layouts(kinds, num_layers)))
    if len(kinds) > 1:
        per_type = [best_stages([k], num_layers, prompt_len, network) for k in kinds]
        chains = tuple(c for c in per_type if c is not None)
        if chains:
            layouts = _product(count_layouts([k], num_layers) + 1 for k in kinds)
            out.append(_chains(chains, tables, prompt_len, network, layouts))
    most = min(MAX_SPLIT, sum(k.machines * k.table.max_layers for k in kinds) // num_layers)
    searched: dict[tuple, tuple | None] = {}  # equal shares are searched once

    def best_of(share: list[Kind]) -> tuple | None:
        key = tuple((k.name, k.machines) for k in share)
        if key not in searched:
            searched[key] = best_stages(share, num_layers, prompt_len, network)
        return searched[key]

    for parts in range(2, most + 1):
        shares = [
            [Kind(k.name, k.machines // parts + (i < k.machines % parts), k.table) for k in kinds] for i in range(parts)
        ]
        shares = [[k for k in share if k.machines] for share in shares]
        chains = tuple(best_of(share) for share in shares)
        if all(c is not None for c in chains):
            layouts = sum(count_layouts(share, num_layers) for share in shares)
            out.append(_chains(chains, tables, prompt_len, network, layouts))
    return out


def _chains(chains: tuple[tuple, ...], tables, prompt_len: float, network: Network, layouts: int) -> Chains:
    estimates = [estimate(list(c), tables, prompt_len, network) for c in chains]
    return Chains(chains=chains, estimate=combined(estimates), layouts=layouts)


def best_chains(kinds: list[Kind], num_layers: int, prompt_len: float, network: Network) -> Chains | None:
    """The candidate the chain model rates highest; None when none holds the model."""
    found = candidate_chains(kinds, num_layers, prompt_len, network)
    return max(found, key=lambda c: c.estimate.tokens_per_s, default=None)


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out
