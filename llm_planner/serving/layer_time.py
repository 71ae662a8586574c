"""A decoder layer's time per engine iteration at b sequences in flight, as the serving bounds and
the search read it: callable t(b), `least(lo, hi)`, `breakpoints` (where a measured time may change
slope), `measured`, and `load_s(load)` for any other mix of decode and prompt tokens.

    RooflineLayerTime  the kernel model, prompts in the engine's chunks (llm_planner.cost.chunks);
                       its pieces max_j (f_j + s_j b), the spread load's, below it
    KernelLayerTime    an MoE layer's kernels summed at b sequences, prompts in the same chunks (not
                       piecewise affine), its pieces a lower bound for the bounds
    MeasuredLayerTime  a serving-profile/1 table pair of a kind on one device: decode(b) + prefill(b r)
    PartsLayerTime     a serving-profile/2 entry of a kind at the stage's degree: the kernel model
                       with the measured parts replaced by their tables (cost.layer_pieces.layer_time_s)

with r = E[P]/E[O] prompt tokens per sequence per iteration. `measured_layer_time` is the one
rule of which applies (serving.costs.stage_costs and the verifier both call it). The measured
times are piecewise linear in b: the tables' breakpoints, scaled from their own axis (batch,
tokens b (1 + r), all-reduce bytes b (1 + r) h b_dtype) to b, and the kinks of the model's pieces
left in, so `least` and the bounds need only look at them and at the ends.
"""

from __future__ import annotations

import bisect
import math

from llm_planner.core.spec import DeviceKindSpec
from llm_planner.cost.chunks import pieces_below, prefill_batch_tokens, prompt_lumps
from llm_planner.cost.iteration import LayerKernels, Load
from llm_planner.cost.layer_pieces import layer_pieces, layer_time_s
from llm_planner.cost.roofline import evaluate_pieces
from llm_planner.serving.workload import WorkloadError

HULL_MOST = 16384  # the most micro-batch sizes RooflineLayerTime times one by one for its hull pieces


class _KernelTime:
    """A layer's time by the kernel model, with `pieces` below it at every b a micro-batch may hold
    (b >= 1; an MoE layer's up to the token budget's most) that the bounds read
    (llm_planner.serving.bound*) through `lower` and `least`. No breakpoint."""

    measured = False
    breakpoints = ()

    def __init__(
        self,
        pieces: tuple,
        kernels: LayerKernels,
        per_sequence: Load,
        prompt_len: float,
        budget: int,
        separate: tuple | None = None,
        ranks: int = 1,
    ):
        self.pieces, self.kernels, self.per_sequence = pieces, kernels, per_sequence
        self.prompt_len, self.budget = prompt_len, budget
        self.ranks = ranks  # schedulers the load splits over (data-parallel attention), each its own chunks
        self.separate = separate  # (prompt_len, budget) of an engine without chunked prefill; None: chunked
        self._memo: dict[float, float] = {}  # the bounds ask for the same b many times

    def __call__(self, b: float) -> float:
        if b <= 0:
            return 0.0
        got = self._memo.get(b)
        if got is None:
            got = self._memo[b] = self._lumped_s(b)
        return got

    def _lumped_s(self, b: float) -> float:
        """E[t(decodes of b, x prompt tokens)] over the lumps the engine admits prompts in
        (llm_planner.cost.chunks): chunks of a rank's room, (B - b) / ranks, where the load is
        split over data-parallel ranks each admitting its own; or the whole-prompt iterations of
        an engine without chunked prefill."""
        if self.separate is not None:
            return self._separate_s(b)
        ps = self.per_sequence
        decode = Load(decodes=b, decode_keys=b * ps.decode_keys)
        keys_per_token = ps.prompt_keys / ps.prompt_tokens if ps.prompt_tokens > 0 else 0.0
        chunk = min(self.prompt_len, (self.budget - b) / self.ranks)
        lumps = prompt_lumps(b * ps.prompt_tokens, chunk, self.budget - b)
        return sum(
            w * self.kernels.time_s(decode.plus(Load(prompt_tokens=x, prompt_keys=x * keys_per_token)))
            for w, x in lumps
        )

    def prefill_iterations(self, b: float) -> float:
        """Prompt-only iterations per decode iteration of b sequences: 0 with chunked prefill."""
        if self.separate is None or b <= 0 or self.per_sequence.prompt_tokens <= 0:
            return 0.0
        x = b * self.per_sequence.prompt_tokens
        return x / prefill_batch_tokens(x, *self.separate)

    def _separate_s(self, b: float) -> float:
        """A decode iteration of b sequences and its share of whole-prompt iterations of their own
        (no chunked prefill: llm_planner.cost.chunks.prefill_batch_tokens)."""
        ps = self.per_sequence
        t = self.kernels.time_s(Load(decodes=b, decode_keys=b * ps.decode_keys))
        runs = self.prefill_iterations(b)
        if runs <= 0:
            return t
        s = b * ps.prompt_tokens / runs
        keys_per_token = ps.prompt_keys / ps.prompt_tokens
        return t + runs * self.kernels.time_s(Load(prompt_tokens=s, prompt_keys=s * keys_per_token))

    def lower(self, b: float) -> float:
        """The pieces at b: at most t(b)."""
        return evaluate_pieces(self.pieces, b)

    def least(self, lo: float = 1.0, hi: float = math.inf) -> float:
        """A time no micro-batch of lo..hi sequences is below: the pieces at lo (they grow with b
        and lie below t)."""
        return self.lower(lo)


