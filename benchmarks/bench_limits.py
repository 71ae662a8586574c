"""The input limits of docs/inputs.md, each planned at its size: wall time and peak memory.

    .venv/bin/python benchmarks/bench_limits.py [--cases NAME ...] [--timeout S] [--max-rss-gib G] [--out DIR]

Each case writes its inputs to the results folder and runs `llm-planner plan` on them in a child
process (the default solver, MILP-SPLIT, unless the case says otherwise), one case at a time.
Recorded: the exit code, the wall time, the peak resident memory of the command's largest process
(`ru_maxrss` of the child as `wait4` reports it, its own children included) and of its whole
process tree together (sampled every 0.2 s from /proc), and the plan file's size. A case that
runs past `--timeout` is killed and reported "timed out"; one whose process tree passes
`--max-rss-gib` is killed and reported "over memory cap" (a 24 GiB machine shared with others
cannot give more): neither is a limit that holds. The sizes come from the code's own limits
(`graph.ir.MAX_TASKS`, `MAX_EDGES`, `pipeline.MAX_TASK_DEVICE_PAIRS`, `spec.MAX_DEVICES`, the name
limits), so the table follows them when they change.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

from llm_planner.core.spec import MAX_DEVICES  # noqa: E402
from llm_planner.core.spec_fields import MAX_NAME_CHARS  # noqa: E402
from llm_planner.graph.ir import MAX_EDGES, MAX_TASK_NAME_CHARS, MAX_TASKS  # noqa: E402
from llm_planner.graph.models import ModelSpec, build_model_graph  # noqa: E402
from llm_planner.placement.inputs import MAX_TASK_DEVICE_PAIRS  # noqa: E402
from llm_planner.placement.problem import MAX_TRANSFER_ENTRIES  # noqa: E402

SPECS = REPO / "cluster_specs"
CLI = [sys.executable, "-m", "llm_planner.cli.main"]
COLUMNS = ("case", "what", "tasks", "edges", "devices", "exit", "outcome", "wall_s", "max_rss_mib", "tree_rss_mib")


def chain_graph(n: int, extra_back: int = 0, name_chars: int = 0) -> dict:
    """A chain of n tasks (a layer's costs each: 2 GFLOP, 4 MB moved, 4 MB of weights), and with
    `extra_back` k each task also reads the k tasks before its predecessor (a DAG of skip edges)."""
    pad = "x" * max(0, name_chars - 8)
    names = [f"{pad}t{i:07d}"[-name_chars:] if name_chars else f"t{i}" for i in range(n)]
    tasks = [
        {"name": names[i], "kind": "layer", "flops_per_sample": 2e9, "bytes_per_sample": 4e6, "weight_bytes": 4e6}
        for i in range(n)
    ]
    edges = [{"src": names[i - 1], "dst": names[i], "bytes_per_sample": 1e6} for i in range(1, n)]
    for k in range(2, extra_back + 2):
        edges += [{"src": names[i - k], "dst": names[i], "bytes_per_sample": 1e5} for i in range(k, n)]
    name = ("g" * name_chars) if name_chars else f"chain-{n}" + (f"-skip{extra_back}" if extra_back else "")
    return {"format": "llm_planner.graph", "version": 1, "name": name, "tasks": tasks, "edges": edges}


def scaled_cluster(base: str, copies: int, *, name: str | None = None, rename: int = 0) -> dict:
    """`cluster_specs/<base>.yaml` with every node's count multiplied by `copies`; with `rename`,
    the cluster, its device kinds and its nodes renamed to names of that many characters."""
    spec = yaml.safe_load((SPECS / f"{base}.yaml").read_text())
    for node in spec["nodes"]:
        node["count"] = node.get("count", 1) * copies
        if node["count"] > 1 and "{i}" not in str(node.get("hostname", "{i}")):
            node["hostname"] = f"{node['name'][:40]}-{{i}}"
    spec["name"] = name or f"{base}-x{copies}"
    if rename:
        _rename(spec, rename)
    return spec


def _rename(spec: dict, chars: int) -> None:
    """Every name of the spec (cluster, kinds, nodes) made `chars` characters long, still unique."""
    long = {k["name"]: (k["name"] + "-" * chars)[: chars - 2] + f"{i:02d}" for i, k in enumerate(spec["device_kinds"])}
    for k in spec["device_kinds"]:
        k["name"] = long[k["name"]]
    for i, node in enumerate(spec["nodes"]):
        node["name"] = (node["name"] + "-" * chars)[: chars - 2] + f"{i:02d}"
        node["devices"] = {long[k]: v for k, v in node["devices"].items()}
        for rule in node.get("links", []):
            rule["between"] = [long[k] for k in rule["between"]]
    for rule in spec.get("links", {}).get("intra_node", []):
        rule["between"] = [long[k] for k in rule["between"]]
    spec["name"] = (spec["name"] + "-" * chars)[:chars]


def devices_of(spec: dict) -> int:
    return sum(node.get("count", 1) * sum(node["devices"].values()) for node in spec["nodes"])


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants, from /proc (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/statm").read_text().split()
            total += int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def run_measured(argv: list[str], *, timeout_s: float, max_rss_bytes: float, log: Path) -> dict:
    """Run argv in its own session in the log's folder; its exit code, wall time, peak memory and how it ended."""
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    peak_tree, outcome, status, usage = 0, None, 0, None
    while usage is None:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            usage = ru
            break
        peak_tree = max(peak_tree, tree_rss_bytes(proc.pid))
        if outcome is None and time.monotonic() - start > timeout_s:
            outcome = f"timed out ({timeout_s:.0f} s)"
        elif outcome is None and peak_tree > max_rss_bytes:
            outcome = f"over memory cap ({max_rss_bytes / 2**30:.0f} GiB)"
        if outcome is not None:
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    return {
        "exit": proc.returncode,
        "outcome": outcome or ("ok" if proc.returncode == 0 else "refused" if proc.returncode == 2 else "failed"),
        "wall_s": wall,
        "max_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "tree_rss_mib": max(peak_tree, usage.ru_maxrss * 1024) / 2**20,
    }


def gpt3_sublayer_copies() -> int:
    """The most copies of gpt3-six-servers whose GPT-3 sublayer problem is inside both the pair
    limit and the transfer-table limit (devices and tensor-parallel groups, as `plan` offers them)."""
    graph = build_model_graph(ModelSpec(name="gpt3-175b", granularity="sublayer"))
    copies = 1
    while True:
        spec = scaled_cluster("gpt3-six-servers", copies + 1)
        devices = devices_of(spec)
        groups = sum(  # aligned groups of 2, 4, 8, ... of one kind in a server (llm_planner.core.tensor_groups)
            node["count"] * sum(n // 2**j for n in node["devices"].values() for j in range(1, n.bit_length()))
            for node in spec["nodes"]
        )
        placement = devices + groups
        if graph.num_tasks * devices > MAX_TASK_DEVICE_PAIRS or len(graph.edges) * placement**2 > MAX_TRANSFER_ENTRIES:
            return copies
        copies += 1


def cases() -> dict:
    """name -> (what, graph or model arguments builder, cluster spec builder, extra plan arguments)."""
    skip = 1  # edges into each task: the most that keep the graph within the edge limit
    while sum(MAX_TASKS - k for k in range(1, skip + 2)) <= MAX_EDGES:
        skip += 1
    gpus = MAX_DEVICES // 8
    return {
        "chain-max-tasks": (
            f"a chain of {MAX_TASKS:,} tasks (the task limit) on cpu-two-gpus",
            lambda: chain_graph(MAX_TASKS),
            lambda: scaled_cluster("cpu-two-gpus", 1),
            [],
        ),
        "chain-max-tasks-6-devices": (
            f"a chain of {MAX_TASKS:,} tasks on four-gpus (6 devices: {MAX_TASKS * 6:,} pairs)",
            lambda: chain_graph(MAX_TASKS),
            lambda: scaled_cluster("four-gpus", 1),
            [],
        ),
        "dag-max-edges": (
            f"{MAX_TASKS:,} tasks, each reading the {skip} before it (the edge limit) on cpu-two-gpus",
            lambda: chain_graph(MAX_TASKS, extra_back=skip - 1),
            lambda: scaled_cluster("cpu-two-gpus", 1),
            [],
        ),
        "gpt3-sublayer-max-pairs": (
            "GPT-3 175B, sublayer granularity, on the most copies of gpt3-six-servers inside the pair and "
            "transfer-table limits (tensor-parallel groups of 2, 4, 8 GPUs offered)",
            lambda: {"model": "gpt3-175b", "granularity": "sublayer"},
            lambda: scaled_cluster("gpt3-six-servers", gpt3_sublayer_copies()),
            [],
        ),
        "max-devices-latency": (
            f"a chain of {MAX_TASK_DEVICE_PAIRS // MAX_DEVICES} tasks, latency, on {MAX_DEVICES:,} devices",
            lambda: chain_graph(MAX_TASK_DEVICE_PAIRS // MAX_DEVICES),
            lambda: gpu_fleet(gpus),
            [],
        ),
        "long-names": (
            f"a chain of {MAX_TASKS:,} tasks named with {MAX_TASK_NAME_CHARS} characters on four-gpus with its "
            f"cluster, kinds and nodes named with {MAX_NAME_CHARS}",
            lambda: chain_graph(MAX_TASKS, name_chars=MAX_TASK_NAME_CHARS),
            lambda: scaled_cluster("four-gpus", 1, rename=MAX_NAME_CHARS),
            [],
        ),
        "max-devices-serving": (
            f"GPT-3 175B, --objective serving at 100 ms (prompt 512, output 128), on {MAX_DEVICES:,} devices "
            f"({gpus:,} servers of 8 A100s)",
            lambda: {"model": "gpt3-175b"},
            lambda: gpu_fleet(gpus),
            ["--objective", "serving", "--prompt-len", "512", "--output-len", "128", "--tpot-slo", "100 ms"],
        ),
    }


def gpu_fleet(servers: int) -> dict:
    """`servers` servers of 8 A100 80GB on NVLink (the device kind of four-gpus), InfiniBand between."""
    base = yaml.safe_load((SPECS / "four-gpus.yaml").read_text())
    a100 = next(k for k in base["device_kinds"] if k["name"] == "a100-80g")
    return {
        "name": f"a100-fleet-{servers}",
        "device_kinds": [a100],
        "nodes": [{"name": "a100-server", "count": servers, "hostname": "a100-{i}", "devices": {"a100-80g": 8}}],
        "links": {
            "intra_node_default": {"bw_bytes_per_s": "300 GB/s", "latency_s": "2 us"},
            "inter_node": {"bw_bytes_per_s": "25 GB/s", "latency_s": "5 us"},
        },
    }


def run_case(name: str, case: tuple, out: Path, args: argparse.Namespace) -> dict:
    what, graph_of, cluster_of, extra = case
    folder = out / "cases" / name
    folder.mkdir(parents=True, exist_ok=True)
    spec = cluster_of()
    (folder / "cluster.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    graph = graph_of()
    if "format" in graph:
        path = folder / "graph.json"
        path.write_text(json.dumps(graph))
        inputs, tasks, edges = ["--graph", "graph.json"], len(graph["tasks"]), len(graph["edges"])
    else:
        built = build_model_graph(ModelSpec(name=graph["model"], granularity=graph.get("granularity", "block")))
        inputs = [
            "--model",
            graph["model"],
            *(["--granularity", graph["granularity"]] if "granularity" in graph else []),
        ]
        tasks, edges = built.num_tasks, len(built.edges)
    plan = folder / "plan.yaml"
    plan.unlink(missing_ok=True)
    argv = [*CLI, "plan", *inputs, "--cluster", "cluster.yaml", *extra, "-o", "plan.yaml"]
    cap = args.max_rss_gib * 2**30
    print(f"{name}: {what}", flush=True)
    result = run_measured(argv, timeout_s=args.timeout, max_rss_bytes=cap, log=folder / "plan.log")
    row = {"case": name, "what": what, "tasks": tasks, "edges": edges, "devices": devices_of(spec), **result}
    row["plan_mib"] = plan.stat().st_size / 2**20 if plan.is_file() else None
    row["command"] = " ".join(["llm-planner", "plan", *inputs, "--cluster", "cluster.yaml", *extra, "-o", "plan.yaml"])
    if result["exit"] == 0 and args.verify:
        checked = run_measured(
            [*CLI, "verify", "plan.yaml"], timeout_s=args.timeout, max_rss_bytes=cap, log=folder / "verify.log"
        )
        row.update({f"verify_{k}": v for k, v in checked.items()})
    print(f"  {row['outcome']}: exit {row['exit']}, {row['wall_s']:.1f} s, {row['tree_rss_mib']:.0f} MiB", flush=True)
    return row


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key.endswith("_s"):
        return f"{value:.1f}"
    if key.endswith("_mib"):
        return f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def write_results(rows: list[dict], out: Path) -> None:
    keys = [*COLUMNS, "plan_mib", "verify_exit", "verify_wall_s", "verify_tree_rss_mib", "command"]
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    head = [
        "case",
        "size",
        "tasks",
        "edges",
        "devices",
        "plan: outcome (exit)",
        "wall s",
        "peak MiB (largest process)",
        "peak MiB (all processes)",
        "plan file MiB",
        "verify: exit, s, MiB",
    ]
    body = []
    for r in rows:
        verify = (
            f"{r['verify_exit']}, {r['verify_wall_s']:.1f}, {r['verify_tree_rss_mib']:,.0f}"
            if "verify_exit" in r
            else "-"
        )
        cells = [
            f"`{r['case']}`",
            r["what"],
            *(_cell(r, k) for k in ("tasks", "edges", "devices")),
            f"{r['outcome']} ({r['exit']})",
            *(_cell(r, k) for k in ("wall_s", "max_rss_mib", "tree_rss_mib", "plan_mib")),
            verify,
        ]
        body.append(cells)
    commands = [f"- `{r['case']}`: `{r['command']}`" for r in rows]
    (out / "table.md").write_text(
        provenance.markdown_table(head, body) + "\nCommands (in each case's folder):\n\n" + "\n".join(commands) + "\n"
    )


def main() -> int:
    all_cases = cases()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", choices=sorted(all_cases), default=list(all_cases))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per command (default 600)")
    ap.add_argument(
        "--max-rss-gib", type=float, default=12.0, help="kill a case whose processes pass this (default 12)"
    )
    ap.add_argument("--no-verify", dest="verify", action="store_false", help="do not verify the plans")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "limits"))
    args = ap.parse_args()
    facts = provenance.start(sys.argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases:
        rows.append(run_case(name, all_cases[name], out, args))
        write_results(rows, out)
    for name in args.cases:  # graphs and plans are tens of MB, rebuilt by the script; specs and logs stay
        for big in ("graph.json", "plan.yaml"):
            (out / "cases" / name / big).unlink(missing_ok=True)
    facts["load_after"] = provenance.load_average()
    provenance.record(out, facts)
    print(f"wrote {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
