"""The workers that solve MILP-SPLIT's subproblems: serially, in a process pool, or in an
MPI pool when the planner runs under mpirun with several ranks (mpi4py imported lazily).
Each worker receives the problem once, when it starts.

The workers stop when the planner stops: an interrupted batch (Ctrl-C, SIGTERM, SIGHUP; any
exception) terminates them instead of waiting for their running subproblems (`Pool.close`,
`stop_executor`), and a worker whose planner was killed (SIGKILL) ends by itself
(llm_planner.core.procs.die_with_parent: the kernel's parent-death signal, or a liveness check).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures import process as futures_process

from llm_planner.core.procs import default_stop_signals, die_with_parent
from llm_planner.placement.options import SolveOptions
from llm_planner.placement.problem import PlacementProblem

log = logging.getLogger(__name__)


def make_executor(options: SolveOptions, num_jobs: int, problem: PlacementProblem) -> Executor | None:
    """A process pool (or an MPI pool when started under mpirun with several ranks) whose
    workers receive `problem` once, when they start; None = serial."""
    workers = options.workers or os.cpu_count() or 1
    if num_jobs < 2 or workers < 2:
        return None
    if int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
        try:
            from mpi4py.futures import MPIPoolExecutor  # lazily: only for planning across cluster nodes

            return MPIPoolExecutor(initializer=_init_worker, initargs=(problem,))
        except ImportError:
            log.warning("running under MPI but mpi4py is missing: solving subproblems on this node only")
    # the kernel's parent-death signal fires when the thread that started the worker ends: only the main thread
    # surely outlives the pool (a worker started from another thread watches its parent by polling)
    kernel_watch = threading.current_thread() is threading.main_thread()
    return ProcessPoolExecutor(
        max_workers=min(workers, num_jobs),
        initializer=_init_worker,
        initargs=(problem, os.getpid(), kernel_watch),
    )


STOP_GRACE_S = 2.0  # a terminated worker has this long to exit before it is killed
MANAGER_JOIN_S = 15.0  # the pool's manager thread has this long to notice (seconds on a loaded machine)


def stop_executor(executor: Executor) -> None:
    """Stop a pool at once: queued jobs cancelled, the workers terminated (killed if they linger)."""
    processes = list((getattr(executor, "_processes", None) or {}).values())  # a ProcessPoolExecutor's workers
    # read before shutdown, which drops the executor's reference to its manager thread
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.join(STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(STOP_GRACE_S)
    # The pool's manager thread sees its workers gone and closes its wake-up pipe; joined here, so that
    # concurrent.futures' exit hook never writes to that pipe while it closes ("Bad file descriptor")
    if manager is not None:
        manager.join(MANAGER_JOIN_S)
        # still closing on a loaded machine: the exit hook must not wake it (its write may meet the
        # pipe the thread is closing); the interpreter still joins the thread, which sees its workers gone
        getattr(futures_process, "_threads_wakeups", {}).pop(manager, None)


class Pool:
    """One pool of workers for all the batches of jobs of one problem (a MILP-SPLIT run asks for
    a dozen batches; starting a pool for each cost more than the jobs on small graphs). Started at
    the first batch of at least two jobs, with options.workers processes; `close` ends it."""

    def __init__(self, problem: PlacementProblem, options: SolveOptions):
        self.problem, self.options = problem, options
        self._executor: Executor | None = None

    def executor(self, num_jobs: int) -> Executor | None:
        if self._executor is None and num_jobs >= 2:
            self._executor = make_executor(self.options, sys.maxsize, self.problem)  # sized by options.workers alone
        return self._executor if num_jobs >= 2 else None

    def close(self, abort: bool = False) -> None:
        """End the workers: after their jobs, or at once (`abort`: the run was interrupted or failed)."""
        if self._executor is not None:
            if abort:
                stop_executor(self._executor)
            else:
                self._executor.shutdown()
            self._executor = None


_worker_problem: PlacementProblem | None = None  # in a pool worker: the problem its jobs belong to


def _init_worker(problem: PlacementProblem, parent_pid: int | None = None, kernel_watch: bool = True) -> None:
    """A pool worker's start: it keeps the problem, exits when the planner does, and leaves SIGTERM to its
    default (the planner terminates it) and SIGHUP to the planner (a closed terminal stops the planner, which
    stops its workers)."""
    global _worker_problem
    _worker_problem = problem
    if parent_pid is not None:
        default_stop_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        # forked or spawned by the planner; under the forkserver method, by the server, which ends with the planner
        parent = parent_pid if os.getppid() == parent_pid else os.getppid()
        die_with_parent(parent, kernel=kernel_watch)


def _call(fn, args: tuple, kwargs: dict):
    assert _worker_problem is not None, "pool worker started without its problem"
    return fn(_worker_problem, *args, **kwargs)


def run_many(
    problem: PlacementProblem, calls: dict[tuple, tuple], options: SolveOptions, pool: Pool | None = None
) -> dict:
    """Run every call (key -> (fn, args, kwargs), fn(problem, *args, **kwargs)) serially or in
    `pool` (which must be `problem`'s), else in a pool of `make_executor` for these calls only;
    results by key. Calls for one-task modules run here."""
    heavy = [key for key, (_, args, _) in calls.items() if len(args[0].tasks) > 1]
    if pool is not None:
        assert pool.problem is problem, "a pool's workers hold another problem"
        executor = pool.executor(len(heavy))
    else:
        executor = make_executor(options, len(heavy), problem)
    if executor is None:
        return {key: fn(problem, *args, **kwargs) for key, (fn, args, kwargs) in calls.items()}
    out: dict[tuple, object] = {}
    try:
        futures = {key: executor.submit(_call, *calls[key]) for key in heavy}
        for key, (fn, args, kwargs) in calls.items():
            if key not in futures:
                out[key] = fn(problem, *args, **kwargs)
        for key, fut in futures.items():
            out[key] = fut.result()
    except BaseException:
        if pool is None:
            stop_executor(executor)
        raise
    if pool is None:
        executor.shutdown()
    return out