class RooflineLayerTime(_KernelTime):
    """A dense decoder layer's time at b sequences by the kernel model, with the prompt tokens in
    the lumps an engine admits them (llm_planner.cost.chunks): E[t(decodes of b, x prompt tokens)].
    Its pieces, max_j (f_j + s_j b): those timing the spread load b r exactly, below t(b) at every b
    (Jensen: the kernels are convex in the prompt tokens, cost.chunks), and the lower convex hull of
    t at the micro-batches the token budget admits, below t at each of them."""

    def __init__(self, *args, **kwargs):  # _KernelTime's
        super().__init__(*args, **kwargs)
        self.pieces += self._hull_pieces()

    def _hull_pieces(self) -> tuple:
        """Lines below t at every micro-batch b the token budget admits (b (1 + r) <= B; no plan
        has a larger one): the lower convex hull of t there (cost.chunks.pieces_below), tighter than
        the spread load's pieces where the chunks cost more. It times t at every such b, so a budget
        that admits over HULL_MOST sequences (past the engines' budgets of a few thousand to 16,384
        tokens) gets none, and its bounds rest on the spread load's pieces, which hold at every b."""
        top = math.floor(self.budget / (1.0 + self.per_sequence.prompt_tokens))
        if not 2 <= top <= HULL_MOST:  # past HULL_MOST the spread load's pieces alone: looser, as valid, not hours
            return ()
        xs = [float(b) for b in range(1, top + 1)]
        at = tuple(float(2**i) for i in range(top.bit_length()))  # the lines over b = 1, 2, 4, ...
        return pieces_below(xs, [self(b) for b in xs], at)


class KernelLayerTime(_KernelTime):
    """An MoE layer's time at b sequences: the kernels' sum on b decodes and the prompt tokens in
    the lumps the engine admits, as RooflineLayerTime. Most iterations carry decodes alone and
    read the experts b tokens reach; a prompt's chunk reads nearly all of them once (the experts'
    reads are concave in the tokens: llm_planner.cost.iteration), which spreading the prompt over
    every iteration would charge again and again. `pieces` are the kernel model's lower bound at
    every b from 1 to the most a micro-batch may hold (the experts' reads above their chord over
    that range: llm_planner.cost.layer_pieces); past it they may not be, but no plan lies there. Within
    the token budget the time grows with b (more decodes, and at least as many prompt tokens per
    iteration on average), and so does b / (step + l t(b)), as on the roofline."""

    def least(self, lo: float = 1.0, hi: float = math.inf) -> float:
        """The least time over micro-batches of lo..hi sequences: at lo (the time grows with b)."""
        return self(lo)


class _PiecewiseLinear:
    """A measured time, linear between its `breakpoints`."""

    measured = True
    breakpoints: tuple[float, ...] = ()

    def prefill_iterations(self, b: float) -> float:
        """Prompt-only iterations per decode iteration: none (measured times are chunked prefill's)."""
        return 0.0

    def __call__(self, b: float) -> float:
        raise NotImplementedError

    def least(self, lo: float = 1.0, hi: float = math.inf) -> float:
        """The least time over micro-batches of lo..hi sequences: piecewise linear, so at an end or
        a breakpoint."""
        points = {lo, *(x for x in self.breakpoints if lo < x < hi)} | ({hi} if hi < math.inf else set())
        return min(self(x) for x in points)


