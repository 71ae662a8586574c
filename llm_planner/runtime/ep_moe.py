"""A member's share of a mixture-of-experts MLP in a group with data-parallel attention: the routed
experts split over the group (expert parallelism), as the planner costs a `dpaK` group
(llm_planner.cost.dp_attention) and as vLLM runs `--data-parallel-size k --enable-expert-parallel`
with its allgather_reducescatter all-to-all. On x [T_i, h], member i's own tokens (T_i may be 0: a
member with nothing to run still takes part in the group's collectives):

    counts   every member's T (an all-gather of one number)
    gather   every member's tokens onto every member, in member order: X [N, h], N the sum of the T
    router   whole on every member: each token's top-k experts and weights (moe_layers.MoEShard.route),
             the same on every member, since X and the router are
    experts  the member's E/k experts, whole, on the rows of X routed to them: member i holds experts
             [i E/k, (i + 1) E/k)
    scatter  the partial outputs summed over the group, each member keeping its own T_i rows (a
             reduce-scatter)
    shared   (qwen2_moe) the shared expert and its gate whole, on the member's own tokens

So a member's output is the whole layer's on its own tokens: each expert's contribution to a token
is computed once, by the member holding the expert, from the routing the whole model makes. The
collectives come from `ops` (llm_planner.runtime.comm.GroupComm under MPI: `all_gather`,
`all_gather_v`, `reduce_scatter_v`).
"""

from __future__ import annotations

import torch

from llm_planner.graph.transformer import DecoderConfig
from llm_planner.runtime.decoder_tasks import DecoderError
from llm_planner.runtime.moe_layers import MoEShard


def expert_range(cfg: DecoderConfig, k: int, index: int) -> range:
    """The experts member `index` of a group of k holds; DecoderError unless k divides their count."""
    if cfg.num_experts % k:
        raise DecoderError(f"model {cfg.name!r}: its {cfg.num_experts} experts do not split over a group of {k}")
    per = cfg.num_experts // k
    return range(index * per, (index + 1) * per)


def holds(cfg: DecoderConfig, k: int, index: int):
    """Which declared weights of a block member `index` reads: all but the routed experts of the others."""
    mine = expert_range(cfg, k, index)

    def keep(name: str) -> bool:
        return not name.startswith("experts.") or int(name.split(".")[1]) in mine

    return keep


class ExpertParallelMoE(MoEShard):
    """The member's experts whole, the router and shared expert whole (module docstring)."""

    def __init__(self, cfg: DecoderConfig, t: dict[str, torch.Tensor], ops, *, renormalise: bool):
        super().__init__(cfg, t, ops, renormalise=renormalise, experts=expert_range(cfg, ops.size, ops.index))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        # the counts on the host: one host copy, read once (no device syncs on CUDA)
        counts = [int(c) for c in self.ops.all_gather(torch.tensor([float(x.shape[0])]))[:, 0].tolist()]
        every = self.ops.all_gather_v(x, counts).to(x.dtype)
        out = self.ops.reduce_scatter_v(self.routed(every), counts)
        if self.shared is not None:
            out += self.shared_part(x)
        return out.reshape(shape)
