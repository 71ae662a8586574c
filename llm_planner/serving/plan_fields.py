"""Strict reading of a serving plan's fields (docs/plan-format.md, "Serving plans").

Every field is read with its type (llm_planner.core.plan_read.Fields): a string where a number
belongs, a list where a mapping does, a null, a boolean for a number, an integer key, a NaN or
infinite number, a number beyond its field's range, a missing field or an unknown one is refused
with a ServingPlanError naming the file and the field's path. The shapes must agree too (a
replica's layers, stage times and memory one per stage, its devices one list of stages per copy,
each stage as many devices as its degree, the layers adding up to model.num_layers), so that
`show`, `export` and `verify` index the plan without a traceback. Nothing here says the figures
are right: llm_planner.serving.verify re-derives them from the inputs.
"""

from __future__ import annotations

import re
from typing import Any

from llm_planner.core import units
from llm_planner.core.constants import DTYPE_BYTES
from llm_planner.core.fileio import is_version
from llm_planner.core.plan_read import Fields
from llm_planner.core.precision import PRECISION_KEYS, PrecisionError, precision_from_dict, uniform
from llm_planner.cost.eplb import MAX_REDUNDANT
from llm_planner.cost.moe_cost import check_imbalance, check_picks
from llm_planner.serving.classes import DP_ATTENTIONS
from llm_planner.serving.engines import ENGINES
from llm_planner.serving.workload import TPOT_SLO_RANGE_S, TTFT_SLO_RANGE_S

SERVING_FORMAT = "llm_planner.serving_plan"
# 6: model.precision and each replica's precision (weights, activations, KV cache), and
# serving.unrestricted (--exportable's price); 5: kernel-sum iteration cost, max_batched_tokens
SERVING_VERSION = 6
READ_VERSIONS = (5, 6)  # a version 5 plan is read with one dtype for everything (`upgrade`), no serving.unrestricted
SERVING_SOLVERS = ("serving", "engineer-best", "megatron")
BASELINES = ("engineer-best", "megatron")
MAX_COUNT = 1 << 20  # copies of one pattern, stages, degrees, micro-batches: far above any cluster
MAX_CONCURRENCY = 1 << 40  # sequences in flight of one replica (the search's doubling may pass 2**20)
MAX_TOKENS = 1 << 31  # prompt and output tokens of a request shape
MAX_SHAPES = 1000
_SHA256 = re.compile(r"[0-9a-f]{64}")

_TOP = ("format", "version", "objective", "inputs", "model", "workload", "options", "serving", "baselines")
_INPUTS = ("cluster", "cluster_sha256", "profile", "profile_sha256", "model_sha256")
_OPTIONS = (
    "allow_cpu",
    "max_tp",
    "exportable",
    "max_segments",
    "max_stages",
    "max_micro_batches",
    "time_limit_s",
    "max_batched_tokens",
    "solver",
)
_SERVING = (
    "tokens_per_s",
    "upper_bound_tokens_per_s",
    "device_prices",
    "gap",
    "status",
    "tpot_s",
    "ttft_s",
    "concurrency",
    "solve_time_s",
    "layouts_evaluated",
    "layouts_candidate",
    "layouts_left",
    "replicas",
)
# Where the planning time went (llm_planner.serving.api): a record, not a figure verify checks.
_SERVING_RECORDS = ("timings_s",)
# The candidate precisions of a plan made among allowed formats (llm_planner.serving.precision_choice).
_SERVING_CHOICES = ("precisions",)
_REPLICA = (
    "pattern",
    "count",
    "segments",
    "layers",
    "concurrency",
    "micro_batches",
    "tokens_per_s",
    "tpot_s",
    "ttft_s",
    "round_trip_s",
    "stage_s",
    "mem_bytes",
    "usable_bytes",
    "devices",
    "precision",
)
_BASELINE_REPLICA = ("pattern", "count", "concurrency", "micro_batches", "tpot_s", "layers", "max_mem_fraction")


