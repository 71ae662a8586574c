"""One rank's life: read the rank table, check the world, run the workload, report.

Started by the launcher as `python -m mpi4py -m llm_planner.runtime TABLE.json`
(one process per device of the plan). Failure handling:

- the world size must equal the rank table's; otherwise every rank refuses
  before building anything;
- a rank that raises writes `error.rank<N>.txt` (its message and traceback)
  into the run's workdir, then the exception leaves the program and
  `python -m mpi4py` calls MPI_Abort, which stops every rank of the job: nobody
  waits forever on a message from a dead rank;
- a watchdog thread aborts the job when the run exceeds `run.timeout_s`;
- a rank whose parent (mpiexec's proxy on its host) dies, even killed outright, ends
  (llm_planner.core.procs.die_with_parent, armed in __main__): no rank outlives its job.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_planner.core.constants import TORCH_DTYPES
from llm_planner.core.plan import Plan, load_plan
from llm_planner.runtime.table import RankEntry, RankTable, load_rank_table

if TYPE_CHECKING:  # torch and the MPI wrapper load after the world size is checked
    import torch

    from llm_planner.runtime.comm import Comm, GroupComm
    from llm_planner.runtime.run_report import RankStats

log = logging.getLogger("llm_planner.runtime")

TIMEOUT_EXIT = 124


class RankCountError(RuntimeError):
    """mpiexec started a different number of ranks than the rank table has."""


class InjectedFailure(RuntimeError):
    """The failure a rank raises on purpose when the run asks for it (run.fail_rank)."""


@dataclass
class RankContext:
    table: RankTable
    entry: RankEntry
    plan: Plan | None  # the placement plan; None for a serving plan (its replicas are in table.run.serving)
    comm: Comm
    device: torch.device
    dtype: torch.dtype
    stats: RankStats
    group: GroupComm | None = None  # this rank's tensor-parallel group, if it is a member of one

    @property
    def rank(self) -> int:
        return self.comm.rank

    def warm_up(self, one_pass: Callable[[], Any]) -> None:
        """Run the workload `run.warmup` times untimed, before the timed run.

        The first run in a process pays one-time costs (oneDNN kernel set-up,
        first-touch allocations, lazy imports, MPI connection set-up) that a
        plan's per-task costs, profiled after warm-up runs, do not contain.
        Every rank runs the same number of passes; a barrier closes each one,
        so no message of one pass is taken for one of the next. What the
        passes record (task times, transfers, step ends) is dropped.
        """
        from llm_planner.runtime.comm import CommStats
        from llm_planner.runtime.run_report import RankStats

        for _ in range(self.table.run.warmup):
            stats, comm_stats = self.stats, self.comm.stats
            group_stats = self.group.stats if self.group is not None else None
            self.stats = RankStats(rank=stats.rank, device=stats.device, torch_device=stats.torch_device)
            self.comm.stats = CommStats()
            try:
                one_pass()
                self.comm.wait_sends()
            finally:
                self.stats, self.comm.stats = stats, comm_stats
                if self.group is not None:
                    self.group.stats = group_stats
            self.comm.barrier()
        if self.table.run.warmup:
            self.stats.extra["warmup_runs"] = self.table.run.warmup

    def start(self) -> None:
        """Mark the start of the measured run (after every rank built its share)."""
        self.comm.barrier()
        self.stats.start()
        if self.table.run.fail_rank == self.rank:
            raise InjectedFailure(
                f"rank {self.rank} ({self.entry.device}) fails on purpose (run.fail_rank = {self.rank})"
            )


def torch_device(entry: RankEntry) -> "torch.device":
    """cuda:N for a GPU device when CUDA is there, else the CPU (with one warning)."""
    import torch

    if entry.device_type == "gpu":
        if torch.cuda.is_available() and entry.gpu_index is not None and entry.gpu_index < torch.cuda.device_count():
            return torch.device(f"cuda:{entry.gpu_index}")
        log.warning(
            "rank %d: device %s is a GPU but CUDA is not available here; running on the CPU", entry.rank, entry.device
        )
    return torch.device("cpu")


def torch_dtype(name: str) -> "torch.dtype":
    import torch

    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype {name!r}: the runtime runs {', '.join(TORCH_DTYPES)}")
    return getattr(torch, TORCH_DTYPES[name])


def error_path(workdir: str | Path, rank: int) -> Path:
    return Path(workdir) / f"error.rank{rank}.txt"


def _write_error(table: RankTable | None, rank: int, exc: BaseException) -> None:
    if table is None:
        return
    device = table.ranks[rank].device if rank < table.world_size else "?"
    text = f"rank {rank} ({device}): {type(exc).__name__}: {exc}\n\n" + "".join(traceback.format_exception(exc))
    path = error_path(table.run.workdir, rank)
    partial = path.with_name(f".{path.name}.tmp")
    try:
        # written aside and renamed: another rank's MPI_Abort may kill this one mid-write (both
        # watchdogs fire at once), and the launcher must never read a half-written, empty file
        partial.write_text(text)
        os.replace(partial, path)
    except OSError:
        log.exception("rank %d: cannot write its error file", rank)


def pid_path(workdir: str | Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.pid"


def done_path(workdir: str | Path, rank: int) -> Path:
    return Path(workdir) / f"rank{rank}.done"


def _write_done(table: RankTable, rank: int) -> None:
    """`rank<N>.done` in the workdir as the rank ends its run cleanly: the launcher then knows its end for no
    death (llm_planner.launch.death_order), whatever mpiexec's clean-up does after."""
    try:
        done_path(table.run.workdir, rank).write_text("")
    except OSError:
        log.exception("rank %d: cannot write its done file", rank)


