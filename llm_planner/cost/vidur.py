"""Vidur's operator profiles -> a serving profile of version 2 (llm_planner.cost.serving_profile_v2).

Vidur (microsoft/vidur, MIT licence) publishes per-operator medians in milliseconds, measured in
fp16 with CUDA timers, in a checkout's

    data/profiling/compute/<gpu>/<model>/mlp.csv      one row per (num_tokens, num_tensor_parallel_workers)
    data/profiling/network/<gpu>_dgx/all_reduce.csv   one row per (size in bytes, num_workers, devices_per_node)

and, under Git LFS, attention.csv beside mlp.csv (a checkout without `git lfs pull` lacks it).
Per tensor-parallel degree k of mlp.csv the profile gets

    linear_layer_s[n] = sum over OPERATORS of time_stats.<op>.median at num_tokens n, in seconds

the projections with the norms, rotary embedding, activation and residual add, summed as Vidur's own
block time sums them (llm_planner.cost.serving_profile_v2: `linear_includes_elementwise: true`),
and for k > 1 all_reduce_s from all_reduce.csv's rows of k workers on one node (devices_per_node =
k, as Vidur's predictor takes them) at the sizes nearest to the powers of two from 2 KiB to 64 MiB
(`power_of_two_sizes`). Where a file holds several rows for one key (Vidur re-profiled
the point), the value is the mean of their medians. Attention is left to the kernel model, and the
profile's `source` says so (and whether attention.csv was there). Nothing is fitted.

A time does not fall as the tokens or bytes grow, but medians are noisy: a point below the one before
it is raised to it (a warning counts them), since the profile extends its end segments and a falling
one would reach zero, a layer for free. A time of 0 is refused, as is one over an hour or a
tensor-parallel degree over the profile format's most (MAX_DEGREE).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from llm_planner.core.fileio import read_text
from llm_planner.cost.profile_tables import ServingProfileError
from llm_planner.cost.profile_tables import rising as rising_rows
from llm_planner.cost.serving_profile_v2 import FORMAT_V2, MAX_DEGREE

OPERATORS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
MLP_KEYS = ("num_tokens", "num_tensor_parallel_workers")
ALL_REDUCE_KEYS = ("size", "num_workers", "devices_per_node", "collective")
ALL_REDUCE_TIME = "time_stats.all_reduce.median"
MS = 1e-3
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MOST_MS = 3.6e6  # an operator's median: an hour at most
log = logging.getLogger(__name__)


class VidurError(ServingProfileError):
    """Vidur's files missing or not as expected; the message names the file and what is wrong."""


def mlp_path(root: Path, gpu: str, model: str) -> Path:
    return root / "data" / "profiling" / "compute" / gpu / model / "mlp.csv"


def all_reduce_path(root: Path, gpu: str) -> Path:
    return root / "data" / "profiling" / "network" / f"{gpu}_dgx" / "all_reduce.csv"


def check_names(gpu: str, model: str) -> None:
    """--gpu and --model name folders under the checkout: plain names (the model's `org/name`)."""
    if not _PART.fullmatch(gpu) or ".." in gpu:
        raise VidurError(f"--gpu {gpu!r}: expected a folder name such as 'a100'")
    if not all(_PART.fullmatch(p) and ".." not in p for p in model.split("/")):
        raise VidurError(f"--model {model!r}: expected a Hugging Face name such as 'meta-llama/Meta-Llama-3-8B'")


def read_rows(path: Path, needed: Iterable[str]) -> list[dict[str, str]]:
    """The CSV's rows; VidurError naming the file for a missing file or column or a Git LFS pointer."""
    if not path.is_file():
        raise VidurError(f"{path}: no such file (Vidur's profiles are under data/profiling of a checkout)")
    text = read_text(path, VidurError)
    if text.startswith("version https://git-lfs"):
        raise VidurError(f"{path}: a Git LFS pointer, not the CSV (run `git lfs pull` in the checkout)")
    reader = csv.DictReader(text.removeprefix("\ufeff").splitlines())  # a byte-order mark is not a column's
    names = reader.fieldnames or ()
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise VidurError(f"{path}: column(s) named twice in the header: {', '.join(twice)}")
    missing = [c for c in needed if c not in names]
    if missing:
        raise VidurError(f"{path}: missing column(s) {', '.join(missing)}")
    rows = list(reader)
    if not rows:
        raise VidurError(f"{path}: no data rows")
    for line, row in enumerate(rows, start=2):
        if None in row or None in row.values():  # csv's marks for a row longer / shorter than the header
            have = len(names) + len(row.get(None, ())) - sum(v is None for v in row.values())
            raise VidurError(f"{path}: line {line}: {have} fields, the header has {len(names)}")
    return rows


