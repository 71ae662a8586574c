"""One decoder layer of a mixture of experts on a group of k with data-parallel attention and the
routed experts split over the group (expert parallelism): the layout vLLM runs with
`--data-parallel-size k --enable-expert-parallel` (its default all2all backend,
allgather_reducescatter) and SGLang with `--enable-dp-attention --ep-size k`.

Each member is a data-parallel rank: it runs its own share of the iteration's sequences, 1/k of
them, through everything but the routed experts with the weights whole (attention with every
head, the norms, the router, the shared expert; a dense layer whole), and holds those sequences'
KV cache alone. Before the routed experts the group's tokens are gathered onto every member (an
all-gather), each runs the experts it holds, E/k of them, on all the tokens, and the outputs are
summed back to their own member (a reduce-scatter). Per member, on the group's load
(llm_planner.cost.iteration.Load of all k members' sequences):

    own part         the layer's kernels on one device (k = 1) but the routed experts, at 1/k of
                     the load: weights read whole once, FLOPs, activations and KV reads per token
                     divided by k
    routed experts   the experts kernel of a member of k (llm_planner.cost.iteration), all tokens:
                     the GEMMs on a k-th of the rows, reading the weights of the experts they reach
                     among its own
    collectives      an all-gather and a reduce-scatter of h b bytes per token: each (k - 1)/k of
                     the bytes over the link and one call with its k - 1 hop latencies (a
                     tensor-parallel layer's two all-reduces move twice the bytes)

A dense layer of such a model (DeepSeek's first ones) is the own part alone, without collectives.
This is vLLM's layout; SGLang splits the shared expert, the dense layers' MLP and the head over the
group instead (tensor-parallel on the gathered tokens): it holds and reads less than this model
charges, so a plan made with it holds on either engine.

A group may span j whole servers of n devices each (k = j n; vLLM's and SGLang's data-parallel
ranks across nodes): each collective is then hierarchical, the (n - 1)/k of the bytes from the
members of its own server over the server's link and the (k - n)/k from the other servers over the
link between servers (each member its own port, as on servers with a NIC per GPU), one call with
n - 1 hops inside and j - 1 between.

With `all2all="deepep_low_latency"` (vLLM's `--all2all-backend deepep_low_latency`, SGLang's
`--moe-a2a-backend deepep`; DeepEP's low-latency kernels, public repository deepseek-ai/DeepEP)
the two collectives are a dispatch and a combine instead: each token goes to the members holding
its top-k experts only, one message per (token, expert) pair, of h bytes in fp8 with a 4-byte scale
per 128 values where the experts compute in fp8 (else h activation bytes), and comes back as h
activation bytes (combine). Under uniform routing a member gets top-k / k of a token's pairs: per
token of the group, top-k (n - 1) / k^2 pairs cross the server's link and top-k (k - n) / k^2 the
link between servers, at the links' full bandwidth; each call costs DEEPEP_LL_CALL_S, and a rank's
tokens go in calls of at most MOE_DP_CHUNK tokens (vLLM's VLLM_MOE_DP_CHUNK_SIZE). Where a group
spans servers this moves top-k / k of what the gather does per token, at top-k 8 and k 16 a
quarter of the bytes between servers. The busiest member receives `imbalance` times the mean
share of the pairs (a routing histogram's member factor, llm_planner.serving.expert_load). DeepEP
needs NVLink between every pair of a server's GPUs and RDMA between servers; the spec cannot say
so, the user asks for it.

Whole experts on each member read, under uniform routing, the same expected weights on the same
rows as every member holding 1/k of every expert's width, which is how the routed experts are
timed: the group must split the experts evenly (k divides their count and, as the kernels ask,
their width). The sequences are taken to split evenly over the members (an engine balances them;
the busiest member may hold one more).

With expert-parallel load balancing (`redundant`, llm_planner.cost.eplb: the engine's
`--enable-eplb` with R redundant experts) the group holds E + R replicas, (E + R) / k a member (k
must divide E + R instead of E), and the caller passes the replicas' chances as `picks`
(cost.eplb.replica_picks) and their busiest member's factor as `imbalance`.

Memory per member: the layer's weights whole but 1/k of the routed experts, (E + R) / (E k) of
them with R redundant (`member_weight_bytes`), and 1/k of the sequences' KV cache at the whole
cache per sequence: for
latent attention (llm_planner.graph.mla) that is the latent 1/k of the sequences hold, where a
tensor-parallel member holds every sequence's.
"""

from __future__ import annotations

import dataclasses

