"""Human-facing views of plans and clusters: rich tables and a Gantt chart."""

from __future__ import annotations

from collections import defaultdict

from rich.table import Table

from llm_planner.core.atomic import write_figure
from llm_planner.core.fmt import fmt_bytes, fmt_s, fmt_time, has_file_units
from llm_planner.core.plan import Plan
from llm_planner.core.spec import ClusterSpec
from llm_planner.graph.models import list_models
from llm_planner.placement.milp.symmetry import symmetry_classes
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.verify import verify_plan


def device_table(plan: Plan, problem: PlacementProblem) -> Table:
    """Per device or tensor-parallel group (a stage): its degree, its tasks in execution order
    (runs of consecutive tasks, so a stage that a task leaves and re-enters shows two runs), busy
    time, and the memory of one device (one member of a group) against its usable memory, in the
    steady state of a throughput plan (every batch in flight, verify)."""

    report = verify_plan(plan, problem)
    order = plan.device_order()
    topo = {name: pos for pos, name in enumerate(problem.graph.topological_order())}
    table = Table(title="stages (devices and tensor-parallel groups)")
    for col in ("device", "degree", "tasks in order", "busy", "memory per device", "of usable"):
        table.add_column(col, justify="left" if col in ("device", "tasks in order") else "right")
    for _k, device in enumerate(problem.devices):
        if device.name not in order:
            continue
        used = report.memory_per_device_bytes.get(device.name, 0.0)
        usable = problem.cluster.kind(device.kind).usable_mem_bytes
        share = f"{used / usable:.1%}" if usable not in (0, float("inf")) else "-"
        tasks = task_runs([t for s, t in order[device.name] if s == order[device.name][0][0]], topo)
        shards = len({s for s, _ in order[device.name]})
        table.add_row(
            device.name,
            str(device.degree),
            tasks + (f" (x{shards} shards)" if shards > 1 else ""),
            fmt_time(report.device_busy_s.get(device.name, 0.0), has_file_units(problem.graph)),
            fmt_bytes(used),
            f"{share} of {fmt_bytes(usable)}",
        )
    used_physical = set(plan.physical_devices_used())
    idle = [d.name for d in problem.devices[: problem.num_physical] if d.name not in used_physical]
    if idle:
        table.caption = f"{len(idle)} device(s) unused"
    return table


def steady_state_text(plan: Plan, file_units: bool = False) -> str | None:
    """A throughput plan's steady state: its batches in flight (the launcher runs that many; the
    memory below holds each one's per-sample memory) and, for a decoder's decode step, the time
    each generated token takes (a batch's token goes through every stage once: one makespan)."""
    if plan.objective != "throughput":
        return None
    text = (
        f"steady state: {plan.batches_in_flight} batch(es) of {plan.batch_size} in flight (one batch's makespan "
        f"{fmt_time(plan.makespan_s, file_units)} over the busiest device's load per batch "
        f"{fmt_time(plan.max_load_s, file_units)}, "
        "rounded up); the memory below holds all of them"
    )
    if is_decode_plan(plan):
        text += f"; per-token latency {fmt_s(plan.makespan_s)} (each token of a batch takes one makespan)"
    return text


def is_decode_plan(plan: Plan) -> bool:
    """Whether the plan is of a decoder's decode step (a preset or config of the decoder family)."""

    model = plan.inputs.model
    if "graph" in model or model.get("phase") != "decode":
        return False
    family = {name: fam for name, fam, _ in list_models()}
    return family.get(str(model.get("name", "")), "decoder") == "decoder"  # a config file is a decoder's


def task_runs(tasks: list[str], topo: dict[str, int]) -> str:
    """Tasks in execution order as runs of topologically consecutive ones: "embed .. block.3, block.9"."""
    runs: list[list[str]] = []
    for t in tasks:
        if runs and topo[t] == topo[runs[-1][-1]] + 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]} .. {r[-1]}" for r in runs)


