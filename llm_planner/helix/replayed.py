"""A plan or a layout file scored by the replay of Helix's engine (llm_planner.helix.replay), each
deployment on its own cluster file, their rates summed (docs/helix.md, "The engine, replayed").

`plan_by_replay` chooses among plan-helix's candidates (llm_planner.helix.plan.helix_candidates) by
the replay: the routed estimate ranks them, and those within REPLAY_SHARE of the best are replayed
(the replay takes seconds a deployment, too long for every candidate of a large cluster); the one
the replay rates highest is the plan.

The replay needs what the routed estimate needs (Helix's routing statistics, llm_planner.helix.typical)
and each type's prompt profile; the request lengths are Helix's own trace when the checkout that holds
the model folder has it (llm_planner.helix.lengths), else uniform draws with the mean prompt given and
the trace's mean output. Nothing here is run for plans whose files lack the statistics (None).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from llm_planner.helix.chains import combined
from llm_planner.helix.engine import Estimate
from llm_planner.helix.lengths import Lengths
from llm_planner.helix.plan import HelixInputs, HelixPlan, helix_candidates
from llm_planner.helix.replay import replay
from llm_planner.helix.replay_graph import replay_graph

OUTPUT_LEN = 232.4  # mean output tokens of the Azure Conversation trace Helix's offline runs draw from
REPLAY_SHARE = 0.8  # candidates whose routed estimate is at least this share of the best one are replayed


@dataclass(frozen=True, kw_only=True)
class Replayed:
    estimate: Estimate
    lengths: str  # where the request lengths came from
    seconds: float  # the replay's wall time
    candidates: int = 1  # plans replayed to choose this one


def plan_by_replay(
    inputs: HelixInputs, prompt_len: float, order: str, regions: str
) -> tuple[HelixPlan, Replayed | None]:
    """plan-helix's plan chosen by the replay among the candidates the routed estimate rates within
    REPLAY_SHARE of its best (module docstring); the routed choice, not replayed, when Helix's
    files lack what the replay needs."""
    candidates = helix_candidates(inputs, prompt_len, order, regions)
    routed = max(candidates, key=lambda c: c.estimate.tokens_per_s)
    if not _replayable(inputs):
        return routed, None
    near = [c for c in candidates if c.estimate.tokens_per_s >= REPLAY_SHARE * routed.estimate.tokens_per_s]
    started, scored = time.monotonic(), [(replay_plan(c, inputs, prompt_len), c) for c in near]
    found, plan = max(scored, key=lambda pair: pair[0].estimate.tokens_per_s)
    return plan, replace(found, seconds=time.monotonic() - started, candidates=len(near))


def replay_plan(plan: HelixPlan, inputs: HelixInputs, prompt_len: float) -> Replayed | None:
    """The plan's decode tokens/s under the replay, each chain its own deployment."""
    if not _replayable(inputs):
        return None
    started, parts = time.monotonic(), []
    for chain in range(len(plan.chain_sizes or (1,))):
        cluster, triples = plan.deployment(inputs, chain)
        ranges = {node: (a, b) for node, a, b in triples}
        parts.append(_replay(ranges, cluster, inputs, prompt_len, inputs.rates_for(cluster), None))
    return _said(combined(parts), inputs, prompt_len, started)


def replay_layout(
    inputs: HelixInputs,
    ranges: dict[str, tuple[int, int]],
    prompt_len: float,
    hops: dict[tuple[str, str], float] | None = None,
) -> Replayed | None:
    """A layout's decode tokens/s under the replay, run as one deployment on the inputs' cluster
    (over `hops`, the links of Helix's own simulator cluster file, llm_planner.helix.simulator_file,
    when given)."""
    if not _replayable(inputs):
        return None
    started = time.monotonic()
    found = _replay(ranges, inputs.cluster, inputs, prompt_len, inputs.rates, hops)
    return _said(found, inputs, prompt_len, started)


def _replayable(inputs: HelixInputs) -> bool:
    """Whether Helix's files state what the replay needs: its routing statistics and prompt profiles."""
    return inputs.guesses is not None and inputs.prompts is not None


def _replay(ranges, cluster, inputs: HelixInputs, prompt_len: float, rates, hops) -> Estimate:
    act = inputs.network.activation_bytes
    graph = replay_graph(ranges, cluster, inputs.tables, inputs.prompts, inputs.num_layers, act, rates, hops)
    return replay_estimate(graph, inputs.lengths or (prompt_len, OUTPUT_LEN))


def replay_estimate(graph, lengths: Lengths | tuple[float, float]) -> Estimate:
    """The replay's decode tokens/s as an Estimate (queries: mean in flight; round: a decode's mean trip)."""
    found = replay(graph, lengths)
    return Estimate(tokens_per_s=found.tokens_per_s, queries=found.queries, round_s=found.trip_s)


def _said(found: Estimate, inputs: HelixInputs, prompt_len: float, started: float) -> Replayed:
    if inputs.lengths is not None:
        lengths = f"Helix's trace ({len(inputs.lengths.prompts):,} requests)"
    else:
        lengths = (
            f"uniform draws, mean prompt {prompt_len:g} and output {OUTPUT_LEN:g} tokens (Helix's trace not found)"
        )
    return Replayed(estimate=found, lengths=lengths, seconds=time.monotonic() - started)
