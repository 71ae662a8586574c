"""A whole profile run: the local devices, or one MPI rank per device of the cluster.

- `profile_local`: the first device of each kind on this machine's node (found
  by hostname, or named) is timed with llm_planner.runtime.profile_rank; GPUs
  are skipped when CUDA is missing (a CPU measurement would be a lie about them).
- `run_mpi`: under `mpiexec`, rank r is device r of the cluster, grouped by host
  in cluster order as `launch` numbers ranks. Ranks on one host take turns at
  timing their devices (so they do not share its cores), then one pair of
  ranks per link class runs the ping-pong; rank 0 gathers everything, merges
  devices of one kind (median of their medians) and writes the profile file.
- `spawn_mpi`: runs `run_mpi` with this environment's mpiexec:

    mpiexec -f hostfile -n R python -m mpi4py -m llm_planner.launch.profile_run profile_job.json
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llm_planner.core.atomic import make_directory
from llm_planner.core.procs import stop_signals_deferred
from llm_planner.core.spec import ClusterSpec, DeviceSpec, load_cluster
from llm_planner.cost import profile as prof
from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.launch.mpiexec_run import hostfile_of, start_mpiexec, stop_group
from llm_planner.launch.plan_launch import mpiexec_path
from llm_planner.runtime.profile_links import collective_groups, link_pairs, ping_pong, time_all_reduce
from llm_planner.runtime.profile_rank import (
    ProfileOptions,
    ProfileRunError,
    Progress,
    group_degrees_of,
    local_devices,
    profile_device,
    rank_devices,
    time_group,
    torch_device_of,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ProfileJob:
    """What to profile and where to write it: the JSON file the MPI ranks read."""

    cluster_path: str
    model: dict[str, Any]  # ModelSpec fields
    output_path: str
    options: ProfileOptions = field(default_factory=ProfileOptions)
    node: str | None = None  # local runs: the cluster node this machine is (default: found by hostname)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ProfileJob:
        data = json.loads(Path(path).read_text())
        options = data.pop("options", {})
        for key in ("batch_sizes", "link_sizes_bytes"):
            if key in options:
                options[key] = tuple(options[key])
        return cls(options=ProfileOptions(**options), **data)


def _environment(torch_devices: dict[str, str]) -> dict[str, Any]:
    import torch

    return {"torch": str(torch.__version__), "torch_devices": torch_devices, "threads": torch.get_num_threads()}


def build_profile(
    job: ProfileJob,
    cluster: ClusterSpec,
    measured: list[tuple[DeviceSpec, dict[str, prof.TaskTiming]]],
    links: dict[str, prof.LinkTiming],
    environment: dict[str, Any],
) -> prof.Profile:
    """One profile from the devices' timings; devices of one kind are merged (median of their medians)."""
    by_kind: dict[str, dict[str, list[prof.TaskTiming]]] = {}
    devices: dict[str, list[str]] = {}
    for device, timings in measured:
        devices.setdefault(device.kind, []).append(device.name)
        for key, timing in timings.items():
            by_kind.setdefault(device.kind, {}).setdefault(key, []).append(timing)
    tasks = {
        kind: {key: prof.merge_task_timings(ts) for key, ts in entries.items()} for kind, entries in by_kind.items()
    }
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(job.options).items()}
    return prof.Profile(
        cluster=cluster.name,
        model=dict(job.model),
        settings=settings,
        devices=devices,
        tasks=tasks,
        links=links,
        environment=environment,
    )


def planned_runs(job: ProfileJob) -> int:
    """Timed and warm-up runs `profile_local` makes (for a progress bar)."""
    cluster = load_cluster(job.cluster_path)
    return (
        sum(1 + len(group_degrees_of(cluster, d)) for d in local_devices(cluster, job.node))
        * job.options.runs_per_device()
    )


def profile_local(job: ProfileJob, progress: Progress = lambda what, n: None) -> tuple[prof.Profile, list[str]]:
    """Profile the first device of each kind on this machine's node; returns the profile and the devices skipped."""
    cluster = load_cluster(job.cluster_path)
    spec = ModelSpec.from_dict(dict(job.model))
    graph = build_model_graph(spec)
    measured, skipped, torch_devices = [], [], {}
    for device in local_devices(cluster, job.node):
        torch_device = torch_device_of(cluster, device)
        if torch_device is None:
            log.warning(
                "device %s is a %s but CUDA is not available here: not profiled",
                device.name,
                cluster.kind(device.kind).type,
            )
            skipped.append(device.name)
            progress(f"{device.name} (skipped)", job.options.runs_per_device())
            continue
        torch_devices[device.name] = str(torch_device)
        measured.append(
            (
                device,
                profile_device(spec, graph, torch_device, job.options, progress, group_degrees_of(cluster, device)),
            )
        )
    if not measured:
        raise ProfileRunError(
            f"no device of cluster {cluster.name!r} can be profiled on this machine (skipped: {', '.join(skipped)})"
        )
    return build_profile(job, cluster, measured, {}, _environment(torch_devices)), skipped


