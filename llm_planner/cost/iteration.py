"""One decoder layer's time in one engine iteration, as the sum of the kernels it runs.

An iteration of a serving engine (continuous batching with chunked prefill) processes, on each
layer, a `Load`: d decode tokens (one per running sequence, reading K_d keys of KV cache in
all) and q prompt tokens of prompt chunks (their queries seeing K_q keys in all). On one device,
or on each member of a tensor-parallel group of k (Megatron-LM layout: Shoeybi et al. 2019,
sec. 3; llm_planner.graph.tp_layout), the layer runs one after another

    linear       the q/k/v, output and MLP projections on all d + q tokens: FLOPs 2 P_m / k per
                 token, weights P_m b / k read once per iteration (shared by decode and prompt
                 tokens), activations in and out per token
    attn_decode  each decode token's query against its sequence's cache: 4 (a / k) keys FLOPs,
                 2 (kv / k) b bytes per key read
    attn_prefill each prompt token against its prompt's keys so far: 4 (a / k) keys FLOPs, its
                 q, k, v, o and the cache write as bytes
    elementwise  norms, residual adds, rotary embedding, the MLP activation: bytes only
    all_reduce   (k > 1) two per layer, after the output and down projections, of h b bytes per
                 token: alpha + 2 (k - 1) / k n / beta (ring; Patarasuk and Yuan, JPDC 2009), with
                 alpha = the kind's per-call collective overhead (launch and NCCL's own latency)
                 + 2 (k - 1) link latencies, beta = the link's bandwidth x the kind's collective
                 efficiency (the share of it an all-reduce's bytes reach)

with P_m the layer's linear parameters, a = nh hd, kv = nkv hd, b the dtype's bytes, h the hidden
size. A quantized precision (llm_planner.core.precision) changes three of these: the linear
weights are read at the weight format's bytes per weight (scales and zero points included) and
their FLOPs run at the compute dtype's peak (fp8 or int8 for W8A8; for W4A16 the activation
dtype's, the compute time multiplied by the kind's `dequant_factor`, and so for fp8 weights on a
kind without fp8 tensor cores: W8A16), and attention reads (decode)
and writes (prompt) the KV cache at the KV cache dtype's bytes (for a cache below the activation
dtype, times the kind's `kv_dequant_factor`: an engine whose attention gains no time from an fp8
cache, as vLLM's documentation says of its own, is 2 under 16-bit activations). Linear layers
computed in 8 bits (W8A8) also add the kind's `w8a8_overhead_s` to the layer's fixed time: the
kernels that quantize each projection's input and scale its output, launched per layer whatever
its tokens (fitted on TensorRT-LLM's fp8 runs on H100: docs/fidelity.md).

A mixture-of-experts layer (llm_planner.graph.moe; llm_planner.cost.moe_cost has its sizes) has
the router and shared expert in `linear` and one more kernel, `experts`: the routed experts'
GEMMs on the tokens' top-k rows, reading the weights of each expert the iteration's tokens reach
(E (1 - (1 - k/E)^T) of them under uniform routing, fewer under a measured skewed router:
graph.moe.experts_touched), a term concave in the tokens.

Each compute kernel's time is its own roofline with a rounded corner,

    t = max(c, m, KAPPA (c + m)),  c = FLOPs / (peak ce),  m = bytes / (bw me),

(`KAPPA` below), the memory-only kernels' time is m, decode attention's at least its sequences'
mean keys times the kind's `decode_key_s` (an engine whose decode kernel streams one sequence's
cache on a few of the GPU's cores: at few sequences it cannot reach the GPU's bandwidth; for loads
proportional to b sequences a constant, so one more affine piece), a collective's its fixed time plus its bytes
over the link (a collective run in calls of at most `chunk` tokens, llm_planner.cost.dp_attention's
DeepEP dispatch and combine, pays the fixed time once per chunk: max(1, tokens / chunk) times, a
maximum of two affine terms), and the layer's time is the kind's per-task overhead (and under
W8A8 its w8a8_overhead_s) plus the sum. Every term is a maximum of affine functions of the load,
so for loads proportional to b sequences (`Load.per_sequence` times b) the layer time is convex
piecewise affine in b: `layer_pieces.layer_pieces` returns its pieces exactly (the upper envelope
of the sum), the form the serving bounds read (llm_planner.serving.bound*) and the placement planner's decoder layer
tasks' times take (llm_planner.cost.task_pieces).

`sublayer_kernels` splits a layer into its two SUBLAYERS, the tasks of a "sublayer" placement graph:
attn (the q/k/v and output projections, both attention kernels, one norm, one residual add, the
rotary embedding, one all-reduce) and mlp (the MLP projections, the other norm and residual add,
the activation, the other all-reduce), each the sum of its own kernels on the same load.

A measured serving profile may time some kernels itself (llm_planner.cost.serving_profile_v2):
`layer_time_s` sums the kernels with those replaced by their measured times, the rest (and the
overhead) as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from llm_planner.core.precision import Precision, as_precision, linear_dtype
from llm_planner.core.spec import DeviceKindSpec, LinkSpec
from llm_planner.cost.moe_cost import check_imbalance, expert_sizes, moe_linear_sizes
from llm_planner.cost.roofline import CostError
from llm_planner.graph import mla
from llm_planner.graph.moe import experts_touched
from llm_planner.graph.transformer import DecoderConfig, matmul_parameters, norm_parameters

# Rounded roofline corner: measured GEMM time rises before the sharp roofline's corner, where
# compute and memory times meet (Vidur's operator profiles, microsoft/vidur, of Llama-3 8B and
# 70B on A100 and H100: linear layers near 128 tokens take 1.26-1.31x the sharp roofline's time).
# With t >= KAPPA (c + m), at the corner (c = m) t = 2 KAPPA m = 1.3 m; far from it the larger
# term wins again.
KAPPA = 0.65
SUBLAYERS = ("attn", "mlp")  # a layer's two parts (a "sublayer" task graph's attn and mlp tasks)
ALL_REDUCES_PER_LAYER = len(SUBLAYERS)  # after the attention output projection and after the MLP down projection
LOAD_FIELDS = ("decodes", "decode_keys", "prompt_tokens", "prompt_keys")


@dataclass(frozen=True, kw_only=True)
class Load:
    """What one iteration processes on one layer: decode tokens and the keys they read, prompt
    tokens and the keys their queries see (each summed over the iteration's sequences)."""

    decodes: float = 0.0
    decode_keys: float = 0.0
    prompt_tokens: float = 0.0
    prompt_keys: float = 0.0

    def vector(self) -> tuple[float, ...]:
        return (1.0, self.decodes, self.decode_keys, self.prompt_tokens, self.prompt_keys)

    def times(self, n: float) -> Load:
        return Load(**{f: getattr(self, f) * n for f in LOAD_FIELDS})

    def plus(self, other: Load) -> Load:
        return Load(**{f: getattr(self, f) + getattr(other, f) for f in LOAD_FIELDS})


@dataclass(frozen=True)
class Kernel:
    """FLOPs and bytes of one kernel as coefficients on Load.vector() (fixed, per decode token,
    per decode key, per prompt token, per prompt key); `collective`: an all-reduce whose bytes
    cross the link and whose FLOPs slot holds its fixed time."""

    name: str
    flops: tuple[float, ...]
    bytes: tuple[float, ...]
    collective: bool = False
    speed: float = 1.0  # its FLOP/s over the layer's flops_per_s (linear layers of a quantized precision)
    # routed experts (an MoE layer's expert GEMMs): (E, top-k, a member's bytes of one expert's
    # weights), read once for each expert the iteration's tokens reach (graph.moe.experts_touched)
    experts: tuple[float, float, float] | None = None
    picks: tuple[float, ...] | None = None  # a measured router's chance per expert (None: uniform)
    # a collective run in calls of at most `chunk` tokens of the load (its fixed time paid once per
    # call, at least once); 0: one call whatever the tokens (llm_planner.cost.dp_attention)
    chunk: float = 0.0
    # decode attention: at least a sequence's keys times the layer's decode_key_s (module docstring)
    key_floor: bool = False

    def calls(self, tokens: float) -> float:
        """Calls of the kernel on `tokens` tokens, fractional past the first (module docstring)."""
        return max(1.0, tokens / self.chunk) if self.chunk else 1.0

    def expert_bytes(self, tokens: float) -> float:
        """Bytes of the routed experts' weights `tokens` tokens read (0 for any other kernel)."""
        if self.experts is None:
            return 0.0
        num, top_k, per_expert = self.experts
        return per_expert * experts_touched(int(num), int(top_k), tokens, self.picks)


@dataclass(frozen=True, kw_only=True)
class LayerKernels:
    """The kernels of one decoder layer on one member of a group, with the rates they run at."""

    kernels: tuple[Kernel, ...]
    flops_per_s: float
    bytes_per_s: float
    link_bytes_per_s: float
    overhead_s: float
    # the W8A8 linear layers' fixed time (the kind's w8a8_overhead_s; module docstring): part of the
    # linear kernel's time, left out with it where a measured table times the linear layers
    w8a8_s: float = 0.0
    decode_key_s: float = 0.0  # the kind's least time per key of one sequence's decode attention

    @property
    def exact(self) -> bool:
        """Whether `layer_pieces` are the layer's time exactly (no routed experts: module docstring)."""
        return all(k.experts is None for k in self.kernels)

    def kernel_terms(self, kernel: Kernel, x: tuple[float, ...]) -> tuple[float, float]:
        """(compute time, memory time) of the kernel at load vector x (a collective: (fixed, size))."""
        f = sum(a * b for a, b in zip(kernel.flops, x))
        n = sum(a * b for a, b in zip(kernel.bytes, x))
        if kernel.collective:
            return f, n / self.link_bytes_per_s
        return f / (self.flops_per_s * kernel.speed), n / self.bytes_per_s

    def kernel_s(self, kernel: Kernel, load: Load) -> float:
        c, m = self.kernel_terms(kernel, load.vector())
        m += kernel.expert_bytes(load.decodes + load.prompt_tokens) / self.bytes_per_s
        if kernel.collective:
            tokens = load.decodes + load.prompt_tokens
            return c * kernel.calls(tokens) + m if tokens > 0 else 0.0
        t = max(c, m, KAPPA * (c + m)) if c > 0 and m > 0 else c + m
        return max(t, self.key_floor_s(kernel, load.decodes, load.decode_keys))

    def key_floor_s(self, kernel: Kernel, decodes: float, keys: float) -> float:
        """The decode attention's floor on `decodes` sequences reading `keys` keys in all: their mean
        keys a sequence times decode_key_s (0 for other kernels and without decodes)."""
        if not kernel.key_floor or not self.decode_key_s or decodes <= 0:
            return 0.0
        return keys / decodes * self.decode_key_s

    def time_s(self, load: Load) -> float:
        """The layer's time on `load` (0 when it carries no token)."""
        if load.decodes + load.prompt_tokens <= 0:
            return 0.0
        return self.overhead_s + self.w8a8_s + sum(self.kernel_s(k, load) for k in self.kernels)


def layer_kernels(
    config: DecoderConfig,
    dtype: str | Precision,
    kind: DeviceKindSpec,
    k: int = 1,
    link: LinkSpec | None = None,
    imbalance: float = 1.0,
    picks: tuple[float, ...] | None = None,
) -> LayerKernels:
    """The kernels of one layer on a device of `kind` (k = 1) or on each member of a group of k
    whose collectives cross `link` (module docstring), in `dtype` (one dtype for everything) or a
    precision; an MoE layer's experts with the routing `imbalance` (llm_planner.cost.moe_cost) and
    a measured router's `picks` (graph.moe.experts_touched; None: uniform).
    Raises CostError for a dtype the kind has no peak for or a group the layer does not split over."""
    return _member_kernels(config, dtype, kind, k, link, SUBLAYERS, imbalance, picks)


def sublayer_kernels(
    config: DecoderConfig,
    dtype: str | Precision,
    kind: DeviceKindSpec,
    part: str,
    k: int = 1,
    link: LinkSpec | None = None,
    imbalance: float = 1.0,
    picks: tuple[float, ...] | None = None,
) -> LayerKernels:
    """The kernels of one of a layer's SUBLAYERS ("attn": its linear layers, the attention kernels,
    its norm, residual add and rotary embedding, one all-reduce; "mlp": the rest), as
    `layer_kernels`: the two sublayers' kernels together are the layer's."""
    if part not in SUBLAYERS:
        raise CostError(f"a decoder sublayer is one of {SUBLAYERS}, got {part!r}")
    return _member_kernels(config, dtype, kind, k, link, (part,), imbalance, picks)


def _member_kernels(
    config: DecoderConfig,
    dtype: str | Precision,
    kind: DeviceKindSpec,
    k: int,
    link: LinkSpec | None,
    parts: tuple[str, ...],
    imbalance: float = 1.0,
    picks: tuple[float, ...] | None = None,
) -> LayerKernels:
    p = as_precision(dtype)
    try:
        imbalance = check_imbalance(imbalance)
    except ValueError as exc:
        raise CostError(str(exc)) from None
    try:
        peak = kind.flops_for(p.activations)
        sizes = _sizes(p, kind)
    except KeyError as exc:
        raise CostError(f"device kind {kind.name!r} gives no peak_flops for dtype {exc.args[0]!r}") from None
    heads = (config.num_heads,) if config.is_mla else (config.num_heads, config.num_kv_heads)
    split = {"attn": heads, "mlp": _mlp_widths(config)}
    if k > 1 and (link is None or any(n % k for part in parts for n in split[part])):
        what = "layer" if parts == SUBLAYERS else f"{parts[0]} sublayer"
        raise CostError(f"a decoder {what} of {config.name} cannot run on a tensor-parallel group of {k}")
    call_s, latency_s = kind.collective_call_s, link.latency_s if k > 1 else 0.0
    kernels = _kernels(config, sizes, k, call_s, latency_s, parts, imbalance, picks)
    return LayerKernels(
        kernels=kernels,
        flops_per_s=peak * kind.compute_efficiency,
        bytes_per_s=kind.mem_bw_bytes_per_s * kind.mem_efficiency,
        link_bytes_per_s=link.bw_bytes_per_s * kind.collective_bw_efficiency if k > 1 else 1.0,
        overhead_s=kind.overhead_s,
        w8a8_s=_w8a8_share(p, kind, parts),
        decode_key_s=kind.decode_key_s,
    )


def _w8a8_share(p: Precision, kind: DeviceKindSpec, parts: tuple[str, ...]) -> float:
    """The kind's w8a8_overhead_s where it runs the precision's linear layers in 8 bits (W8A8: at a
    compute dtype other than the activations', not weight-only), split evenly over the SUBLAYERS
    `parts` are of (each holds two of a layer's four projections); else 0."""
    dtype, weight_only = linear_dtype(p, kind.peak_dtypes)
    if not kind.w8a8_overhead_s or weight_only or dtype == p.activations:
        return 0.0
    return kind.w8a8_overhead_s * len(parts) / len(SUBLAYERS)


def _sizes(p: Precision, kind: DeviceKindSpec | None) -> tuple[float, float, float, float]:
    """(activation, weight and KV cache bytes per element, the linear layers' speed): the linear
    layers run at the peak of the dtype llm_planner.core.precision.linear_dtype gives for the kind
    over the activation dtype's, slowed by the kind's dequant_factor where the kind runs the
    weights weight-only (int4; fp8 without an fp8 peak) (1 without a kind: FLOPs only); a KV cache
    below the activation dtype (fp8) is timed at its bytes times the kind's kv_dequant_factor (the
    bytes it holds in memory are its own: llm_planner.serving.tasks)."""
    if kind is None:
        return (p.activation_bytes, p.weight_bytes, p.kv_bytes, 1.0)
    dtype, weight_only = linear_dtype(p, kind.peak_dtypes)
    speed = kind.flops_for(dtype) / kind.flops_for(p.activations)
    kv = p.kv_bytes * (kind.kv_dequant_factor if p.kv_cache != p.activations else 1.0)
    return (p.activation_bytes, p.weight_bytes, kv, speed / (kind.dequant_factor if weight_only else 1.0))


def _mlp_widths(cfg: DecoderConfig) -> tuple[int, ...]:
    """The widths a tensor-parallel group splits the MLP's projections over (its degree divides each)."""
    if not cfg.is_moe:
        return (cfg.intermediate_size,)
    return (cfg.moe_intermediate_size,) + ((cfg.shared_expert_size,) if cfg.shared_expert_size else ())


def _part_sizes(cfg: DecoderConfig, k: int, part: str) -> tuple[float, float, float, float, float]:
    """Elements per member of a group of k in one sublayer: (linear parameters, biases, activations in
    and out of its projections per token, elementwise traffic per token, norm parameters)."""
    h, inner = cfg.hidden_size, cfg.intermediate_size
    a, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    norm, residual = 2 * h, 3 * h  # a norm reads and writes h; a residual add reads 2h, writes h
    if part == "attn" and cfg.is_mla:  # latent attention (llm_planner.graph.mla)
        io, elementwise = mla.member_traffic(cfg, k)
        biases = mla.mla_attention_parameters(cfg)["biases"]
        return mla.member_linear_parameters(cfg, k), biases, io, norm + residual + elementwise, norm_parameters(cfg)
    if part == "attn":  # projections qkv and o; rotary embedding of q and k
        rope = 2 * (a + kv) / k if not cfg.learned_positions else 0.0
        biases = (a + 2 * kv) * cfg.qkv_bias / k + h * cfg.out_bias
        io = (h + (a + 2 * kv) / k) + (a / k + h)
        return matmul_parameters(cfg)["attn"] / k, biases, io, norm + residual + rope, norm_parameters(cfg)
    if cfg.is_moe:  # the router and shared expert; the routed experts are a kernel of their own
        params, io, elementwise = moe_linear_sizes(cfg, k)
        return params, 0.0, io, norm + residual + elementwise, norm_parameters(cfg)
    up = inner * (2 if cfg.gated_mlp else 1)  # projections up (and gate) and down; the activation
    io = (h + up / k) + (inner / k + h)
    act = (up + inner) / k
    return (
        matmul_parameters(cfg)["mlp"] / k,
        (up / k + h) * cfg.mlp_bias,
        io,
        norm + residual + act,
        norm_parameters(cfg),
    )


@lru_cache(maxsize=512)
def _kernels(
    cfg: DecoderConfig,
    sizes: tuple[float, float, float, float],
    k: int,
    call_s: float,
    latency_s: float,
    parts: tuple[str, ...] = SUBLAYERS,
    imbalance: float = 1.0,
    picks: tuple[float, ...] | None = None,
) -> tuple[Kernel, ...]:
    b, wb, kvb, speed = sizes  # activation, weight and KV bytes per element; the linear layers' speed
    h = cfg.hidden_size
    a, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_part = [_part_sizes(cfg, k, part) for part in parts]
    linear_params, biases, linear_io, elementwise_io, norms = (sum(s[j] for s in per_part) for j in range(5))
    weights = wb * linear_params + b * biases
    out = [
        Kernel(
            "linear",
            _vec(0, 2 * linear_params, 0, 2 * linear_params, 0),
            _vec(weights, b * linear_io, 0, b * linear_io, 0),
            speed=speed,
        )
    ]
    if "mlp" in parts and cfg.is_moe:
        flops, io, per_expert = expert_sizes(cfg, k, imbalance)
        experts = (float(cfg.num_experts), float(cfg.experts_per_token), wb * per_expert)
        out.append(
            Kernel(
                "experts",
                _vec(0, flops, 0, flops, 0),
                _vec(0, b * io, 0, b * io, 0),
                speed=speed,
                experts=experts,
                picks=picks,
            )
        )
    if "attn" in parts:
        out += _mla_kernels(cfg, b, kvb, k) if cfg.is_mla else _attention_kernels(a, kv, b, kvb, k)
    out.append(
        Kernel("elementwise", _vec(0, 0, 0, 0, 0), _vec(b * norms, b * elementwise_io, 0, b * elementwise_io, 0))
    )
    if k > 1:  # one all-reduce per sublayer, after its row-parallel projection
        fixed = len(parts) * (call_s + 2 * (k - 1) * latency_s)
        size = len(parts) * 2 * (k - 1) / k * h * b
        out.append(Kernel("all_reduce", _vec(fixed, 0, 0, 0, 0), _vec(0, size, 0, size, 0), collective=True))
    return tuple(out)


def _attention_kernels(a: float, kv: float, b: float, kvb: float, k: int) -> list[Kernel]:
    """Decode and prefill attention of a member of k (module docstring): a / k query and kv / k KV widths."""
    return [
        Kernel(
            "attn_decode",
            _vec(0, 0, 4 * a / k, 0, 0),
            _vec(0, b * (2 * a + 2 * kv) / k, 2 * kv * kvb / k, 0, 0),
            key_floor=True,
        ),
        Kernel(
            "attn_prefill", _vec(0, 0, 0, 0, 4 * a / k), _vec(0, 0, 0, (b * (2 * a + 2 * kv) + kvb * 2 * kv) / k, 0)
        ),
    ]


def _mla_kernels(cfg: DecoderConfig, b: float, kvb: float, k: int) -> list[Kernel]:
    """Latent attention's decode (absorbed) and prefill kernels on a member of k (llm_planner.graph.mla):
    the latent cache read whole per key, every member holding it."""
    cache = mla.kv_elements_per_token(cfg)
    return [
        Kernel(
            "attn_decode",
            _vec(0, 0, mla.decode_flops_per_key(cfg, k), 0, 0),
            _vec(0, b * mla.decode_io_per_token(cfg, k), cache * kvb, 0, 0),
            key_floor=True,
        ),
        Kernel(
            "attn_prefill",
            _vec(0, 0, 0, 0, mla.prefill_flops_per_key(cfg, k)),
            _vec(0, 0, 0, b * mla.prefill_io_per_token(cfg, k) + kvb * cache, 0),
        ),
    ]


def layer_flops(config: DecoderConfig, dtype: str | Precision, load: Load, part: str | None = None) -> float:
    """FLOPs of one layer's compute kernels (of one sublayer's: `part`) on `load` on one device: what
    their compute times divide by the peak (a task graph's FLOPs of a layer, llm_planner.graph.decoder_graph,
    are the same)."""
    x = load.vector()
    kernels = _kernels(config, _sizes(as_precision(dtype), None), 1, 0.0, 0.0, SUBLAYERS if part is None else (part,))
    return sum(sum(a * v for a, v in zip(kr.flops, x)) for kr in kernels if not kr.collective)


def _vec(*values: float) -> tuple[float, ...]:
    return tuple(float(v) for v in values)
