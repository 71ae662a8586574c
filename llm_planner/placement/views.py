"""Human-facing views of plans and clusters: rich tables and a Gantt chart."""

from __future__ import annotations

from collections import defaultdict

from rich.table import Table

from llm_planner.core.atomic import write_figure
from llm_planner.core.fmt import fmt_bytes, fmt_s, fmt_time, has_file_units
from llm_planner.core.plan import Plan
from llm_planner.core.spec import ClusterSpec, DeviceKindSpec, DeviceSpec
from llm_planner.graph.models import list_models
from llm_planner.placement.milp.symmetry import symmetry_classes
from llm_planner.placement.problem import PlacementProblem
from llm_planner.placement.verify import verify_plan


def device_table(plan: Plan, problem: PlacementProblem) -> Table:
    """Per device or tensor-parallel group (a stage): its degree, its tasks in execution order
    (runs of consecutive tasks, so a stage that a task leaves and re-enters shows two runs), its
    tasks' time in one batch ("compute"); for a throughput plan its load per batch as the plan's
    throughput model counts it, the compute and the transfers it sends and receives (the plan's
    max_load_s is the largest); and the memory of one device (one member of a group) against its
    usable memory, in the steady state of a throughput plan (every batch in flight, verify)."""

    report = verify_plan(plan, problem)
    order = plan.device_order()
    topo = {name: pos for pos, name in enumerate(problem.graph.topological_order())}
    units, throughput = has_file_units(problem.graph), plan.objective == "throughput"
    table = Table(title="stages (devices and tensor-parallel groups)")
    columns = ("device", "degree", "tasks in order", "compute") + (("load per batch",) if throughput else ())
    for col in columns + ("memory per device", "of usable"):
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
            fmt_time(report.device_busy_s.get(device.name, 0.0), units),
            *((fmt_time(report.device_load_s.get(device.name, 0.0), units),) if throughput else ()),
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
    """`show-cluster`: device kinds, servers, links, and the classes of identical servers, in the
    words of someone deploying a model (what a planner does with them is in the captions)."""
    return [_kinds_table(cluster), _servers_table(cluster), _links_table(cluster), symmetry_table(cluster)]


def _kinds_table(cluster: ClusterSpec) -> Table:
    kinds = Table(title=f"{cluster.name}: device kinds")
    cols = ("kind", "type", "peak compute", "memory (usable)", "memory bandwidth", "efficiency reached")
    cols += ("fixed times", "figures from")
    for col in cols:
        kinds.add_column(col)
    for k in cluster.device_kinds:
        kinds.add_row(
            k.name,
            k.type,
            ", ".join(f"{d} {v / 1e12:.4g} TFLOP/s" for d, v in k.peak_flops),
            f"{fmt_bytes(k.mem_bytes)} ({fmt_bytes(k.usable_mem_bytes)})",
            f"{k.mem_bw_bytes_per_s / 1e9:.4g} GB/s",
            efficiencies(k),
            fixed_times(k),
            kind_source(k),
        )
    kinds.caption = (
        "usable: what a plan may fill (usable_mem_fraction); efficiency: the share of the peaks the costs assume "
        "(links: collective_efficiency, a type's default when neither the spec nor a catalog entry gives one), and "
        "the factors on weight-only kernels' compute (dequant_factor) and on an fp8 KV cache's read time "
        "(kv_dequant_factor) where the spec sets them; "
        "fixed times: per task (a decoder layer in serving), per serving iteration of a stage, per sequence in a "
        "serving iteration, per collective call, and where they are set per decoder layer whose linear layers "
        "compute in 8 bits (w8a8_overhead_s) and decode attention's least per key of a sequence (decode_key_s); "
        "figures from: the spec, or the GPU catalog entry it names and the "
        "engine factor set it takes over the entry's (its own fields win)"
    )
    return kinds


def efficiencies(kind: DeviceKindSpec) -> str:
    """The shares of the peaks the costs assume, and the dequantizing factors that are not 1."""
    text = (
        f"{kind.compute_efficiency:.0%} of compute, {kind.mem_efficiency:.0%} of bandwidth, "
        f"{kind.collective_bw_efficiency:.0%} of links in collectives"
    )
    if kind.dequant_factor != 1.0:
        text += f"; weight-only compute x{kind.dequant_factor:g}"
    if kind.kv_dequant_factor != 1.0:
        text += f"; fp8 KV cache read time x{kind.kv_dequant_factor:g}"
    return text


