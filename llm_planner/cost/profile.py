"""Measured costs: the profile file, its fits, and the rules of its task keys and of how the cost model
uses it (the data, the keys and the measured pieces themselves are in llm_planner.cost.measured, which reads no file).

A profile holds what `llm-planner profile` measured (llm_planner.runtime.profile_rank
does the timing; this module is pure Python, no torch, no mpi4py):

- per device kind and *task key*, the median time of the task at several batch
  sizes b, and the affine fit  t(b) = fixed_s + per_sample_s * b  (non-negative
  least squares over the medians, scipy.optimize.nnls);
- per link class, the median one-way time of a message of n bytes at several
  sizes (half a ping-pong round trip) and the fit  t(n) = latency_s + n / bw_bytes_per_s.

A task key names what determines a task's time, so identical tasks share one
key and one measurement:

    decoders:   "<model_type>:<config hash>/<phase>:<seq_len>/<dtype>/<role>"
                role = embed | block | attn | mlp | final_norm | lm_head
                (every decoder block of a model shares the key "…/block")
    fx / RWNN:  "<graph name>:<structure hash>/<dtype>/<task name>"
                (each traced op its own key)

The config hash covers every field of the DecoderConfig but its name, the
structure hash the task names, kinds and edges; a profile made for another
model, phase, context length or dtype simply has no entry for the task. Graph
files without a builder's metadata (imported workloads) have no keys.

Tensor-parallel groups: "<key>@group<k>" is the task as a group of k runs it
(under MPI, every member timing its share at once, collectives included: what the
group's first member measured); "<key>@tp<k>" is one member's share
(llm_planner.runtime.tp_layers) timed alone, collectives left out. A group's time
is its "@group<k>" piece when the profile has one, else the "@tp<k>" piece plus
its collectives: a measured all-reduce of the group's class and degree, else the
ring model (cost.collective_pieces) over the group's link.

Using a profile (`build_problem(..., profile=...)`, llm_planner.placement.problem, in the same pass
as the roofline): for every task and device whose kind has an entry for the task's key (a group: its
"@group<k>" or "@tp<k>" key), the problem's cost pieces are the single measured piece (fixed_s,
per_sample_s); every other (task, device) keeps the roofline of llm_planner.cost.roofline and is reported as a
fallback. Measured links replace the cluster spec's latency and bandwidth for the transfers of the
graph's edges between every device pair of that class (the decode loop's token hand-off keeps the
spec's link).

File form (docs/profiling.md):

    format: llm_planner.cost.profile
    version: 1
    cluster: localhost-cpu
    model: {name: ..., phase: ..., seq_len: ..., dtype: ...}
    settings: {batch_sizes: [1, 2, 4], repetitions: 5, warmup: 2, threads: 1}
    devices: {cpu-core: [localhost/cpu-core:0]}
    device_kinds:
      cpu-core:
        "gpt2:1a2b3c4d/decode:16/fp32/block":
          {task: block.0, fixed_s: ..., per_sample_s: ..., batch_sizes: [...], median_s: [...], repetitions: 5}
    links:
      "localhost:cpu-core<->cpu-core":
        {devices: [a, b], latency_s: ..., bw_bytes_per_s: ..., sizes_bytes: [...], median_s: [...], repetitions: 20}
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from llm_planner.core.atomic import write_atomic
from llm_planner.core.fileio import dump_yaml, is_version, read_bytes, read_document
from llm_planner.cost.measured import LinkTiming, Profile, TaskTiming

PROFILE_FORMAT = "llm_planner.cost.profile"
PROFILE_VERSION = 1


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and field."""


# ----------------------------------------------------------------------------
# Fits


def fit_affine(xs: list[float] | tuple[float, ...], ys: list[float] | tuple[float, ...]) -> tuple[float, float]:
    """(a, c) >= 0 minimising sum (a + c * x - y)^2 (non-negative least squares)."""

    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"an affine fit needs at least two distinct x values, got {list(xs)}")
    x = np.asarray(xs, dtype=float)
    scale = float(x.max())  # columns of similar size keep nnls well conditioned
    coef, _ = nnls(np.stack([np.ones_like(x), x / scale], axis=1), np.asarray(ys, dtype=float))
    return float(coef[0]), float(coef[1] / scale)


