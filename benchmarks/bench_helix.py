"""Score layouts with Helix's own simulator: decode tokens/s offline (docs/helix.md).

Needs a Helix checkout and the Python of an environment with its requirements:

    LLM_PLANNER_HELIX=<checkout> LLM_PLANNER_HELIX_PYTHON=<its python> \\
        .venv/bin/python benchmarks/bench_helix.py                 # Helix's two rows, 24-node cluster
    ... benchmarks/bench_helix.py layout.ini [more.ini]            # our layouts on that cluster

Each layout runs in a subprocess (benchmarks/helix_harness.py under Helix's Python) with the
settings of Helix's offline experiments: LLaMA-2 70B, Azure Conversation request lengths, 60 s
of warm-up, decode tokens counted over the next 600 simulated seconds, MaxFlow scheduling.
Without layout arguments the rows are Helix's own results for its 24-machine cluster
(artifact_evaluation/single_cluster, 4x A100 40GB, 8x L4, 12x T4):
- `helix-milp`: its MILP layout (layout_llama70b/ilp), reported 252.1 tokens/s;
- `separate-pipelines`: one pipeline per GPU type, each simulated alone on its sub-cluster with
  the naive scheduler and the queries in flight Helix used, the three rates summed (as Helix's
  script does), reported 124.3 tokens/s.
A layout argument is a Helix layout file (llm_planner.helix.layout_file.helix_layout writes them)
for --cluster; the simulator cluster file is written for it by the harness.

The table is printed and written, with results.csv and meta.json, to --out (default
benchmarks/results/helix). Each run takes minutes of one core; --jobs runs them in parallel.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import provenance  # benchmarks/provenance.py, beside this script

REPO = Path(__file__).resolve().parents[1]
HARNESS = Path(__file__).resolve().parent / "helix_harness.py"
SINGLE = "artifact_evaluation/single_cluster"  # inside the Helix checkout
COLUMNS = (
    "row",
    "decode_tokens_per_s",
    "helix_reported",
    "model_tokens_per_s",
    "decode_p50_s",
    "decode_p95_s",
    "prompt_p95_s",
    "runs",
    "wall_s",
)
MODEL_FOLDERS = {  # inside the Helix checkout, by Helix's model name
    "llama70b": "simulator/model_manager/llama2_70b",
    "llama30b": "simulator/model_manager/llama1_30b",
}
PROMPT_LEN = 763.0  # the Azure Conversation trace's mean prompt (docs/helix.md)


@dataclass(frozen=True)
class Run:
    """One simulation; paths relative to the Helix checkout unless absolute."""

    cluster: str
    layout: str
    simulator_cluster: str | None = None  # None: the harness writes it for the layout
    scheduler: str = "maxflow"
    initial_queries: int = 20
    force_set: bool = False
    model: str = "llama70b"  # Helix's model name (harness --model)
    online: float | None = None  # Helix's online mode at this mean rate of tokens/s (harness --online)


def helix_rows() -> dict[str, tuple[list[Run], float]]:
    """Helix's own rows (its layouts of its published cases), with the numbers it reports."""
    layouts = f"{SINGLE}/layout_llama70b"
    separate = [
        Run(
            cluster=f"{SINGLE}/config/{gpu}.ini",
            layout=f"{layouts}/separate/{gpu}_solution_file.ini",
            simulator_cluster=f"{layouts}/separate/{gpu}_simulator_cluster.ini",
            scheduler="naive",
            initial_queries=queries,
            force_set=True,
        )
        for gpu, queries in (("a100", 18), ("l4", 40), ("t4", 3))
    ]
    milp = _helix_milp("single_cluster", "cluster24")
    return {
        "helix-milp": ([milp], 252.1),
        "separate-pipelines": (separate, 124.3),
        "helix-30b": (helix_30b(), 339.6),
        "helix-milp-online": ([dataclasses.replace(milp, online=700.0)], 141.6),
        "helix-cluster42": ([_helix_milp("high_heterogeneity", "cluster42")], 645.6),
        "helix-3cluster24": ([_helix_milp("distributed_clusters", "3cluster24")], 98.0),
        "helix-milp-roundtrip": ([], None),
    }  # filled by roundtrip_run


