"""Launch a plan with MPI: a hostfile, a rank table and one `mpiexec` command.

From a plan and its cluster spec: one rank per device the plan uses, ranks
grouped by host in cluster order; a hostfile of `hostname:ranks` lines; a rank
table (rank -> device, node, host, tasks; plus what to run) as JSON; then

    <venv>/bin/mpiexec -f hostfile -n R [extra...] <python> -m mpi4py -m llm_planner.runtime rank_table.json

with the `mpiexec` that sits next to this Python (the MPI of the `mpich`
wheel that mpi4py was built against; never whatever `mpirun` is first on
PATH). Everything that can be wrong is checked before mpiexec starts: the plan
as `verify` checks it (llm_planner.placement.verify_file.verify_plan_file: tensor-parallel groups,
memory, schedule, objective and bound, every figure re-derived), devices
missing from the cluster, nodes without a hostname, more ranks than a node has
slots, a rank count other than the number of devices, a plan that does not
match the model (or the checkpoint), prompts outside the vocabulary. The files
are documented in launch/README.md. This module does not import mpi4py (and
imports torch only to check graph models).
"""

from __future__ import annotations

import logging
import random
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llm_planner.core.atomic import write_atomic
from llm_planner.core.fmt import fmt_s
from llm_planner.core.names import check_host
from llm_planner.core.plan import Plan, load_plan
from llm_planner.core.spec import ClusterSpec, load_cluster
from llm_planner.core.tensor_groups import is_group_name, member_names
from llm_planner.graph import rwnn
from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.launch.mpiexec_run import hostfile_of, probe_port, run_mpiexec
from llm_planner.placement.verify_file import verify_plan_file
from llm_planner.runtime import decoder_tasks as dt
from llm_planner.runtime.plan_schedule import in_flight_batches
from llm_planner.runtime.table import RankEntry, RankTable, RunSpec

log = logging.getLogger(__name__)

DEFAULT_PROMPT_LEN = 8
RESNET_NAMES = ("resnet18", "resnet50")  # the CNN presets of llm_planner.graph.models
MEASURE_WARMUP = (
    2  # `launch --measure`: untimed runs first, as `profile` warms up before it times (its --warmup default)
)


class LaunchError(ValueError):
    """A plan that cannot be launched as asked; nothing was started."""

    exit_code = 2  # the CLI's exit status for bad input


class PlanRejected(LaunchError):
    """A plan that `verify` rejects (one line per violation); nothing was started."""

    exit_code = 1  # as `verify`'s exit status for an invalid plan


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    dry_run: bool = False  # write the files, build the command, start nothing
    checkpoint: str | None = (
        None  # decoder: Hugging Face checkpoint dir (safetensors) whose config the plan was made from
    )
    prompt_ids: tuple[tuple[int, ...], ...] = ()  # decoder: one prompt per request; empty: batch_size seeded prompts
    max_new_tokens: int = 16
    report_path: str | None = None  # default: <workdir>/run.json
    timeout_s: float = 600.0  # bound on the whole run
    workdir: str | None = None  # default: <report dir>/<plan stem>.launch with a report path, else launch/<plan stem>
    extra: tuple[str, ...] = ()  # extra mpiexec arguments, placed before the program
    num_ranks: int | None = None  # the rank count asked for; must equal the number of devices the plan uses
    seed: int | None = None  # seeded weights and CNN inputs; default: the plan's model seed
    dtype: str | None = None  # compute dtype; default: the plan's
    fail_rank: int | None = None  # fault injection for tests: this rank raises once the run starts
    warmup: int = 0  # untimed runs of the whole workload before the timed one


@dataclass(frozen=True, kw_only=True)
class LaunchResult:
    command: tuple[str, ...]
    rank_table: RankTable
    workdir: str
    hostfile_path: str
    rank_table_path: str
    report_path: str
    dry_run: bool
    returncode: int | None = None  # None for a dry run
    duration_s: float = 0.0
    report: dict[str, Any] | None = None
    error: str | None = None  # the failing rank's message (or mpiexec's) when the run failed
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.dry_run or (self.returncode == 0 and self.error is None)

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)

    @property
    def tokens(self) -> list[list[int]] | None:
        return None if self.report is None else self.report.get("tokens")


def mpiexec_path() -> Path:
    """The mpiexec of this Python's environment (the `mpich` wheel), never PATH's."""
    path = Path(sys.executable).parent / "mpiexec"
    if not path.exists():
        raise LaunchError(
            f"no mpiexec next to {sys.executable}; install the MPI extra (pip install mpich mpi4py) in this environment"
        )
    return path