def _write_pid(table: RankTable, rank: int) -> None:
    """`rank<N>.pid` (pid, host) in the workdir: the launcher names a rank that dies from it, and stops it on Ctrl-C."""

    try:
        pid_path(table.run.workdir, rank).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    except OSError:
        log.exception("rank %d: cannot write its pid file", rank)


def _start_watchdog(table: RankTable, world: Any) -> threading.Timer:
    """Abort the whole job (every rank) once the run has taken `run.timeout_s`."""

    def fire() -> None:
        rank = world.Get_rank()
        message = f"rank {rank}: the run exceeded its timeout of {table.run.timeout_s:g} s; aborting every rank"
        log.error(message)
        _write_error(table, rank, TimeoutError(message))
        world.Abort(TIMEOUT_EXIT)

    timer = threading.Timer(table.run.timeout_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def _context(table: RankTable, comm: "Comm") -> RankContext:
    import torch

    from llm_planner.runtime.run_report import RankStats

    entry = table.ranks[comm.rank]
    plan = load_plan(table.run.plan_path) if table.run.workload != "serving" else None
    device = torch_device(entry)
    if device.type == "cuda":  # the rank's own GPU is the current one: streams, graphs and kernels default to it
        torch.cuda.set_device(device)
    dtype = torch_dtype(table.run.dtype or (plan.inputs.dtype if plan is not None else "fp32"))
    stats = RankStats(rank=comm.rank, device=entry.device, torch_device=str(device))
    stats.extra["dtype"] = str(dtype).replace("torch.", "")
    stats.extra["plan_device"] = entry.plan_device or entry.device
    if entry.device_type == "gpu" and device.type == "cpu":
        stats.extra["gpu_fell_back_to_cpu"] = True
    group = comm.group(tuple(entry.group) or None)  # collective: every rank calls it
    return RankContext(
        table=table, entry=entry, plan=plan, comm=comm, device=device, dtype=dtype, stats=stats, group=group
    )


def ranks_on_host(table: RankTable, hostname: str) -> int:
    """How many ranks of the run share the host `hostname` (they share its cores)."""
    return sum(1 for r in table.ranks if r.hostname == hostname)


def check_world_size(table: RankTable, size: int) -> None:
    if size != table.world_size:
        raise RankCountError(
            f"the rank table has {table.world_size} ranks (one per device the plan uses) but mpiexec started {size}; "
            f"start it with -n {table.world_size}"
        )


def run(table: RankTable) -> None:
    import torch

    from llm_planner.runtime.comm import Comm, spins_while_waiting, usable_cores
    from llm_planner.runtime.run_report import build_report, write_report

    comm = Comm()
    sharing, cores = ranks_on_host(table, table.ranks[comm.rank].hostname), usable_cores()
    comm.spin = spins_while_waiting(sharing, cores)
    ctx = _context(table, comm)
    ctx.stats.extra.update(wait="spin" if comm.spin else "sleep", ranks_on_host=sharing, host_cores=cores)
    if table.run.workload == "serving":
        from llm_planner.runtime.serve_run import run_serving

        with torch.no_grad():
            run_serving(ctx)
        return
    if table.run.workload == "decoder":
        from llm_planner.runtime.gpt_run import run_decoder as run_workload
    else:
        from llm_planner.runtime.graph_run import run_graph as run_workload
    with torch.no_grad():
        outputs = run_workload(ctx)
    comm.wait_sends()
    ctx.stats.stop()
    if ctx.group is not None:
        ctx.stats.extra["collectives"] = ctx.group.collectives()
    ranks = comm.gather(ctx.stats.to_dict(comm.stats))
    outputs_all = comm.gather(outputs)
    if comm.rank == 0:
        assert ranks is not None and outputs_all is not None
        merged = _merge_outputs(outputs_all)
        assert ctx.plan is not None
        write_report(
            table.run.report_path, build_report(plan=ctx.plan, ranks=ranks, workload=table.run.workload, outputs=merged)
        )
        log.info("rank 0: wrote %s", table.run.report_path)
    comm.barrier()


def _merge_outputs(parts: list[dict]) -> dict:
    merged: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key].update(value)
            else:
                merged.setdefault(key, value)
    if "tokens_by_request" in merged:
        by_request = merged.pop("tokens_by_request")
        merged["tokens"] = [by_request[i] for i in sorted(by_request)]
    return merged


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: mpiexec -n R python -m mpi4py -m llm_planner.runtime RANK_TABLE.json", file=sys.stderr)
        return 2
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    logging.basicConfig(
        level=logging.INFO, format=f"[rank {world.Get_rank()}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    table = None
    try:
        table = load_rank_table(args[0])
        _write_pid(table, world.Get_rank())
        check_world_size(table, world.Get_size())  # before torch loads: a wrong -n fails in a moment
        watchdog = _start_watchdog(table, world)
        run(table)
        watchdog.cancel()
        _write_done(table, world.Get_rank())
    except BaseException as exc:
        _write_error(table, world.Get_rank(), exc)
        raise  # python -m mpi4py turns this into MPI_Abort: every rank stops
    return 0
