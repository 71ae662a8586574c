"""An MoE layer's MLP (llm_planner.graph.moe) in one engine iteration, on each member of a
tensor-parallel group of k: the sizes llm_planner.cost.iteration turns into kernels.

With experts tensor-parallel (vLLM and SGLang without expert parallelism: every member holds
1/k of every expert's width m, and of the shared expert's s; the router replicated) a layer's MLP
runs, per token, besides its norm and residual add:

    linear    the router (h E, replicated) and the shared expert (3 h s / k, and its gate h):
              FLOPs 2 per weight per token, weights read once per iteration
    experts   the routed experts' GEMMs on T k rows for T tokens: FLOPs 2 (3 h m / k) per row,
              activations (h + 2 m / k) + (m / k + h) per row in and out; weights 3 h m / k
              bytes-per-weight per expert read once for each expert the iteration's tokens reach,
              E (1 - (1 - k_top / E)^T) of them under uniform routing (graph.moe.experts_touched)
    elementwise  the router's softmax and top-k (2 E), the activation of each routed row
              (3 m / k) and of the shared expert's (3 s / k), the weighted sum of the top-k outputs
              ((k_top + 1) h)

and one all-reduce of the routed and shared outputs' sum, as a dense MLP's. `imbalance` (>= 1,
default 1.0: uniform routing) scales the expert GEMMs' rows: the iteration's experts wait for
the busiest, which receives imbalance times the mean T k_top / E rows, so the GEMMs are charged
as if every expert had the busiest one's rows (FLOPs and activations; weights are read once
either way).
"""

from __future__ import annotations

from typing import Any

from llm_planner.graph.moe import moe_parameters, shared_gate


def moe_linear_sizes(cfg: Any, k: int) -> tuple[float, float, float]:
    """(linear parameters per member, activations in and out per token, elementwise elements per
    token besides the norm and residual add) of the router and shared expert (module docstring)."""
    h, e, s, m = cfg.hidden_size, cfg.num_experts, cfg.shared_expert_size, cfg.moe_intermediate_size
    p = moe_parameters(cfg)
    gate = h if shared_gate(cfg) else 0  # the shared expert's sigmoid gate (qwen2_moe), replicated
    params = p["router"] + (p["shared"] - gate) / k + gate
    io = (h + e) + ((h + 2 * s / k) + (s / k + h) + (h + 1) * bool(gate) if s else 0.0)
    elementwise = 2 * e + cfg.experts_per_token * 3 * m / k + 3 * s / k + (cfg.experts_per_token + 1) * h
    return params, io, elementwise


def expert_sizes(cfg: Any, k: int, imbalance: float) -> tuple[float, float, float]:
    """(FLOPs per token, activation elements per token, parameters of one expert per member) of
    the routed experts' GEMMs (module docstring)."""
    h, m, top_k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.experts_per_token
    per_expert = 3 * h * m / k
    rows = top_k * imbalance
    return 2 * per_expert * rows, rows * ((h + 2 * m / k) + (m / k + h)), per_expert


def check_picks(picks: Any) -> tuple[float, ...]:
    """A measured router's chances (graph.moe.experts_touched) as a tuple; ValueError unless a
    non-empty list of numbers from 0 to 1."""
    chance = lambda q: not isinstance(q, bool) and isinstance(q, (int, float)) and 0.0 <= q <= 1.0  # noqa: E731
    if not isinstance(picks, (list, tuple)) or not picks or not all(chance(q) for q in picks):
        raise ValueError("expected a list of chances from 0 to 1 that one token reaches each routed expert")
    return tuple(float(q) for q in picks)


def check_imbalance(imbalance: Any) -> float:
    """The expert imbalance factor as a float; ValueError unless a finite number >= 1."""
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) or not 1.0 <= imbalance < float("inf"):
        raise ValueError(f"the experts' imbalance factor must be a number >= 1 (1: uniform routing), got {imbalance!r}")
    return float(imbalance)