# ----------------------------------------------------------------------------
# Checks and the rank table


def workload_of(plan: Plan, source: str) -> str:
    model = plan.inputs.model
    if "graph" in model:
        raise LaunchError(
            f"{source}: inputs.model: plans made from a graph file ({model['graph']}) describe no runnable model; "
            "launch needs a decoder config, a checkpoint directory, a ResNet or an RWNN preset"
        )

    name = str(model.get("name", ""))
    return "graph" if name in RESNET_NAMES or rwnn.is_rwnn_name(name) else "decoder"


def check_model(plan: Plan, workload: str, options: LaunchOptions, source: str) -> tuple[tuple[int, ...], ...]:
    """Raise LaunchError unless the plan's tasks are the model's; returns the prompts to run (decoders)."""
    if workload == "graph":
        names = {t.name for t in build_model_graph(ModelSpec.from_dict(dict(plan.inputs.model))).tasks}
        for s, assignment in enumerate(plan.shard_assignments):
            if set(assignment) != names:
                raise LaunchError(
                    f"{source}: shards[{s}]: the plan's tasks are not the model's "
                    f"(missing {sorted(names - set(assignment))[:5]}, unknown {sorted(set(assignment) - names)[:5]})"
                )
        return ()

    try:
        config = dt.planned_decoder_config(plan.inputs.model, options.checkpoint, source=source)
        for s, assignment in enumerate(plan.shard_assignments):
            dt.check_decoder_tasks(list(assignment), config.num_layers, source=f"{source}: shards[{s}]")
        prompts = _prompts(plan, options, config.vocab_size)
        dt.check_prompts(prompts, options.max_new_tokens, config)
    except dt.DecoderError as exc:
        raise LaunchError(str(exc)) from None
    return tuple(tuple(p) for p in prompts)


def _prompts(plan: Plan, options: LaunchOptions, vocab_size: int) -> tuple[tuple[int, ...], ...]:
    """One prompt per request of every batch in flight: the user's (Q of them, repeated for each batch,
    or one per request), else seeded ones."""
    batches, size = in_flight_batches(plan), plan.batch_size
    if not options.prompt_ids:
        rng = random.Random(options.seed if options.seed is not None else int(plan.inputs.model.get("seed", 0)))
        return tuple(tuple(rng.randrange(vocab_size) for _ in range(DEFAULT_PROMPT_LEN)) for _ in range(batches * size))
    given = tuple(tuple(p) for p in options.prompt_ids)
    if len(given) == size:
        return given * batches
    if len(given) == batches * size:
        return given
    runs = (
        f"{batches} batches of {size} in flight (a throughput plan's steady state)"
        if batches > 1
        else f"a batch of {size}"
    )
    raise LaunchError(
        f"prompt_ids: {len(given)} prompts, but the plan runs {runs}: give {size} prompts"
        + (f" (repeated for each batch) or {batches * size}" if batches > 1 else "")
    )


def _check_options(options: LaunchOptions) -> None:
    if options.max_new_tokens < 1:
        raise LaunchError(f"max_new_tokens must be >= 1, got {options.max_new_tokens}")
    if not options.timeout_s > 0:
        raise LaunchError(f"timeout must be > 0 seconds, got {options.timeout_s}")
    if options.warmup < 0:
        raise LaunchError(f"warmup must be >= 0 untimed runs, got {options.warmup}")
    probe_port(error=LaunchError)  # how hosts are probed when a run fails (llm_planner.launch.mpiexec_run)


def rank_entries(plan: Plan, cluster: ClusterSpec, source: str) -> tuple[RankEntry, ...]:
    """One rank per device the plan uses, grouped by host in cluster order."""
    used = plan.physical_devices_used()
    serves = {m: d for d in plan.devices_used() for m in member_names(d)}
    order = rank_order(used, cluster, source)
    entries = []
    for rank, name in enumerate(order):
        plan_device = serves[name]
        tasks = {
            str(s): [
                t.task
                for t in sorted(plan.schedule, key=lambda t: (t.start_s, t.finish_s))
                if t.shard == s and t.device == plan_device
            ]
            for s in range(len(plan.shard_sizes))
        }
        group = [order.index(m) for m in member_names(plan_device)] if is_group_name(plan_device) else []
        tasks = {k: v for k, v in tasks.items() if v}
        entries.append(rank_entry(rank, name, cluster, plan_device=plan_device, group=group, tasks=tasks))
    return tuple(entries)


