"""Serving profile version 2: measured parts of one decoder layer per device kind and tensor-parallel
degree; every part a profile lacks keeps the kernel model's time (llm_planner.cost.iteration).

    format: serving-profile/2
    model: meta-llama/Meta-Llama-3-8B
    dtype: fp16
    source: <free text: where it came from, what it leaves to the model>
    kinds:
      <device kind name as in the cluster spec>:
        tp:
          <degree>:                                   # 1, 2, 4, ...: each member of a group of that size
            linear_layer_s: [[tokens, seconds], ...]  # the projections on decode + prompt tokens together
            linear_includes_elementwise: true         # the table includes norms, rotary, activation, adds
            attn_decode_s: [[batch, context, seconds], ...]  # decode attention, a full grid
            all_reduce_s: [[bytes, seconds], ...]     # one all-reduce of that message size (degree > 1)

Each table is optional (an entry needs one). An iteration carrying load (d decode tokens with K_d
keys, q prompt tokens) costs one layer on a member of a group of k

    overhead + linear(d + q) + [elementwise(model), unless the linear table includes it]
             + attn_decode(d, K_d / d) + attn_prefill(model) + [k > 1] 2 all_reduce((d + q) h b)

each measured part replacing the kernel of that name (h the hidden size, b the dtype's bytes: the
message of each of the layer's two all-reduces). The linear table is read once for all the
iteration's tokens: the weights are streamed once whether a token decodes or prefills. Tables
interpolate as llm_planner.cost.profile_tables says: linear between points, end segments extended,
floored at 0; the attention grid bilinear (piecewise linear in batch at any context).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llm_planner.core.spec_fields import Reader, as_bool
from llm_planner.cost.iteration import ALL_REDUCES_PER_LAYER, Load
from llm_planner.cost.profile_tables import AttnGrid, LayerTable, read_grid, read_table

FORMAT_V2 = "serving-profile/2"
TABLES = ("linear_layer_s", "attn_decode_s", "all_reduce_s")
MAX_DEGREE = 1024


@dataclass(frozen=True, kw_only=True)
class PartTables:
    """The measured parts of one layer on one member of a group of `degree` devices."""

    degree: int
    linear: LayerTable | None = None
    linear_includes_elementwise: bool = False
    attn_decode: AttnGrid | None = None
    all_reduce: LayerTable | None = None

    def kernel_times(self, message_bytes_per_token: float) -> dict[str, Callable[[Load], float]]:
        """Kernel name (llm_planner.cost.iteration) -> its measured time on a load, for the parts
        this entry measures; `message_bytes_per_token`: an all-reduce's message per token (h b)."""
        out: dict[str, Callable[[Load], float]] = {}
        if self.linear is not None:
            out["linear"] = lambda load: self.linear.at(load.decodes + load.prompt_tokens)
            if self.linear_includes_elementwise:
                out["elementwise"] = lambda load: 0.0
        if self.attn_decode is not None:
            out["attn_decode"] = lambda load: (
                self.attn_decode.at(load.decodes, load.decode_keys / load.decodes) if load.decodes > 0 else 0.0
            )
        if self.all_reduce is not None:
            out["all_reduce"] = lambda load: (
                ALL_REDUCES_PER_LAYER
                * self.all_reduce.at((load.decodes + load.prompt_tokens) * message_bytes_per_token)
            )
        return out

    def breakpoints(self, per_sequence: Load, message_bytes_per_token: float) -> set[float]:
        """The numbers b of sequences where a measured part's slope may change when each sequence adds
        `per_sequence` to the load (its tokens and its decode context fixed)."""
        tokens = per_sequence.decodes + per_sequence.prompt_tokens
        out: set[float] = set()
        if self.linear is not None and tokens > 0:
            out |= {x / tokens for x in self.linear.breakpoints()}
        if self.attn_decode is not None and per_sequence.decodes > 0:
            table = self.attn_decode.at_context(per_sequence.decode_keys / per_sequence.decodes)
            out |= {x / per_sequence.decodes for x in table.breakpoints()}
        if self.all_reduce is not None and tokens * message_bytes_per_token > 0:
            out |= {x / (tokens * message_bytes_per_token) for x in self.all_reduce.breakpoints()}
        return out


@dataclass(frozen=True, kw_only=True)
class KindTables:
    kind: str
    degrees: tuple[PartTables, ...]

    def at_degree(self, degree: int) -> PartTables | None:
        return next((t for t in self.degrees if t.degree == degree), None)


@dataclass(frozen=True, kw_only=True)
class ServingProfileV2:
    model: str
    dtype: str
    source: str
    kinds: tuple[KindTables, ...]
    path: str = "<memory>"
    version = 2

    def kind(self, name: str) -> KindTables:
        for entry in self.kinds:
            if entry.kind == name:
                return entry
        raise KeyError(name)

    def tables(self, kind: str, degree: int) -> PartTables | None:
        """The measured parts of `kind` at tensor-parallel `degree`; None where the profile has none."""
        try:
            return self.kind(kind).at_degree(degree)
        except KeyError:
            return None


def read_kind_v2(r: Reader, name: str) -> KindTables:
    """One kind's entry: `tp`, a mapping of degrees to their tables."""
    raw = r.get("tp")
    r.done()
    if not isinstance(raw, dict) or not raw:
        r.fail("expected a mapping of tensor-parallel degrees (1, 2, 4, ...) to tables", "tp")
    tp = r.child("tp", raw)
    degrees = []
    for key, value in raw.items():
        degree = _degree(key)
        if degree is None:
            tp.fail(f"degree {key!r} is not an integer from 1 to {MAX_DEGREE}")
        tp.used.add(key)
        degrees.append(_read_degree(tp.child(str(key), value), degree))
    if len({d.degree for d in degrees}) < len(degrees):
        tp.fail("a degree is given twice")
    return KindTables(kind=name, degrees=tuple(sorted(degrees, key=lambda d: d.degree)))


def _degree(key) -> int | None:
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    if isinstance(key, bool) or not isinstance(key, int) or not 1 <= key <= MAX_DEGREE:
        return None
    return key


def _read_degree(r: Reader, degree: int) -> PartTables:
    if not any(key in r.data for key in TABLES):
        r.fail(f"expected at least one of {', '.join(TABLES)}")
    if degree == 1 and "all_reduce_s" in r.data:
        r.fail("a single device runs no all-reduce (all_reduce_s is for degrees > 1)", "all_reduce_s")
    linear = read_table(r, "linear_layer_s", False)
    includes = r.get("linear_includes_elementwise", as_bool, default=False)
    if includes and linear is None:
        r.fail("given without linear_layer_s", "linear_includes_elementwise")
    out = PartTables(
        degree=degree,
        linear=linear,
        linear_includes_elementwise=includes,
        attn_decode=read_grid(r, "attn_decode_s"),
        all_reduce=read_table(r, "all_reduce_s", False),
    )
    r.done()
    return out
