"""Time one decoder layer's parts on this machine's device: the tables of a serving profile of
version 2 (llm_planner.cost.serving_profile_v2), as `llm-planner profile-serving` writes them.

For one member of a tensor-parallel group of k (a single device: k = 1), in the activation dtype:

    linear_layer_s  the layer's four projections on T tokens (fused q/k/v, output, gate and up
                    fused, down; gpt2/opt: up): what the profile's table holds, the elementwise
                    work left to the kernel model (`linear_includes_elementwise: false`)
    layer_s         (raw timings only) the layer without attention as eager torch runs it: norm,
                    q/k/v, rotary embedding (llama family), output projection, residual add, norm,
                    MLP with its activation, residual add, the attention output stood in for by q.
                    Its elementwise work runs unfused, about a dozen small kernels where an
                    engine's fused ones run a few, so it is recorded but not written as the table.
    attn_decode_s   decode attention of B sequences, each one query per head over L cached keys:
                    torch's scaled_dot_product_attention with the query heads that share a
                    key/value head packed as that head's queries ([B, kv_heads / k, group, d]
                    against [B, kv_heads / k, L, d]), so every key and value is read once, as
                    engines' decode kernels read them (torch's own grouped-query path reads them
                    once per query head).

In fp8 (`fp8_linear_table`, a GPU with fp8 matrix units) only the projections are timed: weights and
activations in e4m3 with per-tensor scales through torch._scaled_mm (cuBLASLt), each input quantized
from bf16 in the call, bf16 out (W8A8, as engines run fp8 checkpoints' linear layers). The input's
scale is fixed, where an engine's dynamic quantization also finds its maximum (one more small
reduction a call): the table leaves that out.

No all-reduce: one device cannot time a group's collective; its table is left to the kernel model.

How a point is timed: on a GPU the part is captured once in a CUDA graph (as engines run decode
steps) and replayed; before each replay a buffer larger than the L2 cache is overwritten so the
part reads its weights and cache from device memory, as it does in a model whose other layers ran
in between; CUDA events time the replay alone. On a CPU the part runs eagerly, timed by the wall
clock. Each point is the median of `repeats` timed runs after `warmup` untimed ones. Weights and
caches are random (normal, std 0.02): the times do not depend on the values.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from llm_planner.graph.transformer import DecoderConfig

FP8 = torch.float8_e4m3fn
FLUSH_BYTES = 256 * 2**20  # overwritten before each timed GPU replay: several times any GPU's L2 cache


class PartsError(ValueError):
    """A model or group the part timer cannot build; the message says which and why."""


@dataclass(frozen=True)
class MemberShape:
    """A layer's sizes on one member of a group of k."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inner: int
    gated: bool
    rotary: bool
    rms: bool
    bias: bool

    @property
    def projections(self) -> tuple[tuple[int, int], ...]:
        """(in, out) widths of the four projections: fused q/k/v, output, (gate and) up, down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        up = (2 if self.gated else 1) * self.inner
        return (self.hidden, q + 2 * kv), (q, self.hidden), (self.hidden, up), (self.inner, self.hidden)

    def projection_inputs(self, tokens: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Random inputs of T tokens for the projections' three input widths: hidden, attention, MLP."""
        (hidden, _), (attention, _), _, (mlp, _) = self.projections
        return tuple(torch.randn(tokens, n, device=device, dtype=dtype) for n in (hidden, attention, mlp))


def linear_flops(shape: MemberShape, tokens: int) -> float:
    """The four projections' FLOPs on `tokens` tokens (a point of the linear tables)."""
    return 2.0 * tokens * sum(i * o for i, o in shape.projections)


def attention_flops(shape: MemberShape, batch: int, context: int) -> float:
    """Decode attention's FLOPs: `batch` queries over `context` keys each (a point of attn_grid)."""
    return 4.0 * batch * context * shape.heads * shape.head_dim