def rank_entry(
    rank: int, name: str, cluster: ClusterSpec, *, plan_device: str, group: list[int], tasks: dict[str, list[str]]
) -> RankEntry:
    """The rank table's row of the rank on device `name` (its host, type and CUDA index from the cluster)."""
    d = cluster.device_map()[name]
    gpus = [x.name for x in cluster.devices() if x.node == d.node and cluster.kind(x.kind).type == "gpu"]
    return RankEntry(
        rank=rank,
        device=name,
        node=d.node,
        hostname=str(d.hostname),
        device_type=cluster.kind(d.kind).type,
        gpu_index=gpus.index(name) if name in gpus else None,
        tasks=tasks,
        plan_device=plan_device,
        group=group,
    )


def rank_order(used, cluster: ClusterSpec, source: str) -> list[str]:
    """The devices `used`, one rank each, grouped by host in cluster order; LaunchError naming the file and
    field for a device the cluster lacks, a node without a (valid) hostname, or more ranks than a node's slots."""
    devices = cluster.device_map()
    unknown = [d for d in used if d not in devices]
    if unknown:
        raise LaunchError(f"{source}: the plan uses device(s) {unknown} that cluster {cluster.source} does not have")
    templates = {n.name: (i, n) for i, n in enumerate(cluster.nodes)}
    for name in used:
        d = devices[name]
        i, _ = templates[d.node_template]
        if not d.hostname:
            raise LaunchError(
                f"{cluster.source}: nodes[{i}].hostname: missing for node {d.node!r}; "
                f"launch needs the hostname of every node the plan uses (device {name})"
            )
        check_host(d.hostname, f"{cluster.source}: nodes[{i}].hostname (node {d.node!r})", LaunchError)
    order = [d.name for d in cluster.devices() if d.name in used]
    hosts = list(dict.fromkeys(devices[d].hostname for d in order))
    order.sort(key=lambda d: hosts.index(devices[d].hostname))
    check_slots(order, devices, templates, cluster)
    return order


def check_slots(order: list[str], devices: dict, templates: dict, cluster: ClusterSpec) -> None:
    """LaunchError naming the node when the ranks `order` puts on it exceed its MPI slots."""
    per_node: dict[str, int] = {}
    for name in order:
        per_node[devices[name].node] = per_node.get(devices[name].node, 0) + 1
    for name in order:
        d = devices[name]
        i, node = templates[d.node_template]
        if node.slots is not None and per_node[d.node] > node.slots:
            raise LaunchError(
                f"{cluster.source}: nodes[{i}].slots: node {d.node!r} has {node.slots} MPI slots "
                f"but the plan puts {per_node[d.node]} ranks on it"
            )


def build_rank_table(plan_path: str | Path, options: LaunchOptions) -> tuple[RankTable, Plan]:
    """Every check, then the rank table; raises LaunchError (or the loaders' errors) naming the problem."""
    _check_options(options)
    source = str(plan_path)
    plan = load_plan(plan_path)
    if plan.inputs.cluster is None:
        raise LaunchError(
            f"{source}: inputs.cluster: the plan has no cluster file (it came from a workload file); "
            "nothing to launch on"
        )
    cluster = load_cluster(plan.inputs.cluster)
    if plan.inputs.cluster_sha256 and cluster.sha256 != plan.inputs.cluster_sha256:
        log.warning(
            "%s changed since the plan was made (sha256 differs); launching on its current hosts", plan.inputs.cluster
        )
    workload = workload_of(plan, source)
    prompts = check_model(plan, workload, options, source)
    check_verified(plan_path)
    entries = rank_entries(plan, cluster, source)
    if options.num_ranks is not None and options.num_ranks != len(entries):
        raise LaunchError(
            f"{source}: the plan uses {len(entries)} devices, "
            f"so it runs on {len(entries)} ranks, not {options.num_ranks}"
        )
    if options.fail_rank is not None and not 0 <= options.fail_rank < len(entries):
        raise LaunchError(f"fail_rank {options.fail_rank} is not a rank of this run (0..{len(entries) - 1})")
    workdir = default_workdir(plan_path, options)
    run = RunSpec(
        plan_path=str(Path(plan_path).resolve()),
        workload=workload,
        workdir=str(workdir.resolve()),
        report_path=str(
            Path(options.report_path).resolve() if options.report_path else (workdir / "run.json").resolve()
        ),
        timeout_s=float(options.timeout_s),
        checkpoint=str(Path(options.checkpoint).resolve()) if options.checkpoint else None,
        prompt_ids=[list(p) for p in prompts],
        max_new_tokens=options.max_new_tokens,
        batches=in_flight_batches(plan) if workload == "decoder" else 1,
        seed=options.seed if options.seed is not None else int(plan.inputs.model.get("seed", 0)),
        dtype=options.dtype,
        fail_rank=options.fail_rank,
        warmup=options.warmup,
    )
    return RankTable(ranks=entries, run=run), plan


