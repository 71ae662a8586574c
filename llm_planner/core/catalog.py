"""The GPU catalog: device kinds a cluster spec may name with `catalog: NAME` instead of stating
every figure (llm_planner/core/data/gpu_catalog.yaml, its sources in its comments), the engine
factor sets a kind may take over its entry's with `engine: NAME` (core/data/engine_factors.yaml:
serving factors fitted on one engine's runs alone), and the efficiencies a kind gets when it names
no entry and states none.

An entry holds device kind fields written as a spec writes them and read by the spec's own
parsers (llm_planner.core.spec_kinds), so `catalog_entry(name)` is exactly what a spec naming it
would have stated. The file is read once per process.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from llm_planner.core.fileio import load_document
from llm_planner.core.spec_fields import Reader, SpecError, as_safe_name
from llm_planner.core.spec_kinds import REQUIRED_KIND_FIELDS, read_kind_fields

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "gpu_catalog.yaml"
ENGINES_PATH = Path(__file__).resolve().parent / "data" / "engine_factors.yaml"
# What every entry states: the required kind fields, the efficiencies and the fixed times.
ENTRY_FIELDS = (
    *REQUIRED_KIND_FIELDS,
    "compute_efficiency",
    "mem_efficiency",
    "overhead_s",
    "collective_overhead_s",
    "collective_efficiency",
    "step_overhead_s",
    "sequence_overhead_s",
)
# (compute_efficiency, mem_efficiency) of a kind that names no catalog entry and states neither,
# by device type. GPUs and accelerators: the catalog's figures (core/data/gpu_catalog.yaml): large
# GEMMs reach about 0.67 of peak FLOP/s in Vidur's operator profiles (microsoft/vidur, MLSys 2024),
# and 0.76 of HBM peak is the bandwidth fitted on measured vLLM and TensorRT-LLM decode (docs/fidelity.md). CPU
# sockets: the figures every example spec gives its CPUs, an order of magnitude rather than a
# profile (about half the vector peak for large single-precision GEMMs, about 70% of DRAM peak
# for streaming reads). Calibrate them from a run (`llm-planner calibrate`).
DEFAULT_EFFICIENCY = {"gpu": (0.67, 0.76), "accelerator": (0.67, 0.76), "cpu": (0.5, 0.7)}


@functools.cache
def _catalog() -> dict[str, dict[str, Any]]:
    """Entry name -> its fields, parsed; SpecError naming the catalog file, the entry and the field."""
    data, _ = load_document(CATALOG_PATH, SpecError, finite=True)
    top = Reader(str(CATALOG_PATH), "", data)
    out = {}
    for name in data:
        entry = top.child(str(name), top.get(name))
        try:
            as_safe_name(name)
        except ValueError as exc:
            top.fail(str(exc), str(name))
        fields = read_kind_fields(entry)
        for key in ENTRY_FIELDS:
            if key not in fields:
                entry.fail("missing required field", key)
        entry.done()
        out[name] = fields
    return out


def catalog_names() -> tuple[str, ...]:
    """The catalog's entry names, in the file's order."""
    return tuple(_catalog())


def catalog_entry(name: str) -> dict[str, Any]:
    """The fields of one entry (field -> value as the spec's loader parses it); KeyError if unknown."""
    return dict(_catalog()[name])


@functools.cache
def _engines() -> dict[str, tuple[tuple[str, ...], dict[str, dict[str, Any]]]]:
    """Engine name -> (the catalog entries its set stands for, entry -> the fields it sets there), parsed; SpecError
    naming the file, the set and the field."""
    data, _ = load_document(ENGINES_PATH, SpecError, finite=True)
    top = Reader(str(ENGINES_PATH), "", data)
    out = {}
    for name in data:
        entry = top.child(str(name), top.get(name))
        entries = entry.get("entries")
        if not isinstance(entries, list) or not entries or any(e not in _catalog() for e in entries):
            entry.fail(f"expected a non-empty list of catalog entries (known: {', '.join(_catalog())})", "entries")
        by_entry = _by_entry(entry, entries)
        fields = read_kind_fields(entry)
        entry.done()
        out[str(name)] = (tuple(entries), {e: {**fields, **by_entry.get(e, {})} for e in entries})
    return out


def _by_entry(entry: Reader, entries: list) -> dict[str, dict[str, Any]]:
    """A set's `by_entry`: catalog entry -> the fields fitted for that entry alone, over the set's own
    (an entry fitted on its own GPU's runs); {} where the set has none."""
    if "by_entry" not in entry.data:
        return {}
    block = entry.child("by_entry", entry.get("by_entry"))
    out = {}
    for name in block.data:
        if name not in entries:
            block.fail(f"not one of the set's entries ({', '.join(entries)})", str(name))
        one = block.child(str(name), block.get(name))
        out[str(name)] = read_kind_fields(one)
        one.done()
    block.done()
    return out


def engine_names() -> tuple[str, ...]:
    """The engine factor sets' names, in the file's order."""
    return tuple(_engines())


def engine_entries(engine: str) -> tuple[str, ...]:
    """The catalog entries the engine's set stands for; KeyError if unknown."""
    return _engines()[engine][0]


def engine_fields(engine: str, entry: str) -> dict[str, Any]:
    """The fields the engine's set gives a kind naming catalog `entry`; KeyError if the engine is unknown
    or its set does not stand for that entry."""
    entries, fields = _engines()[engine]
    if entry not in entries:
        raise KeyError(entry)
    return dict(fields[entry])