def member_shape(cfg: DecoderConfig, k: int) -> MemberShape:
    """The sizes each of k members holds (Megatron layout); PartsError where the layer does not split."""
    if cfg.num_experts or cfg.is_mla or cfg.sliding_window is not None:
        raise PartsError(
            f"model {cfg.name}: profile-serving times dense decoders with full attention "
            "(no mixture of experts, latent attention or sliding window)"
        )
    for what, n in (("attention heads", cfg.num_heads), ("key/value heads", cfg.num_kv_heads)):
        if n % k:
            raise PartsError(f"model {cfg.name}: its {n} {what} do not split over a tensor-parallel group of {k}")
    if cfg.intermediate_size % k:
        raise PartsError(f"model {cfg.name}: its MLP width {cfg.intermediate_size} does not split over {k}")
    llama = cfg.model_type == "llama"
    return MemberShape(
        hidden=cfg.hidden_size,
        heads=cfg.num_heads // k,
        kv_heads=cfg.num_kv_heads // k,
        head_dim=cfg.head_dim or cfg.hidden_size // cfg.num_heads,
        inner=cfg.intermediate_size // k,
        gated=llama,
        rotary=llama,
        rms=llama,
        bias=not llama or bool(cfg.qkv_bias),
    )


class _Layer:
    """One member's layer weights (no attention): `run(x)` is the timed linear part."""

    def __init__(self, s: MemberShape, device: torch.device, dtype: torch.dtype):
        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=dtype) * 0.02

        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.s, self.split = s, (q, kv, kv)
        self.w_qkv, self.w_o, self.w_up, self.w_down = (w(*shape) for shape in s.projections)
        self.b_qkv = w(q + 2 * kv) if s.bias else None
        self.norm_w, self.norm_b = w(s.hidden) + 1, w(s.hidden)
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if self.s.rms:
            return F.rms_norm(x, (self.s.hidden,), self.norm_w, 1e-5)
        return F.layer_norm(x, (self.s.hidden,), self.norm_w, self.norm_b)

    def _rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = t.view(t.shape[0], -1, self.s.head_dim)
        a, b = t.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(1)

    def gemms(self, x: torch.Tensor, attn: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The layer's four projections alone, on inputs of their widths ([T, h], [T, q], [T, inner])."""
        return x @ self.w_qkv, attn @ self.w_o, x @ self.w_up, act @ self.w_down

    def run(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        qkv = self._norm(x) @ self.w_qkv
        if self.b_qkv is not None:
            qkv = qkv + self.b_qkv
        q, k, _v = qkv.split(self.split, dim=-1)
        if self.s.rotary:
            angles = positions[:, None].float() * self.inv_freq[None, :]
            cos, sin = angles.cos().to(x.dtype)[:, None, :], angles.sin().to(x.dtype)[:, None, :]
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        x = x + q @ self.w_o  # q stands in for the attention output: same shape, attention timed apart
        up = self._norm(x) @ self.w_up
        if self.s.gated:
            gate, lin = up.chunk(2, dim=-1)
            act = F.silu(gate) * lin
        else:
            act = F.gelu(up)
        return x + act @ self.w_down


class Timer:
    """Times a zero-argument function on `device` (module docstring: graphs and a flushed L2 on a GPU)."""

    def __init__(self, device: torch.device, repeats: int, warmup: int, tick: Callable[[float], object] | None = None):
        self.device, self.repeats, self.warmup, self.tick = device, repeats, warmup, tick
        self.cuda = device.type == "cuda"
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if self.cuda else None

    def median_s(self, fn: Callable[[], object], work: float = 0.0) -> float:
        """The median time of fn; `tick(work)` after it (a progress bar's advance: `work` its FLOPs)."""
        seconds = self._cuda(fn) if self.cuda else self._cpu(fn)
        if self.tick is not None:
            self.tick(work)
        return seconds

    def _cpu(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def _cuda(self, fn: Callable[[], object]) -> float:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(max(1, self.warmup)):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        times = []
        for _ in range(self.repeats):
            self.flush.random_(0, 255)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)


def linear_tables(
    shape: MemberShape, tokens: Sequence[int], timer: Timer, dtype: torch.dtype
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """([(T, seconds)] of the layer without attention on T tokens (eager, elementwise work unfused),
    the same of its four projections alone)."""
    layer = _Layer(shape, timer.device, dtype)
    full, gemms = [], []
    with torch.inference_mode():
        for t in tokens:
            x, attn, act = shape.projection_inputs(t, timer.device, dtype)
            pos = torch.arange(t, device=timer.device)
            work = linear_flops(shape, t)
            full.append((t, timer.median_s(lambda x=x, pos=pos: layer.run(x, pos), work)))
            gemms.append((t, timer.median_s(lambda x=x, a=attn, m=act: layer.gemms(x, a, m), work)))
    return full, gemms


class _Fp8Gemms:
    """One member's four projections in fp8 (e4m3) weights and activations with per-tensor scales,
    through torch._scaled_mm (cuBLASLt), bf16 out: each call quantizes its bf16 input, then
    multiplies. Weights are held column-major, as the kernel takes its second operand."""

    def __init__(self, s: MemberShape, device: torch.device):
        self.weights = [
            (torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02).to(FP8).t() for k, n in s.projections
        ]
        self.scale = torch.ones((), device=device, dtype=torch.float32)

    def _mm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xq = (x * self.scale).to(FP8)
        return torch._scaled_mm(xq, w, scale_a=self.scale, scale_b=self.scale, out_dtype=torch.bfloat16)

    def __call__(self, x: torch.Tensor, attn: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w_qkv, w_o, w_up, w_down = self.weights
        return self._mm(x, w_qkv), self._mm(attn, w_o), self._mm(x, w_up), self._mm(act, w_down)


def fp8_linear_table(shape: MemberShape, tokens: Sequence[int], timer: Timer) -> list[tuple[int, float]]:
    """[(T, seconds)] of the four projections in fp8 on T tokens (a GPU with fp8 matrix units)."""
    gemms, out = _Fp8Gemms(shape, timer.device), []
    with torch.inference_mode():
        for t in tokens:
            x, attn, act = shape.projection_inputs(t, timer.device, torch.bfloat16)
            out.append((t, timer.median_s(lambda x=x, a=attn, m=act: gemms(x, a, m), linear_flops(shape, t))))
    return out


def attn_grid(
    shape: MemberShape, batches: Sequence[int], contexts: Sequence[int], timer: Timer, dtype: torch.dtype
) -> tuple[list[tuple[int, int, float]], str]:
    """([(B, L, seconds)] of decode attention: B sequences, one query each over L cached keys; the
    SDPA backend that ran it)."""
    out, backend = [], None
    with torch.inference_mode():
        for b in batches:
            for ctx in contexts:
                q = torch.randn(b, shape.heads, 1, shape.head_dim, device=timer.device, dtype=dtype)
                k = torch.randn(b, shape.kv_heads, ctx, shape.head_dim, device=timer.device, dtype=dtype)
                v = torch.randn_like(k)
                backend = backend or _backend(q, k, v)
                out.append((b, ctx, timer.median_s(_attention(q, k, v, backend), attention_flops(shape, b, ctx))))
                del q, k, v
    return out, backend.name if backend is not None else "none"


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend) -> Callable[[], torch.Tensor]:
    """Decode attention with the query heads of each key/value head packed as its queries: q
    [B, heads, 1, d] -> [B, kv_heads, group, d] over k, v [B, kv_heads, L, d], unmasked (a decode
    sees every cached key), so each key and value is read once per key/value head."""
    b, heads, _, d = q.shape
    packed = q.reshape(b, k.shape[1], heads // k.shape[1], d)

    def fn() -> torch.Tensor:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(packed, k, v)

    return fn


def _backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """The first SDPA backend that runs grouped-query decode here: flash attention, then cuDNN, then
    the memory-efficient kernel, then the plain math (the order engines' kernels resemble)."""
    order = (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
    for backend in order if q.is_cuda else ():
        try:
            _attention(q, k, v, backend)()
            return backend
        except RuntimeError:
            continue
    return SDPBackend.MATH
