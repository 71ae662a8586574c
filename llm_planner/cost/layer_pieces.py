"""A decoder layer's time from its kernels (llm_planner.cost.iteration) as the search and the
bounds read it: affine pieces in the sequences of a micro-batch (`layer_pieces`, the upper
envelope of the kernels' rooflines summed, `envelope_of_sum`), and the time on one load with some
kernels measured (`layer_time_s`). The math is in llm_planner.cost.iteration's docstring."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llm_planner.cost.iteration import KAPPA, LayerKernels, Load
from llm_planner.cost.roofline import Piece


def layer_time_s(kernels: LayerKernels, load: Load, measured: Mapping[str, Callable[[Load], float]]) -> float:
    """The layer's time on `load` with each kernel named in `measured` timed by its function there
    instead of its roofline (module docstring; a measured linear table includes the W8A8 fixed
    time); 0 when the load carries no token."""
    if load.decodes + load.prompt_tokens <= 0:
        return 0.0
    return (
        kernels.overhead_s
        + _w8a8_s(kernels, measured)
        + sum(measured[k.name](load) if k.name in measured else kernels.kernel_s(k, load) for k in kernels.kernels)
    )


def layer_pieces(
    kernels: LayerKernels, per_sequence: Load, without: frozenset[str] = frozenset(), most: float | None = None
) -> tuple[Piece, ...]:
    """Affine pieces (fixed_s, per_sequence_s) whose maximum is the layer's time at b >= 1
    sequences, each adding `per_sequence` to the load (module docstring): the upper envelope of
    the sum of the kernels' pieces (the kernels named in `without` left out, the W8A8 fixed
    time with the linear kernel), exact for every b >= 0
    on a dense layer. On an MoE layer (`LayerKernels.exact` False) a lower bound at every b from 1
    to `most` (the most sequences a micro-batch may hold; None: any b >= 1), spread or in lumps:
    every iteration carries at least the b decodes, and the routed experts' weight reads, concave
    in the tokens, lie above their chord from 1 to `most` decode tokens (held at one token's
    without `most`)."""
    x = per_sequence.vector()
    slope_x = (0.0, *x[1:])
    fixed_x = (1.0, 0.0, 0.0, 0.0, 0.0)
    one = per_sequence.decodes  # the tokens every iteration of one sequence carries: its decode
    terms = []  # per kernel: its pieces as (fixed, slope)
    for kernel in (k for k in kernels.kernels if k.name not in without):
        c0, m0 = kernels.kernel_terms(kernel, fixed_x)
        c1, m1 = kernels.kernel_terms(kernel, slope_x)
        low, slope = _experts_chord(kernels, kernel, one, most)  # routed experts' reads, below them
        m0, m1 = m0 + low - slope, m1 + slope
        # decode attention's floor: a sequence's keys times decode_key_s, the same at every b (no
        # piece where it is 0)
        least = kernels.key_floor_s(kernel, per_sequence.decodes, per_sequence.decode_keys)
        floor = ((least, 0.0),) if least else ()
        if kernel.collective and kernel.chunk:  # a call per chunk of tokens, at least one
            terms.append(((c0 + m0, c1 + m1), (m0, c1 + m1 + c0 * one / kernel.chunk)))
        elif kernel.collective or c0 + c1 == 0 or m0 + m1 == 0:
            terms.append(((c0 + m0, c1 + m1), *floor))
        else:
            terms.append(((c0, c1), (m0, m1), (KAPPA * (c0 + m0), KAPPA * (c1 + m1)), *floor))
    terms.append(((kernels.overhead_s + _w8a8_s(kernels, without), 0.0),))
    return envelope_of_sum(terms)


def _w8a8_s(kernels: LayerKernels, left_out) -> float:
    """The W8A8 linear layers' fixed time, unless the linear kernel is in `left_out` (measured apart)."""
    return 0.0 if "linear" in left_out else kernels.w8a8_s


def _experts_chord(kernels: LayerKernels, kernel, one: float, most: float | None) -> tuple[float, float]:
    """(time at b = 1, slope) of the chord of the routed experts' reads over b = 1..most sequences'
    decodes: below the reads there, as they are concave in the tokens (0, 0 for other kernels)."""
    low = kernel.expert_bytes(one) / kernels.bytes_per_s
    if not low or most is None or most <= 1:
        return low, 0.0
    return low, (kernel.expert_bytes(one * most) / kernels.bytes_per_s - low) / (most - 1)


def envelope_of_sum(terms: list[tuple[Piece, ...]]) -> tuple[Piece, ...]:
    """The pieces of sum_i max_j (f_ij + s_ij b) for b >= 0: a convex piecewise affine function,
    affine between the breakpoints of its terms; one piece per stretch between them."""
    points = {0.0}
    for pieces in terms:
        for i, (f1, s1) in enumerate(pieces):
            for f2, s2 in pieces[i + 1 :]:
                if s1 != s2 and (x := (f2 - f1) / (s1 - s2)) > 0:
                    points.add(x)
    ends = sorted(points)
    probes = [(lo + hi) / 2 for lo, hi in zip(ends, ends[1:])] + [ends[-1] + 1.0]
    out: list[Piece] = []
    for b in probes:
        fixed = slope = 0.0
        for pieces in terms:
            f, s = max(pieces, key=lambda p: p[0] + p[1] * b)
            fixed, slope = fixed + f, slope + s
        if (fixed, slope) not in out:
            out.append((fixed, slope))
    return tuple(out)
