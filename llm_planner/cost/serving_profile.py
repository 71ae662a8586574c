"""Serving profile: the measured time of one decoder layer per device kind.

    # measured time of one decoder layer per device kind (llm_planner serving profile)
    format: serving-profile/1
    model: llama2-70b
    dtype: fp16
    source: <free text: where it came from>
    kinds:
      <device kind name as in the cluster spec>:
        decode_layer_s: [[batch, seconds], ...]    # one layer, one decode step of `batch` sequences
        prefill_layer_s: [[tokens, seconds], ...]  # one layer, a prompt chunk of `tokens` tokens (optional)

Sizes are integers >= 0, strictly increasing, at least two points per table; times are finite
and >= 0 (they need not increase: measured kernels have steps). Between two points the time is
interpolated linearly; past the last point (and before the first) the nearest segment is
extended, floored at 0. An engine iteration that mixes decode and prefill work on a layer costs
the sum (as in Helix's simulator, docs/helix.md):

    layer_time_s(kind, b, p) = decode(b) [b > 0] + prefill(p) [p > 0]

llm-planner import helix writes such files from Helix's profiles (llm_planner.helix.inputs).

Version 2 (`format: serving-profile/2`, llm_planner.cost.serving_profile_v2) measures the parts of
a layer per tensor-parallel degree instead, and reads the linear layers once for a mixed
iteration; `llm-planner import vidur` writes it from Vidur's operator profiles. Both versions are
read here; tables interpolate as llm_planner.cost.profile_tables says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.fileio import read_document
from llm_planner.core.spec_fields import Reader, SpecError, as_str, as_text
from llm_planner.cost.profile_tables import LayerTable, ServingProfileError, read_table
from llm_planner.cost.serving_profile_v2 import FORMAT_V2, ServingProfileV2, read_kind_v2

FORMAT = "serving-profile/1"
FORMATS = (FORMAT, FORMAT_V2)


@dataclass(frozen=True, kw_only=True)
class KindProfile:
    kind: str
    decode: LayerTable
    prefill: LayerTable | None


@dataclass(frozen=True, kw_only=True)
class ServingProfile:
    model: str
    dtype: str
    source: str
    kinds: tuple[KindProfile, ...]
    path: str = "<memory>"
    version = 1

    def kind(self, name: str) -> KindProfile:
        for entry in self.kinds:
            if entry.kind == name:
                return entry
        raise KeyError(name)

    def layer_time_s(self, kind: str, decode_batch: int, prefill_tokens: int = 0) -> float:
        """One decoder layer on `kind` for `decode_batch` decode sequences and a `prefill_tokens` prompt chunk."""
        if decode_batch < 0 or prefill_tokens < 0:
            raise ValueError(f"decode_batch and prefill_tokens must be >= 0, got {decode_batch}, {prefill_tokens}")
        try:
            entry = self.kind(kind)
        except KeyError:
            raise ValueError(
                f"{self.path}: kinds: no entry for device kind {kind!r} "
                f"(the profile has {', '.join(k.kind for k in self.kinds)})"
            ) from None
        total = entry.decode.at(decode_batch) if decode_batch else 0.0
        if prefill_tokens:
            if entry.prefill is None:
                raise ValueError(
                    f"{self.path}: kinds.{kind}: no prefill_layer_s, needed for {prefill_tokens} prompt tokens"
                )
            total += entry.prefill.at(prefill_tokens)
        return total


def _profile_dtype(value) -> str:
    """The dtype the profile's times were measured in: one the planner knows."""
    name = as_str(value)
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPE_BYTES)})")
    return name


def parse_serving_profile(data: Any, source: str = "<memory>") -> ServingProfile | ServingProfileV2:
    """Build a ServingProfile (version 1) or ServingProfileV2 from a parsed document;
    ServingProfileError names `source`, the field and the problem."""
    try:
        top = Reader(source, "", data)
        fmt = top.get("format", as_str)
        if fmt not in FORMATS:
            top.fail(f"unknown format {fmt!r}; expected {' or '.join(map(repr, FORMATS))}", "format")
        kinds_raw = top.get("kinds")
        kinds_reader = top.child("kinds", kinds_raw)
        if not kinds_raw:
            top.fail("expected at least one device kind", "kinds")
        kinds = []
        for name in kinds_raw:
            kinds_reader.used.add(name)
            r = kinds_reader.child(str(name), kinds_raw[name])
            kinds.append(read_kind_v2(r, str(name)) if fmt == FORMAT_V2 else _read_kind_v1(r, str(name)))
        profile = (ServingProfileV2 if fmt == FORMAT_V2 else ServingProfile)(
            model=top.get("model", as_str),
            dtype=top.get("dtype", _profile_dtype),
            source=top.get("source", as_text, default=""),
            kinds=tuple(kinds),
            path=source,
        )
        top.done()
    except ServingProfileError:
        raise
    except SpecError as exc:  # the Reader's errors, under this file type's name
        raise ServingProfileError(str(exc)) from None
    return profile


def _read_kind_v1(r: Reader, name: str) -> KindProfile:
    out = KindProfile(
        kind=name, decode=read_table(r, "decode_layer_s", True), prefill=read_table(r, "prefill_layer_s", False)
    )
    r.done()
    return out


def load_serving_profile(path: str | Path) -> ServingProfile | ServingProfileV2:
    """Read a serving profile file (YAML or JSON), either version. Raises ServingProfileError naming
    file and field."""
    return parse_serving_profile(read_document(path, ServingProfileError, finite=True), source=str(path))
