"""The runs of benchmarks/bench_serve.py: serving plans of chosen layouts on the localhost serving
spec, and the table of measured against predicted from their run reports (no MPI here).

A run is one layout at one concurrency. Its plan file is what `plan --objective serving` writes for
that replica (the serving model's figures at the operating point, the layer split the model picks),
built by the same library calls; its `inputs.cluster` is the spec the prediction comes from, so
`launch` predicts with that spec (the calibrated one for the judged runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llm_planner.serving.api import fixed_plan_data, replica_record
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.layout import Pattern, Segment
from llm_planner.serving.plan_file import input_digest, save_serving_plan
from llm_planner.serving.workload import RequestShape, ServingWorkload

REPO = Path(__file__).resolve().parents[1]
CLUSTER = "cluster_specs/localhost-serve.yaml"
MODEL = "cluster_specs/localhost-serve-gpt2"
CLASS = "localhost/cpu-core"
DTYPE = "fp32"
TOKEN_BUDGET = 64
TOLERANCE = 0.15  # the target: within 15%
TTFT_TOLERANCE = 0.30  # the TTFT's: within 30%


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A replica pattern: the tensor-parallel degree of each stage, micro-batches in flight, copies."""

    name: str
    degrees: tuple[int, ...]
    micro_batches: int = 1
    copies: int = 1

    @property
    def ranks(self) -> int:
        return sum(self.degrees) * self.copies

    @property
    def processes(self) -> int:
        """Processes a launch runs: its ranks, and the front end that spreads requests over copies."""
        return self.ranks + (self.copies > 1)


@dataclass(frozen=True, kw_only=True)
class Run:
    """One launch: a layout at one concurrency per replica."""

    layout: Layout
    concurrency: int
    role: str  # "calibration", "judged", or "oversubscribed" (more processes than cores: shown, not judged)

    @property
    def name(self) -> str:
        return f"{self.layout.name}-c{self.concurrency}"


SINGLE = Layout(name="single", degrees=(1,))
TP2 = Layout(name="tp2", degrees=(2,))
PIPELINE = Layout(name="pipeline", degrees=(1, 1), micro_batches=2)
MIXED = Layout(name="tp2-tp1", degrees=(2, 1), micro_batches=2)
TWO_REPLICAS = Layout(name="two-replicas", degrees=(1,), copies=2)

CALIBRATION = (
    Run(layout=SINGLE, concurrency=1, role="calibration"),
    Run(layout=SINGLE, concurrency=8, role="calibration"),
    Run(layout=TP2, concurrency=4, role="calibration"),
)
JUDGED_LAYOUTS = ((SINGLE, (2, 4)), (PIPELINE, (4, 8)), (MIXED, (4, 8)), (TWO_REPLICAS, (2, 4)))


def judged_runs(cores: int) -> tuple[Run, ...]:
    """The runs that judge the calibrated model: those whose processes fit the machine's `cores`
    (each rank then has the one-core device the spec gives it); the others still run, shown as
    "oversubscribed": ranks take turns on a core, which no plan for this spec describes."""
    return tuple(
        Run(layout=layout, concurrency=c, role="judged" if layout.processes <= cores else "oversubscribed")
        for layout, cs in JUDGED_LAYOUTS
        for c in cs
    )


def workload(prompt_len: int, output_len: int) -> ServingWorkload:
    # the TPOT target only bounds the planner's search; these runs fix the operating point
    return ServingWorkload(requests=(RequestShape(prompt_len=prompt_len, output_len=output_len),), tpot_slo_s=10.0)


def _devices(layout: Layout) -> list[list[list[str]]]:
    """Each copy's stages' device names, in order from cpu-core:0."""
    names = iter(f"{CLASS}:{i}" for i in range(layout.ranks))
    return [[[next(names) for _ in range(k)] for k in layout.degrees] for _ in range(layout.copies)]


def build_plan(run: Run, cluster: str, path: Path, *, prompt_len: int, output_len: int) -> Path:
    """The serving plan of `run` scored on `cluster` (a path relative to the repository or absolute;
    the plan names it by its absolute path, as a plan's inputs are read beside the plan)."""
    cluster = str((REPO / cluster).resolve())
    load = workload(prompt_len, output_len)
    options = ServingOptions(allow_cpu=True, max_batched_tokens=TOKEN_BUDGET)
    ctx = build_context(cluster, str(REPO / MODEL), load, DTYPE, options)
    layout = tuple(Segment(CLASS, k, 1) for k in run.layout.degrees)
    replica = ctx.replica(layout)
    layers = replica.split_layers(run.concurrency, run.layout.micro_batches)
    if layers is None:
        raise SystemExit(f"{run.name}: no layer split of {MODEL} fits {cluster}")
    ev = replica.evaluate(layers, run.concurrency, run.layout.micro_batches)
    pattern = Pattern(layout=layout, ev=ev)
    records = [replica_record(ctx, pattern, 1, [copy]) for copy in _devices(run.layout)]
    model_sha256 = input_digest(str(REPO / MODEL / "config.json"), "model")
    data = fixed_plan_data(
        ctx, cluster=cluster, model_name=str(REPO / MODEL), model_sha256=model_sha256, records=records
    )
    save_serving_plan(data, path)
    return path