def quiet_barrier(comm) -> None:
    """A barrier whose waiting ranks sleep between polls: MPI's own spins, and would steal the cores of the rank
    being timed."""
    from llm_planner.runtime.comm import _poll_then_sleep

    _poll_then_sleep(comm.world.Ibarrier().Test)


def _profile_rank(comm, job: ProfileJob, cluster: ClusterSpec, order: list[DeviceSpec]):
    """This rank's device timings (ranks of one host take turns) and its link measurements."""
    me = order[comm.rank]
    spec = ModelSpec.from_dict(dict(job.model))
    graph = build_model_graph(spec)
    device = torch_device_of(cluster, me)
    same_host = [r for r, d in enumerate(order) if d.hostname == me.hostname]
    turns = max(sum(1 for d in order if d.hostname == h) for h in {d.hostname for d in order})
    timings = None
    for turn in range(turns):
        quiet_barrier(comm)
        if same_host.index(comm.rank) == turn and device is not None:
            log.info("rank %d: timing %s on %s", comm.rank, me.name, device)
            timings = profile_device(
                spec, graph, device, job.options, lambda what, n: None, group_degrees_of(cluster, me)
            )
    if device is None:
        log.warning("rank %d: device %s is a GPU but CUDA is not available here: not profiled", comm.rank, me.name)
    links = {}
    for name, a, b in link_pairs(cluster, order):
        quiet_barrier(comm)
        if comm.rank in (a, b):
            medians = ping_pong(
                comm,
                b if comm.rank == a else a,
                comm.rank == a,
                job.options.link_sizes_bytes,
                job.options.link_repetitions,
            )
            if comm.rank == a:
                links[name] = prof.link_timing(
                    (order[a].name, order[b].name),
                    list(job.options.link_sizes_bytes),
                    medians,
                    job.options.link_repetitions,
                )
    links.update(_collectives(comm, job, cluster, order, graph))
    if timings is not None:
        timings.update(_groups(comm, job, cluster, order, graph, device))
    return timings, links, (str(device) if device is not None else None)


@contextlib.contextmanager
def _waiting_as_the_runtime(comm, order: list[DeviceSpec]):
    """Ranks wait as launched ranks do (spin when their host has a core for each rank, else sleep between polls)
    for collective timings; quietly (sleeping) again afterwards."""
    from llm_planner.runtime.comm import spins_while_waiting, usable_cores

    sharing = sum(1 for d in order if d.hostname == order[comm.rank].hostname)
    comm.spin = spins_while_waiting(sharing, usable_cores())
    try:
        yield
    finally:
        comm.spin = False


def _groups(
    comm, job: ProfileJob, cluster: ClusterSpec, order: list[DeviceSpec], graph, device
) -> dict[str, prof.TaskTiming]:
    """Decoders in block granularity: the first group of each degree of each class times the group's tasks
    as the group runs them (profile_rank.time_group); the other ranks wait."""
    meta = graph.meta_dict()
    if "decoder_config" not in meta or meta.get("granularity") != "block":
        return {}
    out: dict[str, prof.TaskTiming] = {}
    spec = ModelSpec.from_dict(dict(job.model))
    with _waiting_as_the_runtime(comm, order):
        for _, ranks in collective_groups(cluster, order):
            quiet_barrier(comm)
            if not all(t.shards_over(len(ranks)) for t in graph.tasks):
                continue
            group = comm.group(ranks if comm.rank in ranks and device is not None else None)
            if group is not None and group.size == len(
                ranks
            ):  # (a member without its device leaves a smaller group: skipped)
                timings = time_group(spec, graph, device, job.options, group)
                if comm.rank == ranks[0]:
                    out.update(timings)
    return out


