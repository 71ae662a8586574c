"""`llm-planner profile-serving`: time a decoder layer's parts on this machine's GPU (or CPU) and
write them as a serving profile of version 2 (llm_planner.runtime.serve_parts; docs/serving.md,
"Serving profiles"), which `plan`, `score` and `serving-bounds` take with `--profile`."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform

import yaml
from rich.console import Console
from rich.progress import Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from llm_planner.cli.arg_types import increasing, whole
from llm_planner.core.atomic import check_writable, write_atomic
from llm_planner.core.constants import TORCH_DTYPES
from llm_planner.core.spec_fields import SpecError, as_safe_name
from llm_planner.cost.profile_tables import ServingProfileError, rising
from llm_planner.cost.serving_profile import parse_serving_profile
from llm_planner.cost.serving_profile_v2 import FORMAT_V2
from llm_planner.serving.inputs import decoder_config
from llm_planner.serving.workload import WorkloadError

TOKENS = "1,2,4,8,16,32,64,96,128,192,256,384,512,768,1024,1536,2048,3072,4096"
BATCHES = "1,2,4,8,16,32,64,128,256"
CONTEXTS = "128,256,512,1024,2048,4096,8192"


class ProfileServingError(ServingProfileError):
    """Bad input to `profile-serving`: the message names the flag and what is wrong."""


log = logging.getLogger(__name__)


def add_profile_serving_parser(sub) -> None:
    p = sub.add_parser(
        "profile-serving",
        help="time a decoder layer's parts (projections, decode attention) on this machine's device "
        "and write a serving profile (serving-profile/2) for --profile",
    )
    p.add_argument("--model", required=True, help="decoder preset name (see `llm-planner models`) or a config.json")
    p.add_argument("--kind", required=True, help="the cluster spec's device kind the profile is for")
    p.add_argument("-o", "--output", required=True, help="serving profile YAML to write")
    p.add_argument("--tp", type=increasing(1, 1024), default=(1,), help="tensor-parallel degrees (default: 1)")
    p.add_argument(
        "--dtype",
        choices=("fp16", "bf16", "fp32", "fp8"),
        help="default: bf16 on a GPU, fp32 on a CPU; fp8: the projections alone, W8A8 (a GPU with fp8 matrix units)",
    )
    p.add_argument("--device", default="auto", help="cuda, cuda:N or cpu (default: the first GPU, else the CPU)")
    p.add_argument("--tokens", type=increasing(1, 2**20, 2), default=TOKENS, help=f"linear table (default {TOKENS})")
    p.add_argument("--batches", type=increasing(1, 2**16, 2), default=BATCHES, help=f"attention (default {BATCHES})")
    p.add_argument("--contexts", type=increasing(1, 2**22, 2), default=CONTEXTS, help=f"attention ({CONTEXTS})")
    p.add_argument("--repeats", type=whole(1, 10_000), default=20, help="timed runs per point, median kept")
    p.add_argument("--warmup", type=whole(0, 1_000), default=3, help="untimed runs before them (default 3)")
    p.add_argument(
        "--attention",
        action="store_true",
        help="also write the decode attention table (torch's SDPA kernels; default: left to the kernel model, "
        "as an engine's paged decode kernels are not torch's)",
    )
    p.add_argument("--raw", help="also write every timing as JSON (with the whole layer but attention) to this file")


def cmd_profile_serving(args: argparse.Namespace, console: Console) -> int:
    from llm_planner.runtime import serve_parts  # torch: imported only when the command runs

    try:
        kind = as_safe_name(args.kind)
    except ValueError as exc:
        raise ProfileServingError(f"--kind: {exc}") from None
    try:
        config = decoder_config(args.model)
    except WorkloadError:
        raise ProfileServingError(f"--model {args.model!r}: not a decoder preset or a config.json") from None
    try:
        shapes = {k: serve_parts.member_shape(config, k) for k in args.tp}
    except serve_parts.PartsError as exc:
        raise ProfileServingError(f"--model/--tp: {exc}") from None
    for path in (args.output, args.raw):
        if path is not None:
            check_writable(path)
    device = _device(args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    _check_fp8(dtype, device, args.attention)
    raw = _measure_on(serve_parts, shapes, device, dtype, args, console)
    text = _profile_yaml(config.name, kind, dtype, raw, _source(device, args, raw), args.attention)
    try:
        parse_serving_profile(yaml.safe_load(text), source=args.output)  # what we write must load
    except SpecError as exc:
        raise ProfileServingError(f"{args.output}: the measured profile does not load: {exc}") from None
    write_atomic(args.output, text)
    if args.raw is not None:
        write_atomic(args.raw, json.dumps({"model": config.name, "kind": kind, "dtype": dtype, "tp": raw}, indent=1))
    console.print(f"wrote {args.output}: device kind {kind}, {config.name} in {dtype}, tp {_list(args.tp)}")
    return 0


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ProfileServingError(f"--device: expected cuda, cuda:N or cpu, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProfileServingError(f"--device {name}: CUDA is not available on this machine")
    if device.type not in ("cuda", "cpu"):
        raise ProfileServingError(f"--device: expected cuda, cuda:N or cpu, got {name!r}")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ProfileServingError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def _check_fp8(dtype: str, device, attention: bool) -> None:
    import torch

    if dtype != "fp8":
        return
    if attention:
        raise ProfileServingError("--dtype fp8 times the projections alone: leave out --attention")
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        raise ProfileServingError(
            f"--dtype fp8: needs a GPU with fp8 matrix units (compute capability 8.9+), not {device}"
        )


def _measure_on(serve_parts, shapes, device, dtype: str, args, console: Console) -> dict[int, dict]:
    """`_measure` with `device` the current CUDA device (graphs, streams and events are made on it);
    a part the device cannot run (out of memory, a shape its kernels refuse) exits 2 naming it."""
    import torch

    where = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    try:
        with where:
            return _measure(serve_parts, shapes, device, dtype, args, console)
    except torch.OutOfMemoryError:
        raise ProfileServingError(
            f"--device {device}: out of memory; give smaller --tokens, --batches or --contexts"
        ) from None
    except RuntimeError as exc:
        raise ProfileServingError(f"--model/--tp/--dtype: {device} cannot run a part: {exc}") from None


def _measure(serve_parts, shapes, device, dtype: str, args, console: Console) -> dict[int, dict]:
    """Every table, with a progress bar whose time left counts the points' FLOPs (a table of large
    token counts on a CPU runs for hours: the bar says so after its first points)."""
    total = sum(_work(serve_parts, shape, dtype, args) for shape in shapes.values())
    columns = (*Progress.get_default_columns()[:-1], TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"timing on {device}", total=total)
        timer = serve_parts.Timer(device, args.repeats, args.warmup, tick=lambda work: bar.advance(task, work))
        return _tables(serve_parts, shapes, timer, dtype, args, console)


def _work(serve_parts, shape, dtype: str, args) -> float:
    """The FLOPs of one member's points: the linear tables (two per token count but in fp8) and the
    attention grid (with --attention)."""
    linear = sum(serve_parts.linear_flops(shape, t) for t in args.tokens) * (1 if dtype == "fp8" else 2)
    grid = [(b, c) for b in args.batches for c in args.contexts] if args.attention else []
    return linear + sum(serve_parts.attention_flops(shape, b, c) for b, c in grid)


def _tables(serve_parts, shapes, timer, dtype: str, args, console: Console) -> dict[int, dict]:
    import torch

    if dtype == "fp8":
        return {k: {"linear_layer_s": serve_parts.fp8_linear_table(s, args.tokens, timer)} for k, s in shapes.items()}
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    out = {}
    for k, shape in shapes.items():
        grid = f", {len(args.batches)} x {len(args.contexts)} attention" if args.attention else ""
        console.print(f"tp {k}: {len(args.tokens)} token counts{grid}")
        full, gemms = serve_parts.linear_tables(shape, args.tokens, timer, torch_dtype)
        out[k] = {"layer_s": full, "linear_layer_s": gemms}
        if args.attention:
            attn, backend = serve_parts.attn_grid(shape, args.batches, args.contexts, timer, torch_dtype)
            out[k].update(attn_decode_s=attn, attention_backend=backend)
    return out


def _source(device, args, raw: dict[int, dict]) -> str:
    import torch

    backends = sorted({tables["attention_backend"] for tables in raw.values() if "attention_backend" in tables})
    attention = (
        f"decode attention by torch's scaled_dot_product_attention ({', '.join(backends)} backend)"
        if backends
        else "decode attention from the kernel model"
    )
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    return (
        f"llm-planner profile-serving on {where} (torch {torch.__version__}); median of {args.repeats} runs after "
        f"{args.warmup} warm-ups, CUDA graphs on a GPU; the four projections as the linear table (elementwise "
        f"work from the kernel model); {attention}; all-reduce from the kernel model"
    )


def _profile_yaml(model: str, kind: str, dtype: str, raw: dict[int, dict], source: str, attention: bool) -> str:
    tp = {}
    for k, tables in raw.items():
        linear, raised = rising(tables["linear_layer_s"])
        if raised:
            log.warning(
                "tp %d: %d of %d linear-layer times fall below the one before them (timing noise); raised to it, "
                "as a time does not fall with more tokens (more --repeats steady the timings)",
                k,
                raised,
                len(linear),
            )
        tp[k] = {
            "linear_layer_s": [[t, _s(x)] for t, x in linear],
            "linear_includes_elementwise": False,
        }
        if attention:
            tp[k]["attn_decode_s"] = [[b, c, _s(x)] for b, c, x in tables["attn_decode_s"]]
    doc = {"format": FORMAT_V2, "model": model, "dtype": dtype, "source": source, "kinds": {kind: {"tp": tp}}}
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)


def _s(seconds: float) -> float:
    return float(f"{seconds:.4g}")


def _list(values) -> str:
    return ", ".join(str(v) for v in values)
