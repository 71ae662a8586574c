"""A plan or a layout file scored by the replay of Helix's engine (llm_planner.helix.replay), each
deployment on its own cluster file, their rates summed (docs/helix.md, "The engine, replayed").

The replay needs what the routed estimate needs (Helix's routing statistics, llm_planner.helix.typical)
and each type's prompt profile; the request lengths are Helix's own trace when the checkout that holds
the model folder has it (llm_planner.helix.lengths), else uniform draws with the mean prompt given and
the trace's mean output. Nothing here is run for plans whose files lack the statistics (None).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llm_planner.helix.chains import combined
from llm_planner.helix.engine import Estimate
from llm_planner.helix.replay_graph import OUTPUT_LEN, replay_estimate, replay_graph
from llm_planner.helix.simulator_file import simulator_hops

if TYPE_CHECKING:
    from llm_planner.helix.plan import HelixInputs, HelixPlan


@dataclass(frozen=True, kw_only=True)
class Replayed:
    estimate: Estimate
    lengths: str  # where the request lengths came from
    seconds: float  # the replay's wall time


def replay_plan(plan: HelixPlan, inputs: HelixInputs, prompt_len: float) -> Replayed | None:
    """The plan's decode tokens/s under the replay, each chain its own deployment."""
    if inputs.guesses is None or inputs.prompts is None:
        return None
    started, parts = time.monotonic(), []
    for chain in range(len(plan.chain_sizes or (1,))):
        cluster, triples = plan.deployment(inputs, chain)
        ranges = {node: (a, b) for node, a, b in triples}
        parts.append(_replay(ranges, cluster, inputs, prompt_len, inputs.rates_for(cluster), None))
    return _said(combined(parts), inputs, prompt_len, started)


def replay_layout(
    inputs: HelixInputs, ranges: dict[str, tuple[int, int]], prompt_len: float, simulator_cluster: str | Path | None
) -> Replayed | None:
    """A layout's decode tokens/s under the replay, run as one deployment on the inputs' cluster
    (over the links of Helix's own simulator cluster file when given)."""
    if inputs.guesses is None or inputs.prompts is None:
        return None
    started = time.monotonic()
    hops = simulator_hops(simulator_cluster) if simulator_cluster else None
    found = _replay(ranges, inputs.cluster, inputs, prompt_len, inputs.rates, hops)
    return _said(found, inputs, prompt_len, started)


def _replay(ranges, cluster, inputs: HelixInputs, prompt_len: float, rates, hops) -> Estimate:
    act = inputs.network.activation_bytes
    graph = replay_graph(ranges, cluster, inputs.tables, inputs.prompts, inputs.num_layers, act, rates, hops)
    return replay_estimate(graph, inputs.lengths or (prompt_len, OUTPUT_LEN))


def _said(found: Estimate, inputs: HelixInputs, prompt_len: float, started: float) -> Replayed:
    if inputs.lengths is not None:
        lengths = f"Helix's trace ({len(inputs.lengths.prompts):,} requests)"
    else:
        lengths = (
            f"uniform draws, mean prompt {prompt_len:g} and output {OUTPUT_LEN:g} tokens (Helix's trace not found)"
        )
    return Replayed(estimate=found, lengths=lengths, seconds=time.monotonic() - started)