def task_timing(task: str, batch_sizes: list[int], median_s: list[float], repetitions: int) -> TaskTiming:
    fixed, slope = fit_affine(batch_sizes, median_s)
    return TaskTiming(
        task=task,
        batch_sizes=tuple(int(b) for b in batch_sizes),
        median_s=tuple(float(t) for t in median_s),
        repetitions=int(repetitions),
        fixed_s=fixed,
        per_sample_s=slope,
    )


def link_timing(devices: tuple[str, str], sizes: list[int], median_s: list[float], repetitions: int) -> LinkTiming:
    latency, inv_bw = fit_affine(sizes, median_s)
    bw = 1.0 / inv_bw if inv_bw > 0 else math.inf
    return LinkTiming(
        devices=(str(devices[0]), str(devices[1])),
        sizes_bytes=tuple(int(n) for n in sizes),
        median_s=tuple(float(t) for t in median_s),
        repetitions=int(repetitions),
        latency_s=latency,
        bw_bytes_per_s=bw,
    )


# ----------------------------------------------------------------------------
# Merging measurements of one kind made on several devices


def merge_task_timings(timings: list[TaskTiming]) -> TaskTiming:
    """One timing from several devices of one kind: per batch size, the median of their medians, refitted."""
    first = timings[0]
    if len(timings) == 1:
        return first
    if any(t.batch_sizes != first.batch_sizes for t in timings):
        raise ValueError(f"task {first.task!r}: measurements at different batch sizes cannot be merged")
    medians = [float(np.median([t.median_s[j] for t in timings])) for j in range(len(first.batch_sizes))]
    return task_timing(first.task, list(first.batch_sizes), medians, first.repetitions)


# ----------------------------------------------------------------------------
# File form


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    def timing(t: TaskTiming) -> dict[str, Any]:
        return {
            "task": t.task,
            "fixed_s": t.fixed_s,
            "per_sample_s": t.per_sample_s,
            "batch_sizes": list(t.batch_sizes),
            "median_s": list(t.median_s),
            "repetitions": t.repetitions,
        }

    def link(t: LinkTiming) -> dict[str, Any]:
        return {
            "devices": list(t.devices),
            "latency_s": t.latency_s,
            "bw_bytes_per_s": t.bw_bytes_per_s,
            "sizes_bytes": list(t.sizes_bytes),
            "median_s": list(t.median_s),
            "repetitions": t.repetitions,
        }

    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "cluster": profile.cluster,
        "model": dict(profile.model),
        "settings": dict(profile.settings),
        "environment": dict(profile.environment),
        "devices": {kind: list(names) for kind, names in profile.devices.items()},
        "device_kinds": {
            kind: {key: timing(t) for key, t in entries.items()} for kind, entries in profile.tasks.items()
        },
        "links": {name: link(t) for name, t in profile.links.items()},
    }


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write the profile atomically (llm_planner.core.atomic); ProfileError naming the path if it cannot be."""

    write_atomic(
        path,
        dump_yaml(profile_to_dict(profile), width=160, flow=None),
        ProfileError,
    )


class _Fields:
    """Typed reads of one mapping of the profile; errors name the file and the field's path."""

    def __init__(self, data: Any, source: str, where: str):
        if not isinstance(data, dict):
            raise ProfileError(f"{source}: {where or 'top level'}: expected a mapping, got {type(data).__name__}")
        self.data, self.source, self.where = data, source, where

    def fail(self, key: str, what: str) -> ProfileError:
        return ProfileError(f"{self.source}: {self.where}{'.' if self.where else ''}{key}: {what}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "missing required field")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(key, f"expected {names}, got {value!r}")
        return value

    def seconds(self, key: str) -> float:
        value = float(self.get(key, (int, float)))
        if not (math.isfinite(value) and value >= 0):
            raise self.fail(key, f"must be a finite number >= 0, got {value}")
        return value

    def numbers(self, key: str, kind: type, positive: bool = False) -> list:
        values = self.get(key, list)
        for j, v in enumerate(values):
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float) if kind is float else kind)
                or not math.isfinite(v)
                or v < 0
                or (positive and v <= 0)
            ):
                raise self.fail(
                    f"{key}[{j}]", f"expected a {'positive' if positive else 'non-negative'} {kind.__name__}, got {v!r}"
                )
        return [kind(v) for v in values]

    def known(self, keys: set[str]) -> None:
        unknown = sorted(set(self.data) - keys)
        if unknown:
            raise self.fail(unknown[0], f"unknown key (known: {', '.join(sorted(keys))})")