from llm_planner.core.precision import Precision, as_precision, linear_dtype
from llm_planner.core.spec import DeviceKindSpec, LinkSpec
from llm_planner.cost.iteration import Kernel, LayerKernels, layer_kernels, sublayer_kernels
from llm_planner.cost.roofline import CostError
from llm_planner.graph.transformer import DecoderConfig

# The expert all-to-all a group of data-parallel attention runs (module docstring); the first is
# vLLM's default, the names are vLLM's --all2all-backend values.
ALL2ALL = ("allgather_reducescatter", "deepep_low_latency")
# One DeepEP low-latency dispatch or combine call's fixed time: fitted (least median error) with the
# links at their data-sheet bandwidth on DeepEP's published low-latency table (docs/legacy.md of
# deepseek-ai/DeepEP: H800, NVLink ~160-200 GB/s, CX7 400 Gb/s, 128 tokens a rank, hidden 7168,
# top-8, EP 8-256; benchmarks/bench_all2all.py prints the fit against each row).
DEEPEP_LL_CALL_S = 45e-6
MOE_DP_CHUNK = 256  # tokens a rank dispatches per call (vLLM's VLLM_MOE_DP_CHUNK_SIZE default)
# the most decodes a rank may hold: SGLang's low-latency buffer (SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK)
# takes a rank's decode batch whole and must stay within 1,024 (DeepEP's low-latency dispatch between
# servers counts a rank's tokens below it)
DEEPEP_MAX_RANK_DECODES = 1024
FP8_SCALE_BYTES = 4 / 128  # DeepEP's fp8 dispatch: a float32 scale per 128 values


def dp_offered(config: DecoderConfig, k: int, redundant: int | None = None) -> bool:
    """Whether a group of k may run the layer with data-parallel attention: k > 1, a mixture of
    experts whose experts (with `redundant` replicas more, under EPLB) split evenly over the k (and
    whose MLP widths do, as its kernels ask)."""
    if k < 2 or not config.is_moe or (config.num_experts + (redundant or 0)) % k:
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
    span: tuple[int, LinkSpec] | None = None,
    all2all: str = ALL2ALL[0],
    picks: tuple[float, ...] | None = None,
    redundant: int | None = None,
) -> LayerKernels:
    """The kernels of one layer on each member of a group of k with data-parallel attention
    (module docstring), `span` = (devices a server, the link between servers) for a group over
    whole servers, its experts' tokens moved by `all2all` (one of ALL2ALL), a measured router's
    `picks` (graph.moe.experts_touched; None: uniform; under EPLB with `redundant` replicas, the
    replicas'); CostError where the layer does not split so (dp_offered) or no link joins the
    group. A dense layer of an MoE model (DeepSeek's first ones) is its own part alone."""
    if k < 2 or link is None or (config.is_moe and not dp_offered(config, k, redundant)):
        raise CostError(
            f"a decoder layer of {config.name} cannot run data-parallel attention on a group of {k} "
            "(it needs k > 1 devices joined by a link over which the experts split evenly)"
        )
    whole = layer_kernels(config, dtype, kind, 1, None, imbalance, picks)
    own = tuple(_own_share(kernel, k) for kernel in whole.kernels if kernel.experts is None)
    if not config.is_moe:
        return dataclasses.replace(whole, kernels=own)
    mlp = sublayer_kernels(config, dtype, kind, "mlp", k, link, imbalance, picks)
    experts = tuple(kernel for kernel in mlp.kernels if kernel.experts is not None)
    if all2all not in ALL2ALL:
        raise CostError(f"all2all must be one of {', '.join(ALL2ALL)}, got {all2all!r}")
    token_bytes = config.hidden_size * as_precision(dtype).activation_bytes
    if all2all == "deepep_low_latency":
        pair_bytes = _dispatch_bytes(config, as_precision(dtype), kind) + token_bytes
        scale = kind.collective_bw_efficiency  # DeepEP reaches the links' data-sheet bandwidth
        # the busiest member receives `imbalance` times the mean share of the pairs
        collectives = _dispatch_combine(pair_bytes * scale * imbalance, config.experts_per_token, k, link, span)
    else:
        collectives = _gather_scatter(token_bytes, k, kind.collective_call_s, link, span)
    return dataclasses.replace(mlp, kernels=own + experts + (collectives,), w8a8_s=whole.w8a8_s)