def _collectives(
    comm, job: ProfileJob, cluster: ClusterSpec, order: list[DeviceSpec], graph
) -> dict[str, prof.LinkTiming]:
    """All-reduce times of the first group of each degree of each class (the runtime's GroupComm, waiting as the
    runtime does), at the sizes the model's all-reduces have at the profiled batch sizes (and 8x the largest)."""
    per_call = [t.tp_allreduce_bytes_per_sample / t.tp_allreduces for t in graph.tasks if t.tp_allreduces]
    if not per_call:
        return {}
    batches = sorted(set(job.options.batch_sizes))
    sizes = tuple(int(max(per_call) * b) for b in [*batches, 8 * batches[-1]])
    out = {}
    with _waiting_as_the_runtime(comm, order):
        for key, ranks in collective_groups(cluster, order):
            quiet_barrier(comm)
            group = comm.group(ranks if comm.rank in ranks else None)
            if group is None:
                continue
            medians = time_all_reduce(group, sizes, job.options.link_repetitions)
            if comm.rank == ranks[0]:
                out[key] = prof.link_timing(
                    tuple(order[r].name for r in ranks), list(sizes), medians, job.options.link_repetitions
                )
    return out


def run_mpi(job: ProfileJob, comm=None) -> prof.Profile | None:
    """Every rank profiles its own device; rank 0 gathers, writes job.output_path and returns the profile."""
    from llm_planner.runtime.comm import Comm

    comm = comm or Comm()
    cluster = load_cluster(job.cluster_path)
    order = rank_devices(cluster)
    if comm.size != len(order):
        raise ProfileRunError(
            f"{job.cluster_path}: the cluster has {len(order)} devices, one rank each, "
            f"but mpiexec started {comm.size}; start it with -n {len(order)}"
        )
    timings, links, torch_device = _profile_rank(comm, job, cluster, order)
    gathered = comm.gather((comm.rank, timings, links, torch_device))
    result = None
    if comm.rank == 0:
        assert gathered is not None
        measured = [(order[r], t) for r, t, _, _ in gathered if t is not None]
        if not measured:
            raise ProfileRunError(f"no rank could profile its device (cluster {cluster.name!r})")
        all_links = {name: link for _, _, ls, _ in gathered for name, link in ls.items()}
        devices = {order[r].name: d for r, _, _, d in gathered if d is not None}
        result = build_profile(job, cluster, measured, all_links, _environment(devices))
        prof.save_profile(result, job.output_path)
    quiet_barrier(comm)
    return result


def spawn_mpi(job: ProfileJob, workdir: str | Path, timeout_s: float) -> prof.Profile:
    """Run `run_mpi` under this environment's mpiexec, one rank per device of the cluster; returns the profile
    written."""

    cluster = load_cluster(job.cluster_path)
    order = rank_devices(cluster)
    missing = sorted({d.node for d in order if not d.hostname})
    if missing:
        raise ProfileRunError(
            f"{cluster.source}: nodes {missing} have no hostname; profiling under MPI needs the host of every node"
        )
    workdir = make_directory(workdir, ProfileRunError)
    hosts = ((str(d.hostname), f"{cluster.source}: node {d.node!r} (device {d.name})") for d in order)
    (workdir / "hostfile").write_text(hostfile_of(hosts, ProfileRunError))
    job.save(workdir / "profile_job.json")
    command = [
        str(mpiexec_path()),
        "-f",
        str(workdir / "hostfile"),
        "-n",
        str(len(order)),
        sys.executable,
        "-m",
        "mpi4py",
        "-m",
        "llm_planner.launch.profile_run",
        str(workdir / "profile_job.json"),
    ]
    Path(job.output_path).unlink(missing_ok=True)
    with open(workdir / "mpiexec.out", "wb") as out, open(workdir / "mpiexec.err", "wb") as err:
        proc = start_mpiexec(command, out, err)  # the plan launcher's: its own session, dies with us
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)  # mpiexec and every rank it started here, not mpiexec alone
            raise ProfileRunError(f"profiling on {len(order)} ranks exceeded its timeout of {timeout_s:g} s") from None
        except KeyboardInterrupt:
            with stop_signals_deferred():  # a second signal must not leave the ranks running
                stop_group(proc)
            raise
    stderr = (workdir / "mpiexec.err").read_text(errors="replace")
    if returncode != 0 or not Path(job.output_path).is_file():
        raise ProfileRunError(
            f"profiling on {len(order)} ranks failed (mpiexec status {returncode}):\n{stderr[-3000:]}"
        )
    return prof.load_profile(job.output_path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: mpiexec -n R python -m mpi4py -m llm_planner.launch.profile_run JOB.json", file=sys.stderr)
        return 2
    from mpi4py import MPI

    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {MPI.COMM_WORLD.Get_rank()}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    run_mpi(ProfileJob.load(args[0]))  # an exception leaves the program: python -m mpi4py aborts every rank
    return 0


if __name__ == "__main__":
    sys.exit(main())