def _read_task_timing(r: _Fields) -> TaskTiming:
    r.known({"task", "fixed_s", "per_sample_s", "batch_sizes", "median_s", "repetitions"})
    sizes, medians = r.numbers("batch_sizes", int, positive=True), r.numbers("median_s", float)
    if len(sizes) != len(medians):
        raise r.fail("median_s", f"has {len(medians)} values for {len(sizes)} batch sizes")
    return TaskTiming(
        task=r.get("task", str),
        batch_sizes=tuple(sizes),
        median_s=tuple(medians),
        repetitions=int(r.get("repetitions", int)),
        fixed_s=r.seconds("fixed_s"),
        per_sample_s=r.seconds("per_sample_s"),
    )


def _read_link_timing(r: _Fields) -> LinkTiming:
    r.known({"devices", "latency_s", "bw_bytes_per_s", "sizes_bytes", "median_s", "repetitions"})
    sizes, medians = r.numbers("sizes_bytes", int, positive=True), r.numbers("median_s", float)
    if len(sizes) != len(medians):
        raise r.fail("median_s", f"has {len(medians)} values for {len(sizes)} message sizes")
    devices = r.get("devices", list)
    if len(devices) != 2 or not all(isinstance(d, str) for d in devices):
        raise r.fail("devices", f"expected two device names, got {devices!r}")
    bw = float(r.get("bw_bytes_per_s", (int, float)))
    if not bw > 0:
        raise r.fail("bw_bytes_per_s", f"must be > 0, got {bw}")
    return LinkTiming(
        devices=(devices[0], devices[1]),
        sizes_bytes=tuple(sizes),
        median_s=tuple(medians),
        repetitions=int(r.get("repetitions", int)),
        latency_s=r.seconds("latency_s"),
        bw_bytes_per_s=bw,
    )


def profile_from_dict(data: Any, source: str = "<memory>") -> Profile:
    """Inverse of profile_to_dict; raises ProfileError naming `source` and the field."""
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"{source}: not a profile file (expected format: {PROFILE_FORMAT})")
    top = _Fields(data, source, "")
    if not is_version(data.get("version"), PROFILE_VERSION):
        raise ProfileError(
            f"{source}: version: unsupported profile version {data.get('version')!r} "
            f"(this build reads {PROFILE_VERSION})"
        )
    top.known({"format", "version", "cluster", "model", "settings", "environment", "devices", "device_kinds", "links"})
    kinds = _Fields(top.get("device_kinds", dict), source, "device_kinds")
    tasks: dict[str, dict[str, TaskTiming]] = {}
    for kind, entries in kinds.data.items():
        r = _Fields(entries, source, f"device_kinds.{kind}")
        tasks[str(kind)] = {
            str(key): _read_task_timing(_Fields(e, source, f"device_kinds.{kind}.{key}")) for key, e in r.data.items()
        }
    links = _Fields(top.get("links", dict, {}), source, "links")
    devices = _Fields(top.get("devices", dict, {}), source, "devices")
    return Profile(
        cluster=str(top.get("cluster", str)),
        model=dict(top.get("model", dict, {})),
        settings=dict(top.get("settings", dict, {})),
        environment=dict(top.get("environment", dict, {})),
        devices={str(kind): [str(d) for d in devices.get(kind, list)] for kind in devices.data},
        tasks=tasks,
        links={str(name): _read_link_timing(_Fields(e, source, f"links.{name}")) for name, e in links.data.items()},
    )


def load_profile(path: str | Path) -> Profile:
    """Read a profile YAML file; ProfileError names the file and field of any problem."""
    return profile_from_dict(read_document(path, ProfileError), source=str(path))


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(read_bytes(path, ProfileError)).hexdigest()
