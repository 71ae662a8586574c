"""Megatron-style tensor-parallel primitives over torch (Shoeybi et al. 2019, "Megatron-LM", sec. 3):
a member's part of a linear layer or of a vocabulary table, and the collective that completes it.

    ColumnParallelLinear     Y_i = X A_i + b_i           the member's output features; no collective
    RowParallelLinear        Y = sum_i X_i A_i + b       the member's input features; one all-reduce,
                                                         then the (replicated) bias, once
    VocabParallelEmbedding   E[ids] = sum_i E_i[ids]     the member's vocabulary rows, zeros for ids
                                                         outside them; one all-reduce
    VocabParallelArgmax      argmax_v (h W^T)_v          the member's vocabulary rows; each member's
                                                         best (logit, index) all-gathered, the largest
                                                         wins (the smallest index among equal ones,
                                                         as torch.argmax)

Which tensors of a task take which primitive is declared in llm_planner.graph.tp_layout; the
shares are wired into decoder tasks in llm_planner.runtime.tp_layers. `ops` is the group:
llm_planner.runtime.comm.GroupComm under MPI, or any object with `size`, `index`,
`all_reduce_(t)` (sum over the members, in place) and `all_gather(t)` ([size, *t.shape] in
float32, in member order). Weights are in torch's (out_features, in_features) layout and are
frozen (the runtime only infers).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def frozen(t: torch.Tensor | None) -> torch.nn.Parameter | None:
    """`t` as a parameter that never requires grad (None stays None)."""
    return None if t is None else torch.nn.Parameter(t, requires_grad=False)


class ColumnParallelLinear(torch.nn.Module):
    """The member's output features of one or more linears of the same input (q, k and v; gate and
    up), run as one matrix product; `forward` returns each linear's part in order."""

    def __init__(self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]):
        super().__init__()
        assert len(weights) == len(biases) >= 1
        self.sizes = [int(w.shape[0]) for w in weights]
        self.weight = frozen(torch.cat(list(weights), dim=0) if len(weights) > 1 else weights[0])
        present = [b is not None for b in biases]
        assert all(present) or not any(present), "biases on some of the fused linears only"
        self.bias = frozen(torch.cat(list(biases)) if len(biases) > 1 else biases[0]) if all(present) else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


class RowParallelLinear(torch.nn.Module):
    """The member's input features of a linear: its partial product, summed over the group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, ops):
        super().__init__()
        self.ops = ops
        self.weight = frozen(weight)
        self.bias = frozen(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ops.all_reduce_(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(torch.nn.Module):
    """Rows [lo, lo + len(rows)) of a token table: each member looks up the ids in its rows."""

    def __init__(self, rows: torch.Tensor, lo: int, ops):
        super().__init__()
        self.ops, self.lo = ops, int(lo)
        self.weight = frozen(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = self.weight.shape[0]
        local = ids - self.lo
        outside = (local < 0) | (local >= n)
        out = F.embedding(local.clamp(0, n - 1), self.weight).masked_fill(outside[..., None], 0.0)
        return self.ops.all_reduce_(out)


class VocabParallelArgmax(torch.nn.Module):
    """Rows [lo, lo + len(rows)) of an LM head: the greedy token of each sequence's last position."""

    def __init__(self, rows: torch.Tensor, lo: int, ops):
        super().__init__()
        self.ops, self.lo = ops, int(lo)
        self.weight = frozen(rows)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden[:, -1, :], self.weight).to(torch.float32)
        index = torch.argmax(logits, dim=-1)
        mine = torch.stack([logits.gather(1, index[:, None])[:, 0], (index + self.lo).to(torch.float32)], dim=1)
        every = self.ops.all_gather(mine)  # [k, B, 2], members in vocabulary order
        best = every[:, :, 0].max(dim=0).values
        first = torch.argmax((every[:, :, 0] == best).to(torch.int8), dim=0)  # the first member holding the maximum
        return every[first, torch.arange(every.shape[1], device=every.device), 1].to(torch.long)