def fixed_times(kind: DeviceKindSpec) -> str:
    """The kind's fixed times as the costs charge them (defaults included): per task, per serving
    step, per sequence in a serving step, per collective call; per W8A8 decoder layer and decode
    attention's least per key of a sequence where set."""

    def t(seconds: float) -> str:
        return fmt_s(seconds) if seconds > 0 else "0 s"

    text = (
        f"{t(kind.overhead_s)} a task, {t(kind.serving_step_s)} a step, "
        f"{t(kind.serving_sequence_s)} a sequence, {t(kind.collective_call_s)} a collective"
    )
    text += f", {t(kind.w8a8_overhead_s)} a W8A8 layer" if kind.w8a8_overhead_s else ""
    return text + (f", at least {t(kind.decode_key_s)} a key of a decoding sequence" if kind.decode_key_s else "")


def kind_source(kind: DeviceKindSpec) -> str:
    """Where a kind's figures come from: the spec, or the catalog entry it names, and which
    efficiencies the loader filled with the type's default (DEFAULT_EFFICIENCY)."""
    source = f"catalog {kind.catalog}" if kind.catalog else "the spec"
    if kind.engine:
        source += f", {kind.engine}'s factors"
    if not kind.defaulted:
        return source
    values = {"compute_efficiency": kind.compute_efficiency, "mem_efficiency": kind.mem_efficiency}
    if set(kind.defaulted) == set(values):
        what = f"efficiencies: default {kind.compute_efficiency:g}/{kind.mem_efficiency:g}"
    else:
        what = ", ".join(f"{key}: default {values[key]:g}" for key in kind.defaulted)
    return f"{source}; {what} (no catalog entry, none given)"


def _servers_table(cluster: ClusterSpec) -> Table:
    """One row per server: its template, hostname, and its devices by kind (names as plans write them)."""
    servers = Table(title="servers")
    regions = bool(cluster.regions())
    for col in (
        "server",
        "template",
        *(("region",) if regions else ()),
        "hostname",
        "devices (as plans name them: server/kind:index)",
    ):
        servers.add_column(col)
    by_node: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    first: dict[str, DeviceSpec] = {}
    for d in cluster.devices():
        by_node[d.node][d.kind].append(d.index)
        first.setdefault(d.node, d)
    for node, kinds in by_node.items():
        d = first[node]
        devs = ", ".join(f"{len(ix)} {kind} ({_span(kind, ix)})" for kind, ix in kinds.items())
        where = (cluster.region_of(d.node_template),) if regions else ()
        servers.add_row(node, d.node_template, *where, d.hostname or "-", devs)
    return servers


def _span(kind: str, indices: list[int]) -> str:
    """The kind's devices by name: h100-80g:0 .. h100-80g:7, or the one name."""
    return f"{kind}:{indices[0]}" + (f" .. {kind}:{indices[-1]}" if len(indices) > 1 else "")


def _links_table(cluster: ClusterSpec) -> Table:
    links = Table(title="links")
    for col in ("between", "bandwidth", "latency"):
        links.add_column(col)

    def row(where: str, link) -> None:
        links.add_row(where, f"{link.bw_bytes_per_s / 1e9:.4g} GB/s", fmt_s(link.latency_s))

    if cluster.intra_node_default:
        row("two devices in one server (unless a row below says otherwise)", cluster.intra_node_default)
    for node in cluster.nodes:
        for r in node.links:
            row(f"{_pair(*r.between)} in one {node.name}", r)
    for r in cluster.intra_node:
        row(f"{_pair(*r.between)} in one server", r)
    for r in cluster.between_regions:
        a, b = r.between
        row(f"a server in {a} and one in {b}" if a != b else f"two servers in {a}", r)
    if cluster.inter_node:
        rest = " (where no row above names their regions)" if cluster.between_regions else " (the network)"
        row("two servers" + rest, cluster.inter_node)
    return links


def _pair(a: str, b: str) -> str:
    return f"two {a}" if a == b else f"{a} and {b}"


def symmetry_table(cluster: ClusterSpec) -> Table:
    """The classes of identical servers and, inside each server, of identical devices: what both
    planners treat as interchangeable."""

    classes = symmetry_classes(cluster)
    devices = cluster.devices()
    table = Table(title="classes of identical servers")
    for col in ("template", "servers", "count", "identical devices in each server"):
        table.add_column(col)
    for node in cluster.nodes:
        names = sorted({d.node for d in devices if d.node_template == node.name})
        alike = ", ".join(f"{n} {kind}" for kind, n in node.devices if n > 1) or "-"
        shown = ", ".join(names) if len(names) <= 3 else f"{names[0]} .. {names[-1]}"
        table.add_row(node.name, shown, str(node.count), alike)
    table.caption = (
        "Swapping two servers of one template, or two devices of one kind inside one server, changes no "
        "time and no memory: a plan and its swapped copy are the same plan. The serving planner counts "
        "the devices of each (template, kind) a replica takes instead of naming them; the placement "
        "planner (--objective latency|throughput) has its solver skip swapped copies (--symmetry: "
        f"batch, task or time add {classes.num_rows} constraints here; docs/symmetry.md)."
    )
    return table