def _helix_milp(case: str, cluster: str) -> Run:
    """Helix's MILP layout of LLaMA-2 70B on one of its published clusters, with its own simulator
    cluster file (artifact_evaluation/<case>/step3_simulation.py `helix ... offline`)."""
    return Run(
        cluster=f"artifact_evaluation/{case}/config/{cluster}.ini",
        layout=f"artifact_evaluation/{case}/layout_llama70b/ilp/ilp_sol.ini",
        simulator_cluster=f"artifact_evaluation/{case}/layout_llama70b/ilp/simulator_cluster.ini",
    )


def helix_30b() -> list[Run]:
    """Helix's own LLaMA-1 30B answer on its 24-machine cluster: one MILP layout per machine type,
    each simulated alone on its type's sub-cluster and the rates summed (its step3_simulation.py
    `helix llama30b offline`), reported 339.6 tokens/s."""
    return [
        Run(
            cluster=f"{SINGLE}/config/{gpu}.ini",
            layout=f"{SINGLE}/layout_llama30b/ilp/{gpu}/ilp_sol.ini",
            simulator_cluster=f"{SINGLE}/layout_llama30b/ilp/{gpu}/simulator_cluster.ini",
            model="llama30b",
        )
        for gpu in ("a100", "l4", "t4")
    ]


def layout_run(path: str, cluster: str, model: str, online: float | None = None) -> Run:
    """A layout argument: on its own cluster file when plan-helix wrote one beside it (a chain
    written as its own deployment, X.ini beside X.cluster.ini), else on --cluster."""
    own = Path(path).with_name(Path(path).stem + ".cluster.ini")
    cluster = str(own.resolve()) if own.exists() else cluster
    return Run(cluster=cluster, layout=str(Path(path).resolve()), model=model, online=online)


def roundtrip_run(checkout: Path, scratch: Path) -> list[Run]:
    """Helix's MILP layout through our names and back: the cluster file imported
    (llm_planner.helix.inputs), each machine's range given to our device, the layout written
    by llm_planner.helix.layout_file and its simulator cluster file by the harness. It must score
    what `helix-milp` scores."""
    from llm_planner.helix.inputs import device_helix_names, load_helix_cluster
    from llm_planner.helix.layout_file import helix_layout, read_helix_layout

    row = helix_rows()["helix-milp"][0][0]
    names = device_helix_names(load_helix_cluster(checkout / row.cluster))
    device_of = {helix: device for device, helix in names.items()}
    ranges = read_helix_layout((checkout / row.layout).read_text(), row.layout)
    stages = [(device_of[node], first, end) for node, (first, end) in ranges.items()]
    layout = scratch / "helix-milp-roundtrip.ini"
    layout.write_text(helix_layout(stages, names, num_layers=80))
    return [Run(cluster=row.cluster, layout=str(layout))]


def profiles_for(run: Run, checkout: Path, default: str) -> str:
    """The machine profiles beside the run's cluster file (Helix keeps one per case), else `default`."""
    cluster = Path(run.cluster) if Path(run.cluster).is_absolute() else checkout / run.cluster
    beside = cluster.with_name("machine_profiles.ini")
    return str(beside) if beside.exists() else default


def model_estimate(run: Run, checkout: Path, profiles: str) -> float | None:
    """What `llm-planner plan-helix --score` estimates for the layout on the run's cluster file
    (llm_planner.helix.plan.score_layout: routed as Helix routes); None when Helix would refuse it."""
    from llm_planner.helix.inputs import HelixError
    from llm_planner.helix.plan import load_inputs, score_layout

    at = lambda p: p if Path(p).is_absolute() else checkout / p  # noqa: E731
    inputs = load_inputs(at(run.cluster), at(profiles), checkout / MODEL_FOLDERS[run.model], None)
    try:
        own = at(run.simulator_cluster) if run.simulator_cluster else None  # Helix's graph for its layout
        return score_layout(inputs, at(run.layout), PROMPT_LEN, own)[-1].tokens_per_s
    except HelixError:
        return None


