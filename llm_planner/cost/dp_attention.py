"""One mixture-of-experts decoder layer on a group of k with data-parallel attention and the
experts split over the group: the layout SGLang runs with `--enable-dp-attention` and vLLM with
`--data-parallel-size k --enable-expert-parallel` (its default all2all backend,
allgather_reducescatter).

Each member runs attention for its own share of the iteration's sequences, 1/k of them, with the
whole attention (every head; its weights held whole) and holds those sequences' KV cache alone;
the group's tokens are then gathered onto every member (an all-gather), each runs the MoE MLP on
all of them with its 1/k of the experts, and the outputs are summed back to their own member (a
reduce-scatter). Per member, on the group's load (llm_planner.cost.iteration.Load of all k
members' sequences):

    attention part   the attention sublayer's kernels on one device (k = 1) at 1/k of the load:
                     its weights read whole once, its FLOPs, activations and KV reads per token
                     divided by k
    MLP part         the MLP sublayer's kernels on a member of k (llm_planner.cost.iteration), all
                     tokens: the router, 1/k of the shared expert, the routed experts' GEMMs on a
                     k-th of the rows, reading the weights of the experts they reach among its own
    collectives      in place of the MLP's all-reduce, an all-gather and a reduce-scatter of h b
                     bytes per token: each (k - 1)/k of the bytes over the link and one call with
                     its k - 1 hop latencies, the two together the all-reduce's bytes with one more
                     call (a tensor-parallel layer's two all-reduces move twice the bytes)

Whole experts on each member (expert parallelism) read, under uniform routing, the same expected
weights on the same rows as every member holding 1/k of every expert's width, which is how the MLP
part is timed: the group must split the experts evenly (k divides their count) and, as the MLP
part's kernels ask, their width. The sequences are taken to split evenly over the members (an
engine balances them; the busiest member may hold one more).

Memory per member: the layer's weights with the MLP's split over k and the rest whole
(`member_weight_bytes`), and 1/k of the sequences' KV cache at the whole cache per sequence: for
latent attention (llm_planner.graph.mla) that is the latent 1/k of the sequences hold, where a
tensor-parallel member holds every sequence's.
"""

from __future__ import annotations

import dataclasses

from llm_planner.core.precision import Precision
from llm_planner.core.spec import DeviceKindSpec, LinkSpec
from llm_planner.cost.iteration import Kernel, LayerKernels, sublayer_kernels
from llm_planner.cost.roofline import CostError
from llm_planner.graph.transformer import DecoderConfig


def dp_offered(config: DecoderConfig, k: int) -> bool:
    """Whether a group of k may run the layer with data-parallel attention: k > 1, a mixture of
    experts whose experts split evenly over the k (and whose MLP widths do, as its kernels ask)."""
    if k < 2 or not config.is_moe or config.num_experts % k:
        return False
    widths = (config.moe_intermediate_size, *((config.shared_expert_size,) if config.shared_expert_size else ()))
    return all(w % k == 0 for w in widths)


def dp_layer_kernels(
    config: DecoderConfig,
    dtype: str | Precision,
    kind: DeviceKindSpec,
    k: int,
    link: LinkSpec | None,
    imbalance: float = 1.0,
) -> LayerKernels:
    """The kernels of one layer on each member of a group of k with data-parallel attention
    (module docstring); CostError where the layer does not split so (dp_offered) or no link joins
    the group. A dense layer of an MoE model (DeepSeek's first ones) runs likewise, its MLP split."""
    if k < 2 or link is None or (config.is_moe and not dp_offered(config, k)):
        raise CostError(
            f"a decoder layer of {config.name} cannot run data-parallel attention on a group of {k} "
            "(it needs k > 1 devices joined by a link over which the experts split evenly)"
        )
    attn = sublayer_kernels(config, dtype, kind, "attn", 1, None)
    mlp = sublayer_kernels(config, dtype, kind, "mlp", k, link, imbalance)
    own = tuple(_own_share(kernel, k) for kernel in attn.kernels)
    gathered = tuple(
        _gather_scatter(kernel, kind.collective_call_s) if kernel.collective else kernel for kernel in mlp.kernels
    )
    return dataclasses.replace(mlp, kernels=own + gathered)


def _own_share(kernel: Kernel, k: int) -> Kernel:
    """An attention kernel of one device at 1/k of the group's load: its fixed part (weights) whole."""
    flops, size = kernel.flops, kernel.bytes
    return dataclasses.replace(
        kernel,
        name=f"{kernel.name}_own" if kernel.name in ("linear", "elementwise") else kernel.name,
        flops=(flops[0], *(x / k for x in flops[1:])),
        bytes=(size[0], *(x / k for x in size[1:])),
    )


def _gather_scatter(all_reduce: Kernel, call_s: float) -> Kernel:
    """The MLP's all-reduce as an all-gather and a reduce-scatter: the same bytes, one call more."""
    return dataclasses.replace(
        all_reduce, name="all_gather_reduce_scatter", flops=(all_reduce.flops[0] + call_s, *all_reduce.flops[1:])
    )


def member_weight_bytes(
    config: DecoderConfig, dtype: str | Precision, kind: DeviceKindSpec, k: int, link: LinkSpec, whole_bytes: float
) -> float:
    """A member's bytes of one layer's weights whose whole is `whole_bytes` (the layer task's):
    everything but the MLP whole, the MLP's split part 1/k (read off its kernels at 1 and at k)."""
    return whole_bytes - (
        _mlp_weight_bytes(config, dtype, kind, 1, None) - _mlp_weight_bytes(config, dtype, kind, k, link)
    )


def _mlp_weight_bytes(config: DecoderConfig, dtype, kind: DeviceKindSpec, k: int, link: LinkSpec | None) -> float:
    """The MLP sublayer's weight bytes on a member of k: its linear kernel's weights and every expert's."""
    total = 0.0
    for kernel in sublayer_kernels(config, dtype, kind, "mlp", k, link).kernels:
        if kernel.name == "linear":
            total += kernel.bytes[0]
        if kernel.experts is not None:
            total += kernel.experts[0] * kernel.experts[2]
    return total
