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
from dataclasses import replace
from pathlib import Path

from llm_planner.core.atomic import make_directory, write_atomic
from llm_planner.core.plan import Plan, load_plan
from llm_planner.core.spec import load_cluster
from llm_planner.graph import rwnn
from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.launch.launch_types import LaunchError, LaunchOptions, LaunchResult, PlanRejected
from llm_planner.launch.mpiexec_run import hostfile_of, probe_port, run_mpiexec
from llm_planner.launch.ranks import rank_entries
from llm_planner.launch.workdir_lock import run_lock
from llm_planner.placement.verify_file import verify_plan_file
from llm_planner.runtime import decoder_tasks as dt
from llm_planner.runtime.plan_schedule import in_flight_batches
from llm_planner.runtime.table import RankTable, RunSpec

log = logging.getLogger(__name__)

DEFAULT_PROMPT_LEN = 8
RESNET_NAMES = ("resnet18", "resnet50")  # the CNN presets of llm_planner.graph.models
MEASURE_WARMUP = (
    2  # `launch --measure`: untimed runs first, as `profile` warms up before it times (its --warmup default)
)


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
        given = [
            flag
            for flag, value in (
                ("--checkpoint", options.checkpoint),
                ("--prompt-ids", options.prompt_ids),
                ("--max-new-tokens", options.max_new_tokens is not None),
            )
            if value
        ]
        if given:
            raise LaunchError(
                f"{', '.join(given)}: a decoder's; {source} plans {plan.inputs.model.get('name')!r}, whose ranks run "
                "seeded weights on seeded inputs"
            )
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
        dt.check_prompts(prompts, options.new_tokens, config)
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
    if options.max_new_tokens is not None and options.max_new_tokens < 1:
        raise LaunchError(f"--max-new-tokens must be >= 1, got {options.max_new_tokens}")
    if not options.timeout_s > 0:
        raise LaunchError(f"timeout must be > 0 seconds, got {options.timeout_s}")
    if options.warmup < 0:
        raise LaunchError(f"warmup must be >= 0 untimed runs, got {options.warmup}")
    probe_port(error=LaunchError)  # how hosts are probed when a run fails (llm_planner.launch.mpiexec_run)


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
        max_new_tokens=options.new_tokens,
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


# ----------------------------------------------------------------------------
# Running


def launch(plan_path: str | Path, options: LaunchOptions = LaunchOptions()) -> LaunchResult:
    """Check, write the hostfile and rank table, and (unless dry_run) run mpiexec until done or timeout."""
    table, _ = build_rank_table(plan_path, options)
    with run_lock(table.run.workdir, options.dry_run):
        return run_table(table, options)


def run_table(table: RankTable, options: LaunchOptions) -> LaunchResult:
    """Write the hostfile and the rank table into its workdir, and (unless dry_run) run mpiexec on them;
    a serving plan's launch (llm_planner.launch.serve_launch) starts its ranks here too."""
    workdir = make_directory(table.run.workdir, LaunchError)
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
        *workdir.glob("rank*.done"),
        Path(table.run.report_path),
    ]:
        stale.unlink(missing_ok=True)
    outcome = run_mpiexec(command, table, options.timeout_s, options.stall_timeout_s)
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
    max_new_tokens: int | None = None,
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