class MeasuredLayerTime(_PiecewiseLinear):
    """A device kind's measured block time at b sequences in flight per iteration: the decode table
    at b plus the prefill table at b E[P]/E[O] prompt tokens (serving-profile/1)."""

    def __init__(self, profile, kind: str, ratio: float):
        entry = profile.kind(kind)
        if entry.prefill is None and ratio > 0:
            raise WorkloadError(f"{profile.path}: kinds.{kind}: no prefill_layer_s, needed to charge the prompts")
        self.profile, self.kind, self.ratio = profile, kind, ratio
        points = set(entry.decode.breakpoints())
        if entry.prefill is not None and ratio > 0:
            points |= {size / ratio for size in entry.prefill.breakpoints()}
        self.breakpoints = tuple(sorted(p for p in points if p > 0))

    def __call__(self, b: float) -> float:
        return self.profile.layer_time_s(self.kind, b, b * self.ratio)

    def load_s(self, load: Load) -> float:
        """The tables at the load's decodes and prompt tokens (a version 1 table knows no context)."""
        return self.profile.layer_time_s(self.kind, load.decodes, load.prompt_tokens)


class PartsLayerTime(_PiecewiseLinear):
    """The kernel model of one layer on a member of a group, with the parts a serving-profile/2
    entry measures timed by its tables (module docstring). Linear between its breakpoints and
    past the last, so t(b) is tabulated once at them and interpolated (exact up to rounding);
    `load_s` evaluates any load directly."""

    def __init__(self, tables, kernels: LayerKernels, per_sequence: Load, message_bytes_per_token: float):
        self.tables, self.kernels, self.per_sequence = tables, kernels, per_sequence
        self.parts = tables.kernel_times(message_bytes_per_token)
        points = tables.breakpoints(per_sequence, message_bytes_per_token)
        pieces = layer_pieces(kernels, per_sequence, without=frozenset(self.parts))
        for i, (f1, s1) in enumerate(pieces):  # where the model's pieces left in may meet
            points |= {(f2 - f1) / (s1 - s2) for f2, s2 in pieces[i + 1 :] if s1 != s2}
        self.breakpoints = tuple(sorted(p for p in points if p > 0 and math.isfinite(p)))
        first = min((*self.breakpoints, 1.0)) / 2  # linear on (0, first breakpoint]
        self._xs = (first, *self.breakpoints, (self.breakpoints[-1] if self.breakpoints else first) + 1.0)
        self._ys = tuple(self.load_s(per_sequence.times(x)) for x in self._xs)

    def __call__(self, b: float) -> float:
        if b <= 0:
            return 0.0
        xs, ys = self._xs, self._ys
        i = min(max(bisect.bisect_right(xs, b) - 1, 0), len(xs) - 2)
        return ys[i] + (ys[i + 1] - ys[i]) * (b - xs[i]) / (xs[i + 1] - xs[i])

    def least(self, lo: float = 1.0, hi: float = math.inf) -> float:
        """The least time over micro-batches of lo..hi sequences: at an end or a breakpoint between."""
        xs = self._xs
        inside = self._ys[bisect.bisect_right(xs, lo) : bisect.bisect_left(xs, hi)]
        return min(self(lo), *inside, *((self(hi),) if hi < math.inf else ()))

    def load_s(self, load: Load) -> float:
        return layer_time_s(self.kernels, load, self.parts)


def profile_kind_name(profile, kind: DeviceKindSpec) -> str | None:
    """The name under which `profile` holds `kind`'s tables: the kind's own name, else the catalog
    entry it names (a profile measured on that GPU model); None where it holds neither."""
    names = {entry.kind for entry in profile.kinds}
    for name in (kind.name, kind.catalog):
        if name is not None and name in names:
            return name
    return None


def measured_layer_time(
    profile,
    kind: DeviceKindSpec,
    degree: int,
    kernels: LayerKernels,
    per_sequence: Load,
    message_bytes_per_token: float,
) -> MeasuredLayerTime | PartsLayerTime | None:
    """The measured time a stage of `degree` devices of `kind` takes from `profile`, or None (the
    kernel model): a version 1 profile's tables on single devices of the kinds it names; a
    version 2 profile's entry for the kind at that degree, where it has one (a kind is named by
    its own name or its catalog entry's: `profile_kind_name`)."""
    if profile is None:
        return None
    name = profile_kind_name(profile, kind)
    if name is None:
        return None
    if profile.version == 1:
        return MeasuredLayerTime(profile, name, per_sequence.prompt_tokens) if degree == 1 else None
    tables = profile.tables(name, degree)
    return None if tables is None else PartsLayerTime(tables, kernels, per_sequence, message_bytes_per_token)