def check_verified(plan_path: str | Path) -> None:
    """Launch runs only what `verify` accepts: PlanRejected (exit 1) with the verifier's violations, or the
    verifier's own bad-input error (exit 2, naming the file and field). Against the files as they are now:
    a cluster file edited since the plan was made (its hostnames, say) is used if the plan still checks
    against it, every figure re-derived."""
    try:
        report = verify_plan_file(plan_path, check_hashes=False)
    except ValueError as exc:  # the verifier's bad input (PlanError, InputError, ...): the file cannot be checked
        message = str(exc)
        raise LaunchError(message if str(plan_path) in message else f"{plan_path}: {message}") from None
    if not report.ok:
        lines = "".join(f"\n  - {v}" for v in report.violations)
        raise PlanRejected(
            f"{plan_path}: the verifier rejects this plan ({len(report.violations)} violation(s)); "
            f"nothing was started:{lines}"
        )


def default_workdir(plan_path: str | Path, options: LaunchOptions) -> Path:
    """The workdir asked for; else `<plan stem>.launch` next to the report; else launch/<plan stem>."""
    if options.workdir:
        return Path(options.workdir)
    if options.report_path:
        return Path(options.report_path).parent / f"{Path(plan_path).stem}.launch"
    return Path("launch") / Path(plan_path).stem


def hostfile_text(table: RankTable) -> str:
    """`hostname:slots` per host, in rank order (mpich's Hydra fills hosts in this order)."""
    return hostfile_of(
        ((r.hostname, f"{table.run.plan_path}: rank {r.rank} ({r.device})") for r in table.ranks), LaunchError
    )


def format_rank_table(table: RankTable) -> str:
    rows = [("rank", "host", "device", "torch", "tasks")]
    for r in table.ranks:
        torch_dev = f"cuda:{r.gpu_index}" if r.device_type == "gpu" else "cpu"
        tasks = (
            "; ".join(f"shard {s}: {_compact(t)}" for s, t in r.tasks.items())
            if len(r.tasks) > 1
            else _compact(next(iter(r.tasks.values()), []))
        )
        device = r.device if not r.group else f"{r.device} (group {r.plan_device})"
        rows.append((str(r.rank), r.hostname, device, torch_dev, tasks))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows)


def describe_result(result: LaunchResult) -> str:
    """What the CLI prints: the command and rank table (dry run), else the outcome of the run."""
    if result.dry_run:
        return f"{result.command_line}\n\n{format_rank_table(result.rank_table)}"
    if not result.ok:
        return f"launch failed: {result.error}"
    return "\n".join(_run_summary(result.report or {}, result))


def _run_summary(r: dict, result: LaunchResult) -> list[str]:
    n = result.rank_table.world_size
    lines = [f"ran {n} rank{'s' if n != 1 else ''} in {result.duration_s:.1f} s; report: {result.report_path}"]
    per = " per sample" if r.get("unit") == "s/sample" else ""
    predicted, measured = float(r.get("predicted_s", 0.0)), float(r.get("measured_s", 0.0))
    error = f" ({100 * (measured - predicted) / predicted:+.1f}%)" if predicted > 0 else ""
    lines.append(
        f"{r.get('measured_what', 'measured')}: measured {fmt_s(measured)}{per}, "
        f"predicted {fmt_s(predicted)}{per}{error}"
    )
    if r.get("measured_samples_per_s"):
        lines.append(
            f"steady state: {r['measured_samples_per_s']:.1f} samples/s = tokens/s in decode "
            f"(predicted {r.get('predicted_samples_per_s') or 0:.1f}), {r.get('batches', 1)} batches in flight"
        )
    if "tokens" in r:
        lines.append(
            f"whole generation: {fmt_s(r.get('wall_s', 0.0))}, "
            f"{r.get('tokens_per_s', 0.0):.1f} tokens/s (prefill included)"
        )
        if r.get("weights") != "checkpoint":
            lines.append(
                "weights: seeded random, not a checkpoint (pass --checkpoint DIR for real weights): "
                "the tokens are not text"
            )
        lines += [f"request {i}: {' '.join(map(str, t))}" for i, t in enumerate(r["tokens"])]
    elif "output" in r:
        lines.append(
            f"output {r['output']['shape']} sha256 {r['output']['sha256'][:16]}... saved to {r['output_path']}"
        )
    lines.append(f"runtime overhead {100 * r.get('overhead_fraction', 0.0):.1f}% of the ranks' time")
    for device in r.get("gpu_fell_back_to_cpu", []):
        lines.append(f"warning: {device} is a GPU but CUDA is not available on its host: its rank ran on the CPU")
    return lines + oversubscription_notes(r.get("ranks", []))