def simulate(
    run: Run, checkout: Path, python: str, profiles: str, warm_up_s: float = 60.0, duration_s: float = 600.0
) -> dict:
    """Run the harness on one layout; its HELIX_RESULT line as a dict."""
    at = lambda p: str(p if Path(p).is_absolute() else checkout / p)  # noqa: E731
    cmd = [
        python,
        str(HARNESS),
        "--cluster",
        at(run.cluster),
        "--machine-profiles",
        at(profiles),
        "--layout",
        at(run.layout),
        "--scheduler",
        run.scheduler,
        "--model",
        run.model,
        "--initial-queries",
        str(run.initial_queries),
        "--warm-up",
        str(warm_up_s),
        "--duration",
        str(duration_s),
    ]
    if run.simulator_cluster:
        cmd += ["--simulator-cluster", at(run.simulator_cluster)]
    if run.online is not None:
        cmd += ["--online", str(run.online)]
    if run.force_set:
        cmd.append("--force-set")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(checkout), os.environ.get("PYTHONPATH")))),
        "MPLBACKEND": "Agg",
    }
    with tempfile.TemporaryDirectory(prefix="helix-run-") as work:
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("HELIX_RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"Helix's simulator failed on {run.layout} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("HELIX_RESULT "))


def markdown(rows: list[dict]) -> str:
    online = any(r.get("decode_p95_s") is not None for r in rows)
    head = "| layout | decode tokens/s (Helix's simulator) | Helix reports | plan-helix model |"
    head += " decode step p50 / p95 | prompt p95 |" if online else ""
    lines = [head + " simulations | wall |", "|---|---|---|---|" + ("---|---|" if online else "") + "---|---|"]
    for r in rows:
        reported = f"{r['helix_reported']:.1f}" if r["helix_reported"] else "-"
        model = f"{r['model_tokens_per_s']:.1f}" if r["model_tokens_per_s"] is not None else "-"
        latency = ""
        if online:
            latency = f" {_s(r.get('decode_p50_s'))} / {_s(r.get('decode_p95_s'))} | {_s(r.get('prompt_p95_s'))} |"
        lines.append(
            f"| {r['row']} | {r['decode_tokens_per_s']:.1f} | {reported} | {model} |{latency} {r['runs']} | "
            f"{r['wall_s']:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _pooled(results: list[dict], key: str, q: str) -> float | None:
    """A latency percentile of a row of one simulation (online rows are one simulation each: Helix
    pools the latencies of separate deployments, which these records do not keep)."""
    if len(results) != 1:
        return None
    return (results[0].get(key) or {}).get(q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "layouts", nargs="*", help="Helix layout files to score on --cluster (default: Helix's own rows)"
    )
    parser.add_argument(
        "--cluster", default=f"{SINGLE}/config/cluster24.ini", help="Helix cluster file for the layouts"
    )
    parser.add_argument("--machine-profiles", default=f"{SINGLE}/config/machine_profiles.ini")
    parser.add_argument(
        "--model", choices=sorted(MODEL_FOLDERS), default="llama70b", help="Helix's model for the layouts"
    )
    parser.add_argument(
        "--online",
        type=float,
        metavar="TOKENS_PER_S",
        help="Helix's online mode for the layouts given: requests arrive at this mean rate (Helix's 70B runs: "
        "700 on single24; the window is then 0 + 1800 s unless given); the table adds decode-step and prompt "
        "latencies",
    )
    parser.add_argument(
        "--sum",
        metavar="NAME",
        help="the layouts are one plan's deployments (plan-helix writes one per chain): one row NAME, rates summed",
    )
    parser.add_argument(
        "--rows",
        nargs="*",
        help="these of the built-in rows (helix-milp, separate-pipelines, helix-30b, helix-cluster42, "
        "helix-3cluster24, helix-milp-roundtrip, and helix-milp-online, Helix's online run; default: all but "
        "helix-milp-online when no layout is given)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        help="simulated seconds counted (Helix: 600 offline, 1800 online, the defaults; less for a smoke test)",
    )
    parser.add_argument(
        "--warm-up", type=float, help="simulated seconds before counting (Helix: 60 offline, 0 online, the defaults)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulations run at once")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "helix"))
    args = parser.parse_args()
    if not os.environ.get("LLM_PLANNER_HELIX") or not os.environ.get("LLM_PLANNER_HELIX_PYTHON"):
        sys.exit(
            "set LLM_PLANNER_HELIX to a Helix checkout and LLM_PLANNER_HELIX_PYTHON to the Python of its environment"
        )
    if args.sum and args.online is not None:
        sys.exit(
            "--online with --sum: Helix splits the offered rate among separate deployments (its 30B runs: 600, 200 "
            "and 170 tokens/s) and pools their latencies; run each deployment with its own --online rate instead"
        )
    checkout, python = Path(os.environ["LLM_PLANNER_HELIX"]), os.environ["LLM_PLANNER_HELIX_PYTHON"]
    facts = provenance.start(sys.argv)
    chosen = {
        k: v
        for k, v in helix_rows().items()
        if (args.rows is None and not args.layouts and k != "helix-milp-online") or k in (args.rows or ())
    }
    scratch = Path(tempfile.mkdtemp(prefix="helix-layouts-"))
    if "helix-milp-roundtrip" in chosen:
        chosen["helix-milp-roundtrip"] = (roundtrip_run(checkout, scratch), None)
    layouts = [p for p in args.layouts if not p.endswith(".cluster.ini")]
    for path in layouts:
        chosen[Path(path).name] = ([layout_run(path, args.cluster, args.model, args.online)], None)
    if args.sum and layouts:  # the layouts are deployments of one plan: one row, their rates summed
        for path in layouts:
            del chosen[Path(path).name]
        chosen[args.sum] = ([layout_run(path, args.cluster, args.model, args.online) for path in layouts], None)
    runs = [(name, run) for name, (row_runs, _) in chosen.items() for run in row_runs]
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"  # one line per finished simulation, written as each ends
    log.write_text("")

    def one(item: tuple[str, Run]) -> dict | None:
        """One simulation; a failure is recorded (and printed) without stopping the others."""
        layout = item[1].layout if not Path(item[1].layout).is_absolute() else Path(item[1].layout).name
        try:
            profiles = profiles_for(item[1], checkout, args.machine_profiles)
            online = item[1].online is not None  # Helix's windows: 60 + 600 s offline, 0 + 1800 s online
            warm_up = args.warm_up if args.warm_up is not None else (0.0 if online else 60.0)
            duration = args.duration if args.duration is not None else (1800.0 if online else 600.0)
            result = simulate(item[1], checkout, python, profiles, warm_up, duration)
        except RuntimeError as exc:
            message = str(exc).replace(str(checkout), "$HELIX")  # no machine paths
            print(f"{item[0]}: {message}", file=sys.stderr, flush=True)
            with open(log, "a") as f:
                f.write(json.dumps({"row": item[0], "layout": layout, "failed": message.splitlines()[0]}) + "\n")
            return None
        with open(log, "a") as f:  # no machine paths: the layout's name
            f.write(json.dumps({"row": item[0], "layout": layout, **result}) + "\n")
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, runs))
    if all(r is None for r in results):
        sys.exit("every simulation failed (runs.jsonl says which)")
    rows = []
    for name, (row_runs, reported) in chosen.items():
        mine = [res for (n, _), res in zip(runs, results) if n == name]
        if any(r is None for r in mine):
            print(f"{name}: left out of the table, a simulation of it failed", flush=True)
            continue
        rows.append(
            {
                "row": name,
                "decode_tokens_per_s": sum(r["decode_tokens_per_s"] for r in mine),
                "helix_reported": reported,
                "model_tokens_per_s": _summed(
                    model_estimate(r, checkout, profiles_for(r, checkout, args.machine_profiles)) for r in row_runs
                ),
                "decode_p50_s": _pooled(mine, "decode_latency_s", "p50"),
                "decode_p95_s": _pooled(mine, "decode_latency_s", "p95"),
                "prompt_p95_s": _pooled(mine, "prompt_latency_s", "p95"),
                "runs": len(mine),
                "wall_s": max(r["wall_s"] for r in mine),
            }
        )
        print(
            f"{name}: {rows[-1]['decode_tokens_per_s']:.1f} decode tokens/s"
            + (f" (Helix reports {reported})" if reported else "")
            + f", {[round(r['decode_tokens_per_s'], 1) for r in mine]}",
            flush=True,
        )
    facts["helix_commit"] = os.environ.get("LLM_PLANNER_HELIX_COMMIT") or _git_head(checkout)
    facts["total_wall_s"] = round(time.perf_counter() - started, 1)
    facts["helix_python"] = {k: next(r for r in results if r).get(k) for k in ("python", "numpy", "networkx")}
    facts["command"] = facts["command"].replace(str(checkout), "$HELIX")  # no machine paths
    provenance.record(out, facts)
    provenance.write_csv(out, COLUMNS, rows)
    (out / "table.md").write_text(markdown(rows))
    print(markdown(rows))


def _summed(values) -> float | None:
    """The sum of the runs' estimates; None when the model scores some run not."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def _git_head(checkout: Path) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    main()