def _lower_median(values: list, key=None):
    """The middle of `values` by `key` (the lower middle of an even count)."""
    ordered = sorted(values, key=key)
    return ordered[(len(ordered) - 1) // 2]


def median_report(reports: list[dict]) -> dict:
    """The report of median tokens/s among repeats of one run (the lower middle of an even count)."""
    return _lower_median(reports, key=lambda r: r["total"]["measured"]["tokens_per_s"])


def spread(reports: list[dict]) -> float:
    """(largest - smallest) / median of the repeats' tokens/s: how far this machine moved between them."""
    rates = [r["total"]["measured"]["tokens_per_s"] for r in reports]
    return (max(rates) - min(rates)) / _lower_median(rates)


def _figure(report: dict, block: str, key: str) -> float | None:
    """A report's figure: tokens/s of the run (all replicas); TPOT or TTFT, the mean over its replicas
    (measured: weighted by their requests; the steady TTFT by their steady requests, None when a
    replica has none)."""
    if key == "tokens_per_s":
        return report["total"][block]["tokens_per_s"]
    replicas = report["replicas"]
    if block == "predicted":
        return sum(r[block][key] for r in replicas) / len(replicas)
    if key == "ttft_steady_s":
        if any(r[block][key] is None for r in replicas):
            return None
        weights = [r[block]["steady_requests"] for r in replicas]
    else:
        weights = [r["requests_completed"] for r in replicas]
    return sum(r[block][key] * w for r, w in zip(replicas, weights)) / sum(weights)


def row(run: Run, reports: list[dict], load: float | None) -> dict:
    """One table row from a run's repeats: each measured figure (`_figure`: tokens/s, TPOT, TTFT) the
    median of the repeats' (the lower middle of an even count), the predicted one (the same plan in
    every repeat) and predicted / measured; `repeats` and their tokens/s `spread`."""
    replicas = median_report(reports)["replicas"]
    out = {
        "run": run.name,
        "role": run.role,
        "layout": replicas[0]["layout"] + (f" x{len(replicas)}" if len(replicas) > 1 else ""),
        "concurrency": run.concurrency,
        "micro_batches": run.layout.micro_batches,
        "ranks": run.layout.ranks,
        "requests": sum(r["requests_completed"] for r in replicas),
        "load_before": load,
        "repeats": len(reports),
        "spread": spread(reports),
    }
    for key in ("tokens_per_s", "tpot_s", "ttft_s"):
        measured = _lower_median([_figure(r, "measured", key) for r in reports])
        predicted = _figure(reports[0], "predicted", key)
        out[f"{key}_measured"], out[f"{key}_predicted"] = measured, predicted
        out[f"{key}_ratio"] = predicted / measured
    steady = [_figure(r, "measured", "ttft_steady_s") for r in reports]
    out["ttft_steady_s_measured"] = _lower_median(steady) if None not in steady else None
    out["ttft_steady_s_ratio"] = out["ttft_s_predicted"] / out["ttft_steady_s_measured"] if None not in steady else None
    out["within"] = all(abs(out[f"{k}_ratio"] - 1) <= TOLERANCE for k in ("tokens_per_s", "tpot_s"))
    ratio = out["ttft_steady_s_ratio"]
    out["ttft_within"] = ratio is not None and abs(ratio - 1) <= TTFT_TOLERANCE
    return out


COLUMNS = [
    "run",
    "role",
    "layout",
    "concurrency",
    "micro_batches",
    "ranks",
    "requests",
    "load_before",
    "repeats",
    "spread",
    *(f"{k}_{w}" for k in ("tokens_per_s", "tpot_s", "ttft_s") for w in ("measured", "predicted", "ratio")),
    "ttft_steady_s_measured",
    "ttft_steady_s_ratio",
    "within",
    "ttft_within",
]


def table(rows: list[dict]) -> str:
    """The Markdown table docs/benchmarks.md shows: one line per run, then the summary."""
    lines = [
        "| run | role | ranks | C | m | tokens/s meas. | pred. | ratio | TPOT ms meas. | pred. | ratio "
        "| TTFT ms meas. | steady | pred. | ratio (steady) | spread | within 15% | TTFT within 30% |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        cells = [r["run"], r["role"], r["ranks"], r["concurrency"], r["micro_batches"]]
        for key, scale, fmt in (("tokens_per_s", 1, ".1f"), ("tpot_s", 1e3, ".2f")):
            cells += [
                f"{r[f'{key}_measured'] * scale:{fmt}}",
                f"{r[f'{key}_predicted'] * scale:{fmt}}",
                f"{r[f'{key}_ratio']:.2f}",
            ]
        steady, ratio = r["ttft_steady_s_measured"], r["ttft_steady_s_ratio"]
        cells += [f"{r['ttft_s_measured'] * 1e3:.1f}", "-" if steady is None else f"{steady * 1e3:.1f}"]
        cells += [f"{r['ttft_s_predicted'] * 1e3:.1f}", "-" if ratio is None else f"{ratio:.2f}"]
        cells.append(f"{r['spread']:.0%}")
        cells += ["yes" if r["within"] else "no", "yes" if r["ttft_within"] else "no"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n\n" + summary(rows) + "\n"


def summary(rows: list[dict]) -> str:
    """Which judged runs have tokens/s and TPOT within 15% of the calibrated prediction."""
    judged = [r for r in rows if r["role"] == "judged"]
    good = [r["run"] for r in judged if r["within"]]
    bad = [r["run"] for r in judged if not r["within"]]
    over = [r["run"] for r in rows if r["role"] == "oversubscribed"]
    text = f"{len(good)} of {len(judged)} judged runs within 15% on tokens/s and mean TPOT"
    text += (f" ({', '.join(good)})" if good else "") + (f"; outside: {', '.join(bad)}" if bad else "") + "."
    ttft = [r["run"] for r in judged if r["ttft_within"]]
    text += f" {len(ttft)} of {len(judged)} within 30% on the steady TTFT" + (f" ({', '.join(ttft)})." if ttft else ".")
    if over:
        text += f" Not judged, more processes than the machine's cores: {', '.join(over)}."
    return text