def oversubscription_notes(ranks: list[dict]) -> list[str]:
    """A warning for each host that ran more ranks than it has cores: its times are not the plan's devices' times."""
    notes = {}
    for r in ranks:
        if r.get("wait") == "sleep":
            host = r["device"].split("/")[0]
            notes[host] = (
                f"warning: node {host} ran {r['ranks_on_host']} ranks on {r['host_cores']} cores: ranks shared cores "
                f"and waiting ranks slept between polls, so measured times include waking them; "
                f"describe at most one single-thread CPU device per core to compare with the plan"
            )
    return list(notes.values())


def _compact(tasks: list[str]) -> str:
    return ", ".join(tasks) if len(tasks) <= 6 else f"{', '.join(tasks[:3])}, ... {tasks[-1]} ({len(tasks)} tasks)"


# ----------------------------------------------------------------------------
# Running


def launch(plan_path: str | Path, options: LaunchOptions = LaunchOptions()) -> LaunchResult:
    """Check, write the hostfile and rank table, and (unless dry_run) run mpiexec until done or timeout."""
    table, _ = build_rank_table(plan_path, options)
    return run_table(table, options)


def run_table(table: RankTable, options: LaunchOptions) -> LaunchResult:
    """Write the hostfile and the rank table into its workdir, and (unless dry_run) run mpiexec on them;
    a serving plan's launch (llm_planner.launch.serve_launch) starts its ranks here too."""
    workdir = Path(table.run.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    hostfile, table_path = workdir / "hostfile", workdir / "rank_table.json"
    write_atomic(hostfile, hostfile_text(table), LaunchError)
    table.save(table_path)
    command = (
        str(mpiexec_path()),
        "-f",
        str(hostfile),
        "-n",
        str(table.world_size),
        *options.extra,
        sys.executable,
        "-m",
        "mpi4py",
        "-m",
        "llm_planner.runtime",
        str(table_path),
    )
    write_atomic(workdir / "command.txt", shlex.join(command) + "\n", LaunchError)
    result = LaunchResult(
        command=command,
        rank_table=table,
        workdir=str(workdir),
        hostfile_path=str(hostfile),
        rank_table_path=str(table_path),
        report_path=table.run.report_path,
        dry_run=options.dry_run,
    )
    if options.dry_run:
        return result
    for stale in [
        *workdir.glob("error.rank*.txt"),
        *workdir.glob(".error.rank*.txt.tmp"),
        *workdir.glob("rank*.pid"),
        Path(table.run.report_path),
    ]:
        stale.unlink(missing_ok=True)
    outcome = run_mpiexec(command, table, options.timeout_s)
    return replace(
        result,
        returncode=outcome.returncode,
        duration_s=outcome.duration_s,
        report=outcome.report,
        error=outcome.error,
        stderr_tail=outcome.stderr_tail,
    )


def launch_plan(
    plan_path: str | Path,
    *,
    dry_run: bool = False,
    checkpoint: str | None = None,
    prompt_ids: list[list[int]] | None = None,
    max_new_tokens: int = 16,
    report_path: str | None = None,
    timeout_s: float = 600.0,
    workdir: str | None = None,
    extra: list[str] | tuple[str, ...] = (),
    num_ranks: int | None = None,
    seed: int | None = None,
    dtype: str | None = None,
    fail_rank: int | None = None,
    warmup: int = 0,
) -> LaunchResult:
    """The CLI's entry point: `llm-planner launch plan.yaml [--dry-run] [--checkpoint DIR] ...` (see LaunchOptions)."""
    options = LaunchOptions(
        dry_run=dry_run,
        checkpoint=checkpoint,
        prompt_ids=tuple(tuple(p) for p in (prompt_ids or ())),
        max_new_tokens=max_new_tokens,
        report_path=report_path,
        timeout_s=timeout_s,
        workdir=workdir,
        extra=tuple(extra),
        num_ranks=num_ranks,
        seed=seed,
        dtype=dtype,
        fail_rank=fail_rank,
        warmup=warmup,
    )
    return launch(plan_path, options)


def parse_prompt_ids(text: str) -> list[int]:
    """ "464,3290,318" -> [464, 3290, 318]; LaunchError on anything else (for the CLI's --prompt-ids)."""
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise LaunchError(f"--prompt-ids {text!r}: expected comma-separated token ids, e.g. 464,3290,318") from None
    if not ids:
        raise LaunchError(f"--prompt-ids {text!r}: no token ids")
    return ids