def _number(path: Path, line: int, column: str, text: str | None, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        what = "a whole number" if integer else "a number"
        raise VidurError(f"{path}: line {line}: {column}: expected {what}, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise VidurError(f"{path}: line {line}: {column}: expected a finite number >= 0, got {text!r}")
    if not integer and value > MOST_MS:
        raise VidurError(f"{path}: line {line}: {column}: expected milliseconds up to an hour, got {text!r}")
    return value


def linear_tables(path: Path) -> dict[int, list[tuple[int, float]]]:
    """Degree -> [(num_tokens, seconds)] from mlp.csv (module docstring)."""
    columns = [f"time_stats.{op}.median" for op in OPERATORS]
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for line, row in enumerate(read_rows(path, (*MLP_KEYS, *columns)), start=2):
        tokens, degree = (int(_number(path, line, c, row[c], True)) for c in MLP_KEYS)
        if not 1 <= degree <= MAX_DEGREE:
            raise VidurError(
                f"{path}: line {line}: num_tensor_parallel_workers must be 1 to {MAX_DEGREE}, got {degree}"
            )
        groups[(degree, tokens)].append(sum(_number(path, line, c, row[c], False) for c in columns) * MS)
    return _tables(groups)


def all_reduce_tables(path: Path, degrees: Iterable[int]) -> dict[int, list[tuple[int, float]]]:
    """Degree -> [(bytes, seconds)] of one all-reduce over that many GPUs of one node."""
    wanted = set(degrees)
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for line, row in enumerate(read_rows(path, (*ALL_REDUCE_KEYS, ALL_REDUCE_TIME)), start=2):
        if row["collective"] != "all_reduce":
            continue
        size, workers, per_node = (int(_number(path, line, c, row[c], True)) for c in ALL_REDUCE_KEYS[:3])
        if workers in wanted and per_node == workers:
            groups[(workers, size)].append(_number(path, line, ALL_REDUCE_TIME, row[ALL_REDUCE_TIME], False) * MS)
    kept = {k: power_of_two_sizes(s for w, s in groups if w == k) for k in wanted}
    return _tables({(w, s): ts for (w, s), ts in groups.items() if s in kept[w]})


def power_of_two_sizes(sizes: Iterable[int]) -> set[int]:
    """Of Vidur's all-reduce sizes (a linear grid of about a thousand), the one nearest in log scale to
    each power of two from 2 KiB to 64 MiB (as benchmarks/vidur_refs.py picks them): time is close to
    affine in size between them, and a thousand breakpoints would slow the serving bounds for nothing."""
    sizes = sorted(s for s in set(sizes) if s > 0)
    return {min(sizes, key=lambda s: abs(math.log2(s) - k)) for k in range(11, 27)} if sizes else set()


def _tables(groups: dict[tuple[int, int], list[float]]) -> dict[int, list[tuple[int, float]]]:
    out: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (degree, size), values in sorted(groups.items()):
        out[degree].append((size, sum(values) / len(values)))
    return dict(out)


def vidur_profile_yaml(root: str | Path, gpu: str, model: str, kind: str | None = None) -> str:
    """A serving-profile/2 document from the Vidur checkout at `root` (module docstring)."""
    check_names(gpu, model)
    root = Path(root)
    mlp = mlp_path(root, gpu, model)
    linear = linear_tables(mlp)
    for degree, rows in linear.items():
        if len(rows) < 2:
            raise VidurError(f"{mlp}: tensor-parallel degree {degree}: needs at least two num_tokens, got {len(rows)}")
    linear = {k: rising(mlp, f"tensor-parallel degree {k}", rows) for k, rows in linear.items()}
    wider = [k for k in linear if k > 1]
    net = all_reduce_path(root, gpu)
    reduce = all_reduce_tables(net, wider) if wider else {}
    reduce = {k: rising(net, f"{k} workers", rows) for k, rows in reduce.items() if len(rows) >= 2}
    said = "absent" if not mlp.with_name("attention.csv").is_file() else "not read"
    notes = [f"attention from the kernel model (attention.csv {said})"]
    notes += [f"tp {k}: all-reduce from the kernel model (under two sizes in all_reduce.csv)" for k in wider]
    notes = notes[:1] + [n for k, n in zip(wider, notes[1:]) if k not in reduce]
    files = f"{gpu}/{model}/mlp.csv" + (f", {gpu}_dgx/all_reduce.csv" if reduce else "")
    source = f"microsoft/vidur data/profiling ({files}); " + "; ".join(notes)
    lines = [
        "# measured parts of one decoder layer per device kind and tensor-parallel degree",
        "# (llm_planner serving profile), imported from Vidur's operator profiles (ms -> s);",
        "# linear_layer_s: the sum of the medians of " + ", ".join(OPERATORS[:5]) + ",",
        "#   " + ", ".join(OPERATORS[5:]),
        f"format: {FORMAT_V2}",
        f"model: {json.dumps(model)}",
        "dtype: fp16",
        f"source: {json.dumps(source)}",
        "kinds:",
        f"  {json.dumps(kind or gpu)}:",
        "    tp:",
    ]
    for degree, rows in sorted(linear.items()):
        lines += [f"      {degree}:", f"        linear_layer_s: {_pairs(rows)}"]
        lines.append("        linear_includes_elementwise: true")
        if degree in reduce:
            lines.append(f"        all_reduce_s: {_pairs(reduce[degree])}")
    return "\n".join(lines) + "\n"


def rising(path: Path, what: str, rows: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The table with each time below the one before it raised to it (module docstring; a warning
    counts them); VidurError naming the file for a time of 0."""
    zero = next((size for size, t in rows if t <= 0), None)
    if zero is not None:
        raise VidurError(f"{path}: {what}: a time of 0 at {zero:,}: not a measurement")
    out, raised = rising_rows(rows)
    if raised:
        log.warning(
            "%s: %s: %d of %d times fall below the one before them (noisy medians); raised to it, as a time "
            "does not fall with more work",
            path,
            what,
            raised,
            len(rows),
        )
    return out


def _pairs(rows: list[tuple[int, float]]) -> str:
    return "[" + ", ".join(f"[{size}, {_seconds(t)}]" for size, t in rows) + "]"


def _seconds(t: float) -> str:
    """Six significant digits, written so YAML reads a float (1.5e-05, never 1.5e-5 nor 1e-05)."""
    text = f"{t:.6g}"
    if "e" in text and "." not in text.split("e")[0]:
        text = text.replace("e", ".0e")
    return text