def _dispatch_bytes(config: DecoderConfig, precision: Precision, kind: DeviceKindSpec) -> float:
    """Bytes of one (token, expert) pair's dispatch: fp8 with its scales where the experts compute
    in fp8 on the kind, else the activations (module docstring)."""
    h = config.hidden_size
    if linear_dtype(precision, kind.peak_dtypes)[0] == "fp8":
        return h * (1 + FP8_SCALE_BYTES)
    return h * precision.activation_bytes


def _dispatch_combine(
    pair_bytes: float, top_k: int, k: int, link: LinkSpec, span: tuple[int, LinkSpec] | None
) -> Kernel:
    """DeepEP's low-latency dispatch and combine over the group (module docstring) as a collective
    kernel: two calls per chunk of tokens, and per token of the group the bytes of its pairs that
    leave each member (those between servers weighted by how much slower their link is)."""
    size = pair_bytes * _pairs_out(top_k, k, link, span)
    return Kernel(
        "dispatch_combine",
        (2 * DEEPEP_LL_CALL_S, 0.0, 0.0, 0.0, 0.0),
        (0.0, size, 0.0, size, 0.0),
        collective=True,
        chunk=MOE_DP_CHUNK * k,
    )


def _own_share(kernel: Kernel, k: int) -> Kernel:
    """A kernel of one device at 1/k of the group's load: its fixed part (weights) whole."""
    flops, size = kernel.flops, kernel.bytes
    return dataclasses.replace(
        kernel, flops=(flops[0], *(x / k for x in flops[1:])), bytes=(size[0], *(x / k for x in size[1:]))
    )


def _gather_scatter(
    token_bytes: float, k: int, call_s: float, link: LinkSpec, span: tuple[int, LinkSpec] | None
) -> Kernel:
    """The all-gather and the reduce-scatter of every token's h b bytes over the group (module
    docstring), as a collective kernel: its fixed time in the FLOPs slot, its bytes per token as
    they cost over `link` (the bytes between servers weighted by how much slower their link is)."""
    per_server, across = span if span is not None else (k, link)
    hops = (per_server - 1) * link.latency_s + (k // per_server - 1) * across.latency_s
    size = 2 * _others_share(k, link, span) * token_bytes
    return Kernel(
        "all_gather_reduce_scatter",
        (2 * (call_s + hops), 0.0, 0.0, 0.0, 0.0),
        (0.0, size, 0.0, size, 0.0),
        collective=True,
    )


def _others_share(k: int, link: LinkSpec, span: tuple[int, LinkSpec] | None) -> float:
    """The share of a group's members that are another one's, (k - 1)/k, in `link`'s bytes: those
    on other servers weighted by how much slower the link between servers is (module docstring)."""
    per_server, across = span if span is not None else (k, link)
    inside, outside = (per_server - 1) / k, (k - per_server) / k
    return inside + (outside * link.bw_bytes_per_s / across.bw_bytes_per_s if outside else 0.0)


def _pairs_out(top_k: int, k: int, link: LinkSpec, span: tuple[int, LinkSpec] | None) -> float:
    """(token, expert) pairs leaving a member per token of the group under uniform routing, in
    `link`'s bytes (module docstring): top-k / k of a token's pairs to each other member."""
    return top_k / k * _others_share(k, link, span)


def deepep_call_s(
    pair_bytes: float, top_k: int, k: int, rank_tokens: float, link: LinkSpec, span: tuple[int, LinkSpec] | None
) -> float:
    """One DeepEP low-latency dispatch (or combine) of `rank_tokens` tokens on each of k ranks, pairs
    of `pair_bytes`, as the layer's kernel charges it (module docstring): the kernel's own formula,
    for checking it against DeepEP's published times (benchmarks/bench_all2all.py)."""
    calls = max(1.0, rank_tokens / MOE_DP_CHUNK)
    return (
        DEEPEP_LL_CALL_S * calls + rank_tokens * k * pair_bytes * _pairs_out(top_k, k, link, span) / link.bw_bytes_per_s
    )


def member_weight_bytes(
    config: DecoderConfig, dtype: str | Precision, kind: DeviceKindSpec, k: int, whole: float, redundant: int = 0
) -> float:
    """A member's bytes of one layer's weights whose whole is `whole` (the layer task's): all of
    them but the routed experts', of which it holds (E + `redundant`) / k replicas (read off the
    experts kernel on one device)."""
    routed = sum(
        kernel.experts[0] * kernel.experts[2]
        for kernel in layer_kernels(config, dtype, kind).kernels
        if kernel.experts is not None
    )
    if routed == 0:  # a dense layer (DeepSeek's first ones): every weight whole
        return whole
    return whole - routed * (1 - (config.num_experts + redundant) / (config.num_experts * k))