def exactly(f: Fields, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """Every key of `keys` present, those of `optional` allowed, and no other (unknown ones named)."""
    unknown = [k for k in f.data if k not in keys + optional]
    if unknown:
        raise f.fail("", f"unknown field(s) {', '.join(unknown)} (expected {', '.join(keys)})")
    for key in keys:
        f.get(key)


def integer(f: Fields, key: str, low: int = 1, high: int = MAX_COUNT, *, nullable: bool = False) -> int | None:
    if nullable and f.get(key) is None:
        return None
    value = f.integer(key, minimum=low)
    if value > high:
        raise f.fail(key, f"must be <= {high:,}, got {value:,}")
    return value


def number(f: Fields, key: str, *, positive: bool = False, nullable: bool = False) -> float | None:
    """A finite number >= 0 (> 0 when `positive`)."""
    if nullable and f.get(key) is None:
        return None
    value = f.number(key, minimum=0.0)
    if positive and value <= 0:
        raise f.fail(key, f"must be > 0, got {value}")
    return value


def choice(f: Fields, key: str, options: tuple, *, nullable: bool = False) -> Any:
    value = f.string(key, nullable=nullable)
    if value is not None and value not in options:
        raise f.fail(key, f"{value!r} is not one of {', '.join(options)}")
    return value


def sha256(f: Fields, key: str, *, nullable: bool) -> str | None:
    value = f.string(key, nullable=nullable)
    if value is not None and not _SHA256.fullmatch(value):
        raise f.fail(key, "expected a sha256 digest (64 hexadecimal digits)")
    return value


def _list(f: Fields, key: str, length: int | None = None, *, low: int = 0, each: str = "stage") -> list:
    value = f.sequence(key)
    if length is not None and len(value) != length:
        raise f.fail(key, f"expected {length} item(s), one per {each}, got {len(value)}")
    if len(value) < low or len(value) > MAX_COUNT:
        raise f.fail(key, f"expected {low} to {MAX_COUNT:,} items, got {len(value)}")
    return value


def numbers(f: Fields, key: str, length: int | None = None) -> list[float]:
    values = _list(f, key, length, low=1)
    holder = Fields({str(i): v for i, v in enumerate(values)}, f.source, f.path(key), f.error)
    return [_item_number(holder, i) for i in range(len(values))]


def _item_number(holder: Fields, i: int) -> float:
    try:
        return holder.number(str(i), minimum=0.0)
    except holder.error as exc:  # name the item as a list index: stage_s[2]
        raise holder.error(str(exc).replace(f"{holder.where}.{i}:", f"{holder.where}[{i}]:")) from None


def integers(f: Fields, key: str, length: int | None = None, low: int = 1) -> list[int]:
    values = _list(f, key, length, low=1)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_COUNT:
            raise f.error(f"{f.source}: {f.path(key)}[{i}]: expected an integer from {low} to {MAX_COUNT:,}, got {v!r}")
    return values


def read_plan_fields(data: Any, source: str, error: type[Exception]) -> None:
    """Check every field of a serving plan's data (module docstring); `error` names the file and field."""
    top = Fields(data, source, "", error)
    exactly(top, _TOP)
    version = top.get("version")
    if top.get("format") != SERVING_FORMAT or not is_version(version, *READ_VERSIONS):
        raise top.fail(
            "format",
            f"expected {SERVING_FORMAT} version {' or '.join(map(str, READ_VERSIONS))} "
            "(re-run `plan` for an older one)",
        )
    choice(top, "objective", ("serving",))
    _inputs(top.mapping("inputs"))
    model = top.mapping("model")
    exactly(model, ("name", "dtype", "num_layers", "precision"), optional=("experts", "dense_layers"))
    if "dense_layers" in model.data:  # DeepSeek's dense first layers, on the first stage beside num_layers
        integer(model, "dense_layers")
    if "experts" in model.data:  # a mixture of experts: what show prints (verify checks it against the model)
        experts = model.mapping("experts")
        exactly(experts, ("num_experts", "experts_per_token"))
        integer(experts, "num_experts")
        integer(experts, "experts_per_token")
    if not model.string("name"):
        raise model.fail("name", "empty")
    choice(model, "dtype", tuple(DTYPE_BYTES))
    if precision(model).activations != model.get("dtype"):
        raise model.fail("precision", f"activations {model.get('precision')['activations']!r} differ from model.dtype")
    num_layers = integer(model, "num_layers")
    _workload(top.mapping("workload"))
    options = top.mapping("options")
    exactly(
        options,
        _OPTIONS,
        optional=(
            "expert_imbalance",
            "chunked_prefill",
            "dp_attention",
            "deepep",
            "dp_imbalance",
            "expert_picks",
            "eplb",
        ),
    )
    _dp_imbalance(options)
    _eplb(options)
    _expert_picks(options)
    for key in ("dp_attention", "deepep"):
        if not isinstance(options.data.get(key, False), bool):
            raise options.fail(key, "expected true or false")
    if options.data.get("chunked_prefill", True) is not True:
        raise options.fail(
            "chunked_prefill", "must be true: plans are made for engines with chunked prefill (docs/serving.md)"
        )
    if "expert_imbalance" in options.data and number(options, "expert_imbalance") < 1:
        raise options.fail(
            "expert_imbalance", f"must be >= 1 (1: uniform routing), got {options.get('expert_imbalance')}"
        )
    if not isinstance(options.get("allow_cpu"), bool):
        raise options.fail("allow_cpu", "expected true or false")
    for key in ("max_tp", "max_segments", "max_micro_batches"):
        integer(options, key, nullable=True)
    integer(options, "max_stages")
    integer(options, "max_batched_tokens")
    choice(options, "exportable", ENGINES, nullable=True)
    number(options, "time_limit_s", positive=True)
    choice(options, "solver", SERVING_SOLVERS)
    _serving(top.mapping("serving"), num_layers, version)
    baselines = top.mapping("baselines")
    exactly(baselines, BASELINES)
    for name in BASELINES:
        _baseline(baselines.mapping(name), num_layers)


def _inputs(f: Fields) -> None:
    exactly(f, _INPUTS)
    if not f.string("cluster"):
        raise f.fail("cluster", "empty: the plan names no cluster file")
    sha256(f, "cluster_sha256", nullable=False)
    profile = f.string("profile", nullable=True)
    digest = sha256(f, "profile_sha256", nullable=True)
    if (profile is None) != (digest is None):
        raise f.fail("profile_sha256", "a profile needs its hash, and a hash needs a profile")
    sha256(f, "model_sha256", nullable=True)


def _dp_imbalance(options: Fields) -> None:
    """options.dp_imbalance: null, or group size (a whole number >= 2) -> factor (>= 1)."""
    table = options.data.get("dp_imbalance")
    if table is None:
        return
    if not isinstance(table, dict):
        raise options.fail("dp_imbalance", "expected a mapping of group sizes to factors, or null")
    for k, factor in table.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise options.fail("dp_imbalance", f"group size {k!r}: expected a whole number >= 2")
        try:
            check_imbalance(factor)  # the model's own check of a factor
        except ValueError:
            raise options.fail("dp_imbalance", f"[{k}]: expected a number >= 1, got {factor!r}") from None


def _eplb(options: Fields) -> None:
    """options.eplb: null, or a whole number of redundant experts from 0 to MAX_REDUNDANT (the
    model's own count is checked against its experts where the plan is read into a context)."""
    redundant = options.data.get("eplb")
    if redundant is None:
        return
    if isinstance(redundant, bool) or not isinstance(redundant, int) or not 0 <= redundant <= MAX_REDUNDANT:
        raise options.fail(
            "eplb", f"expected null or a whole number of redundant experts from 0 to {MAX_REDUNDANT}, got {redundant!r}"
        )


def _workload(f: Fields) -> None:
    exactly(f, ("requests", "tpot_slo_s", "ttft_slo_s"))
    requests = _list(f, "requests", low=1)
    if len(requests) > MAX_SHAPES:
        raise f.fail("requests", f"more than {MAX_SHAPES} request shapes")
    for i, item in enumerate(requests):
        r = f.item("requests", i, item)
        exactly(r, ("prompt_len", "output_len", "weight"))
        integer(r, "prompt_len", high=MAX_TOKENS)
        integer(r, "output_len", high=MAX_TOKENS)
        number(r, "weight", positive=True)
    _target(f, "tpot_slo_s", TPOT_SLO_RANGE_S)
    if f.get("ttft_slo_s") is not None:
        _target(f, "ttft_slo_s", TTFT_SLO_RANGE_S)


def _target(f: Fields, key: str, bounds: tuple[float, float]) -> None:
    """A latency target in the range `plan` takes it in (what verify and export would refuse, show does too)."""
    try:
        units.parse_duration(number(f, key, positive=True), *bounds)
    except units.UnitError as exc:
        raise f.fail(key, str(exc)) from None


def _serving(f: Fields, num_layers: int, version: int) -> None:
    exactly(f, _SERVING + (("unrestricted",) if version >= 6 else ()), optional=_SERVING_RECORDS + _SERVING_CHOICES)
    if version >= 6 and f.get("unrestricted") is not None:
        _unrestricted(f.mapping("unrestricted"), num_layers)
    if "precisions" in f.data:
        for i, item in enumerate(_list(f, "precisions", low=2)):
            row = f.item("precisions", i, item)
            exactly(row, ("precision", "tokens_per_s", "upper_bound_tokens_per_s", "device_prices"))
            precision(row)
            number(row, "tokens_per_s")
            number(row, "upper_bound_tokens_per_s")
            _prices(row)
    if f.data.get("timings_s") is not None:  # seconds by part name: a record verify does not check
        timings = f.mapping("timings_s")
        for key in timings.data:
            number(timings, key)
    for key in ("tokens_per_s", "upper_bound_tokens_per_s", "gap", "tpot_s", "ttft_s", "solve_time_s"):
        number(f, key)
    choice(f, "status", ("optimal", "heuristic"))
    for key in ("concurrency", "layouts_evaluated", "layouts_candidate", "layouts_left"):
        integer(f, key, low=0, high=1 << 62)
    _prices(f)
    for i, item in enumerate(_list(f, "replicas", low=1)):  # a plan serves with at least one
        _replica(f.item("replicas", i, item), num_layers)


def precision(f: Fields, key: str = "precision"):
    """The Precision of mapping `key` (llm_planner.core.precision), each field a string."""
    p = f.mapping(key)
    exactly(p, PRECISION_KEYS)
    for k in PRECISION_KEYS:
        p.string(k)
    try:
        return precision_from_dict(p.data, f"{f.source}: {f.path(key)}")
    except PrecisionError as exc:
        raise f.error(str(exc)) from None


def upgrade(data: Any) -> Any:
    """A version-5 plan's data with the precision fields: its one `model.dtype` is the weights',
    activations' and KV cache's (what version 5 planned); its version stays 5 (it has no
    serving.unrestricted); anything else is returned as it is (read_plan_fields judges it)."""
    if not (isinstance(data, dict) and is_version(data.get("version"), 5) and isinstance(data.get("model"), dict)):
        return data
    try:
        stated = uniform(data["model"]["dtype"]).to_dict()
        replicas = data["serving"]["replicas"]
    except (KeyError, TypeError, PrecisionError):
        return data
    if not isinstance(replicas, list) or not all(isinstance(r, dict) for r in replicas):
        return data
    serving = dict(data["serving"], replicas=[dict(r, precision=dict(stated)) for r in replicas])
    return dict(data, model=dict(data["model"], precision=dict(stated)), serving=serving)


def _prices(f: Fields) -> None:
    if f.get("device_prices") is not None:
        prices = f.mapping("device_prices")
        for key in prices.data:
            number(prices, key)


def _unrestricted(f: Fields, num_layers: int) -> None:
    """serving.unrestricted: the best plan found without --exportable, its replicas without devices."""
    exactly(f, ("tokens_per_s", "upper_bound_tokens_per_s", "device_prices", "replicas"))
    number(f, "tokens_per_s")
    number(f, "upper_bound_tokens_per_s")
    _prices(f)
    for i, item in enumerate(_list(f, "replicas", low=1)):
        _replica(f.item("replicas", i, item), num_layers, with_devices=False)


def _replica(f: Fields, num_layers: int, *, with_devices: bool = True) -> None:
    exactly(f, _REPLICA if with_devices else tuple(k for k in _REPLICA if k != "devices"))
    precision(f)
    f.string("pattern")
    count = integer(f, "count")
    degrees = []
    for j, item in enumerate(_list(f, "segments", low=1)):
        seg = f.item("segments", j, item)
        exactly(seg, ("class", "degree", "stages"), ("attention",))
        seg.string("class")
        degree = integer(seg, "degree")
        if "attention" in seg.data:
            choice(seg, "attention", ("tp", *DP_ATTENTIONS))
        degrees += [degree] * integer(seg, "stages")
    stages = len(degrees)
    layers = integers(f, "layers", stages)
    if sum(layers) != num_layers:
        raise f.fail("layers", f"do not add up to model.num_layers {num_layers} (they add up to {sum(layers)})")
    concurrency = integer(f, "concurrency", high=MAX_CONCURRENCY)
    integer(f, "micro_batches", high=min(concurrency, MAX_COUNT))
    for key in ("tokens_per_s", "tpot_s", "ttft_s", "round_trip_s"):
        number(f, key)
    for key in ("stage_s", "mem_bytes", "usable_bytes"):
        numbers(f, key, stages)
    if not with_devices:
        return
    copies = _list(f, "devices", count, each="copy (count)")
    for c, copy in enumerate(copies):
        where = f"devices[{c}]"
        if not isinstance(copy, list) or len(copy) != stages:
            raise f.fail(where, f"expected a list of {stages} stage(s)")
        for s, names in enumerate(copy):
            if not (
                isinstance(names, list) and len(names) == degrees[s] and all(isinstance(n, str) and n for n in names)
            ):
                raise f.fail(f"{where}[{s}]", f"expected a list of {degrees[s]} device name(s)")


def _baseline(f: Fields, num_layers: int) -> None:
    exactly(f, ("tokens_per_s", "replicas"))
    number(f, "tokens_per_s")
    for i, item in enumerate(_list(f, "replicas")):
        r = f.item("replicas", i, item)
        exactly(r, _BASELINE_REPLICA)
        r.string("pattern")
        integer(r, "count")
        concurrency = integer(r, "concurrency", high=MAX_CONCURRENCY)
        integer(r, "micro_batches", high=min(concurrency, MAX_COUNT))
        number(r, "tpot_s")
        number(r, "max_mem_fraction")
        if sum(integers(r, "layers")) != num_layers:
            raise r.fail("layers", f"do not add up to model.num_layers {num_layers}")


def _expert_picks(options: Fields) -> None:
    """options.expert_picks: absent, or a list of chances from 0 to 1 (one per routed expert)."""
    picks = options.data.get("expert_picks")
    if picks is None:
        return
    try:
        check_picks(picks)  # the model's own check of the chances
    except ValueError as exc:
        raise options.fail("expert_picks", str(exc)) from None