def write_gantt(plan: Plan, path: str) -> None:
    """One row per device, one bar per (task, shard), coloured by shard, as a PNG (WriteError naming `path`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = plan.devices_used()
    row = {d: i for i, d in enumerate(devices)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * len(devices)))
    cmap = plt.get_cmap("tab10")
    for item in plan.schedule:
        width = item.finish_s - item.start_s
        ax.barh(
            row[item.device], width, left=item.start_s, color=cmap(item.shard % 10), edgecolor="black", linewidth=0.3
        )
        if len(plan.schedule) <= 60 and width > 0:
            ax.text(item.start_s + width / 2, row[item.device], item.task, ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(devices)), devices, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(f"{plan.solver.name}: {plan.objective} {plan.objective_s:.4g} s (colour = batch shard)")
    fig.tight_layout()
    try:
        write_figure(fig, path)
    finally:
        plt.close(fig)


def cluster_tables(cluster: ClusterSpec) -> list[Table]:
    """Device kinds, expanded devices per node, and links."""
    kinds = Table(title=f"{cluster.name}: device kinds")
    for col in ("kind", "type", "peak FLOP/s", "memory", "memory bw", "efficiency (compute/mem)"):
        kinds.add_column(col)
    for k in cluster.device_kinds:
        flops = ", ".join(f"{d} {v / 1e12:.4g} T" for d, v in k.peak_flops)
        kinds.add_row(
            k.name,
            k.type,
            flops,
            fmt_bytes(k.mem_bytes),
            f"{k.mem_bw_bytes_per_s / 1e9:.4g} GB/s",
            f"{k.compute_efficiency}/{k.mem_efficiency}",
        )
    nodes = Table(title="nodes")
    for col in ("node", "template", "hostname", "devices"):
        nodes.add_column(col)
    by_node: dict[str, list[str]] = defaultdict(list)
    host: dict[str, str] = {}
    template: dict[str, str] = {}
    for d in cluster.devices():
        by_node[d.node].append(d.name.split("/", 1)[1])
        host[d.node] = d.hostname or "-"
        template[d.node] = d.node_template
    for node, devs in by_node.items():
        nodes.add_row(node, template[node], host[node], ", ".join(devs))
    links = Table(title="links")
    for col in ("between", "bandwidth", "latency"):
        links.add_column(col)
    if cluster.intra_node_default:
        links.add_row(
            "same node (default)",
            f"{cluster.intra_node_default.bw_bytes_per_s / 1e9:.4g} GB/s",
            fmt_s(cluster.intra_node_default.latency_s),
        )
    for node in cluster.nodes:
        for r in node.links:
            links.add_row(
                f"{node.name}: {r.between[0]} <-> {r.between[1]}",
                f"{r.bw_bytes_per_s / 1e9:.4g} GB/s",
                fmt_s(r.latency_s),
            )
    for r in cluster.intra_node:
        links.add_row(f"{r.between[0]} <-> {r.between[1]}", f"{r.bw_bytes_per_s / 1e9:.4g} GB/s", fmt_s(r.latency_s))
    if cluster.inter_node:
        links.add_row(
            "between nodes", f"{cluster.inter_node.bw_bytes_per_s / 1e9:.4g} GB/s", fmt_s(cluster.inter_node.latency_s)
        )
    return [kinds, nodes, links, symmetry_table(cluster)]


def symmetry_table(cluster: ClusterSpec) -> Table:
    """The interchangeable devices and servers that --symmetry orders."""

    classes = symmetry_classes(cluster)
    names = [d.name for d in cluster.devices()]
    table = Table(title="symmetry classes (interchangeable hardware)")
    for col in ("class", "members", "count"):
        table.add_column(col)
    for members in classes.servers:
        servers = sorted({names[devs[0]].split("/")[0] for devs in members})
        table.add_row("servers", ", ".join(servers), str(len(members)))
    for members in classes.devices:
        first, last = names[members[0]], names[members[-1]]
        table.add_row("devices", f"{first} .. {last.split('/')[-1]}", str(len(members)))
    table.caption = (
        f"{classes.num_rows} ordering rows for batch, task or time; "
        f"first: one row per item (shard x task) and consecutive pair"
    )
    return table
