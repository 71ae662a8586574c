"""Profiling a device: time a model's distinct tasks the way the runtime runs them.

What one device does (locally, or as one MPI rank under `mpiexec`):

- decoders: build a `DecoderShard` (llm_planner.runtime.gpt) holding embed, the
  first `max_blocks` blocks, final_norm and lm_head, and run them as ONE stage
  through the run's own stage call and stream state (llm_planner.runtime.gpt_run:
  `new_state`, `run_step`), whose `on_task` callback gives each task's time
  (Python call overhead included, CUDA synchronised). A "decode" step with a
  context of L tokens is the run's first decode step after a prompt of L - 1
  random tokens: the prompt's prefill runs untimed through the same call (so the
  KV cache holds what the run's prefill leaves: a tensor-parallel member's heads,
  grown by its own code), then the step's new token attends to L keys, timed;
  "prefill" times the prefill of a prompt of L tokens on an empty cache. The
  block time is the mean over the blocks of a step (the first block of a stage
  also builds the causal mask, as in the runtime). With sublayer graphs, a
  forward pre-hook on the norm before the MLP splits each block into attn and mlp.
  A tensor-parallel group's tasks ("@group<k>") are timed with the same code on
  the group's real collectives, every member at once (`time_group`).
- fx graphs (ResNet, RWNN): trace the model as the runtime does, make one stage
  of every node (llm_planner.runtime.graph) and run it with the runtime's
  `TimedInterpreter`, which times each node. Inputs and outputs are not run by
  the runtime: they cost 0.

For each batch size: `warmup` untimed runs, then `repetitions` timed ones; the
median per task is kept and `llm_planner.cost.profile` fits fixed_s + per_sample_s * b.
CPU devices run torch with `threads` threads (MPI ranks run with one).

Under MPI, every rank profiles its own device (ranks on one host take turns,
so they do not share its cores), then ping-pong between one pair of ranks per
link class, with the runtime's own transfer calls (llm_planner.runtime.comm),
measures the one-way time of messages of several sizes; rank 0 gathers it all
and writes the profile (llm_planner.launch.profile_run runs the whole job).
"""

from __future__ import annotations

import logging
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from llm_planner.core.spec import ClusterSpec, DeviceSpec
from llm_planner.core.tensor_groups import group_degrees
from llm_planner.cost import profile as prof
from llm_planner.cost.measured import TaskTiming, group_key, task_key
from llm_planner.graph.ir import TaskGraph
from llm_planner.graph.models import ModelSpec
from llm_planner.runtime.rank import torch_dtype

log = logging.getLogger(__name__)

Progress = Callable[[str, int], None]  # (what is being timed, runs done since the last call)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


class ProfileRunError(ValueError):
    """A profile run that cannot be done as asked (no local device, bad option, unsupported model)."""


# What a profile run may be asked for (docs/inputs.md): past these a run allocates past any memory
# (a batch of 10^11 samples), cannot start its threads (100,000) or runs for days (10^12 repetitions).
MOST_BATCH = 4096
MOST_RUNS = 1000
MOST_THREADS = 256


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    batch_sizes: tuple[int, ...] = (1, 2, 4)  # sub-batch sizes to time (at least two distinct)
    repetitions: int = 5  # timed runs per batch size (the median is kept)
    warmup: int = 2  # untimed runs per batch size before them
    threads: int | None = 1  # torch threads on CPU devices (runtime ranks use 1); None: torch's default
    max_blocks: int = 12  # decoders: blocks built and timed (all blocks share one key)
    seed: int = 0  # weights and inputs
    link_sizes_bytes: tuple[int, ...] = (1024, 65536, 1048576, 4194304)  # ping-pong message sizes
    link_repetitions: int = 20  # round trips per message size

    def check(self) -> ProfileOptions:
        if len(set(self.batch_sizes)) < 2 or not 1 <= min(self.batch_sizes) <= max(self.batch_sizes) <= MOST_BATCH:
            raise ProfileRunError(
                f"batch sizes: give at least two distinct sizes from 1 to {MOST_BATCH:,}, got {list(self.batch_sizes)}"
            )
        for name in ("repetitions", "link_repetitions", "max_blocks"):
            if not 1 <= getattr(self, name) <= MOST_RUNS:
                raise ProfileRunError(f"{name} must be from 1 to {MOST_RUNS:,}, got {getattr(self, name)}")
        if not 0 <= self.warmup <= MOST_RUNS:
            raise ProfileRunError(f"warmup must be from 0 to {MOST_RUNS:,}, got {self.warmup}")
        if self.threads is not None and not 1 <= self.threads <= MOST_THREADS:
            raise ProfileRunError(f"threads must be from 1 to {MOST_THREADS}, got {self.threads}")
        if len(set(self.link_sizes_bytes)) < 2 or min(self.link_sizes_bytes) < 1:
            raise ProfileRunError(
                f"link sizes: give at least two distinct sizes >= 1 byte, got {list(self.link_sizes_bytes)}"
            )
        return self

    def runs_per_device(self) -> int:
        return len(self.batch_sizes) * (self.warmup + self.repetitions)


# ----------------------------------------------------------------------------
# Which devices, and their torch device


def host_names() -> set[str]:
    name = socket.gethostname()
    return {*LOCAL_HOSTS, name, name.split(".")[0], socket.getfqdn()}


def local_devices(cluster: ClusterSpec, node: str | None = None) -> list[DeviceSpec]:
    """The first device of each kind on this machine's node (or on `node`)."""
    devices = cluster.devices()
    nodes = [n for n in dict.fromkeys(d.node for d in devices)]
    if node is not None:
        if node not in nodes:
            raise ProfileRunError(f"{cluster.source}: no node named {node!r} (nodes: {', '.join(nodes)})")
        mine = node
    else:
        here = host_names()
        local = [n for n in nodes if next(d.hostname for d in devices if d.node == n) in here]
        if not local:
            hosts = sorted({str(d.hostname) for d in devices})
            raise ProfileRunError(
                f"{cluster.source}: no node of cluster {cluster.name!r} runs on this host ({socket.gethostname()}; "
                f"nodes' hostnames: {', '.join(hosts)}); name one with --node, or profile under mpirun"
            )
        mine = local[0]
    first: dict[str, DeviceSpec] = {}
    for d in devices:
        if d.node == mine:
            first.setdefault(d.kind, d)
    return list(first.values())


def rank_devices(cluster: ClusterSpec) -> list[DeviceSpec]:
    """Every device of the cluster, one per rank, grouped by host in cluster order (as `launch` orders ranks)."""
    devices = list(cluster.devices())
    hosts = list(dict.fromkeys(str(d.hostname) for d in devices))
    return sorted(devices, key=lambda d: hosts.index(str(d.hostname)))


def torch_device_of(cluster: ClusterSpec, device: DeviceSpec):
    """cuda:N for a GPU (N: its position among its node's GPUs, as `launch` numbers them), the CPU for a CPU;
    None for a GPU when CUDA is not there (it cannot be profiled here)."""
    import torch

    kind = cluster.kind(device.kind)
    if kind.type == "cpu":
        return torch.device("cpu")
    gpus = [d.name for d in cluster.devices() if d.node == device.node and cluster.kind(d.kind).type == "gpu"]
    index = gpus.index(device.name) if device.name in gpus else 0
    if kind.type == "gpu" and torch.cuda.is_available() and index < torch.cuda.device_count():
        return torch.device(f"cuda:{index}")
    return None


# ----------------------------------------------------------------------------
# Timing one device


def _medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decoder_step(bench: dict, batch: int, tensors: dict) -> dict[str, float]:
    """One timed stage call of every built task, as the run makes it (gpt_run.run_step on a gpt_run.new_state
    stream; a decode step after the prompt's untimed prefill); returns seconds per role."""
    from llm_planner.runtime import gpt_run

    shard, tasks = bench["shard"], bench["tasks"]
    state = gpt_run.new_state(shard, tensors["prompts"], list(range(batch)))
    value, step = state.prompt_ids, 0
    if bench["phase"] == "decode":  # the prefill leaves the cache (and the token) of the run's first decode step
        value, step = gpt_run.run_step(shard, tasks, value, state, 0), 1
    marks: list[float] = []
    bench["marks"] = marks
    times: dict[str, list[float]] = {}

    def on_task(name: str, seconds: float) -> None:
        role = "block" if name.startswith("block.") else name
        times.setdefault(role, []).append(seconds)
        if role == "block" and bench["sublayers"]:
            end = time.perf_counter()
            split = marks.pop(0)
            times.setdefault("attn", []).append(split - (end - seconds))
            times.setdefault("mlp", []).append(end - split)

    gpt_run.run_step(shard, tasks, value, state, step, on_task=on_task)
    return {role: sum(v) / len(v) for role, v in times.items()}


def _decoder_bench(
    spec: ModelSpec, graph: TaskGraph, device, dtype, options: ProfileOptions, degree: int = 1, group=None
) -> dict:
    """The shard to time: the whole tasks, or (degree k > 1) a member's share on a group of k: with the group's
    collectives (`group`, a GroupComm: every member runs this at once), or alone (none: collectives left out)."""
    from llm_planner.runtime import gpt, tp_layers

    meta = graph.meta_dict()
    if meta.get("phase") == "decode" and int(meta["seq_len"]) < 2:
        raise ProfileRunError(
            f"model {spec.name!r}: profiling a decode step needs a context (--seq-len) of at least 2 tokens"
        )
    try:
        config = gpt.prepare_config(gpt.load_hf_config(spec.to_dict()))
        source = gpt.weight_source(config, checkpoint=None, seed=options.seed)
    except gpt.DecoderError as exc:
        raise ProfileRunError(f"model {spec.name!r} cannot be profiled: {exc}") from None
    blocks = min(gpt.num_layers_of(config), options.max_blocks)
    tasks = ["embed", *(f"block.{i}" for i in range(blocks)), "final_norm", "lm_head"]
    if group is None and degree > 1:
        group = tp_layers.Unconnected(degree)
    shard = gpt.DecoderShard(config, set(tasks), device=device, dtype=dtype, source=source, group=group)
    bench = {
        "shard": shard,
        "tasks": tasks,
        "phase": meta["phase"],
        "seq_len": int(meta["seq_len"]),
        "sublayers": meta.get("granularity") == "sublayer",
        "marks": [],
    }
    if bench["sublayers"] and degree > 1:
        raise ProfileRunError(f"model {spec.name!r}: tensor-parallel shares are timed for block granularity only")
    if bench["sublayers"]:
        norm = "ln_2" if shard.family == "gpt2" else "post_attention_layernorm"

        def mark(module, args) -> None:
            _sync(device)
            bench["marks"].append(time.perf_counter())

        for i in range(blocks):
            getattr(shard.modules[shard.names.block.format(i=i)], norm).register_forward_pre_hook(mark)
    return bench


def _decoder_inputs(bench: dict, batch: int, generator) -> dict:
    """`batch` prompts of random token ids: L - 1 tokens before a decode step with a context of L, L for a
    prefill of L."""
    import torch

    context = bench["seq_len"] - (1 if bench["phase"] == "decode" else 0)
    vocab = int(bench["shard"].config.vocab_size)
    return {"prompts": torch.randint(vocab, (batch, context), generator=generator).tolist()}


def time_decoder(
    spec: ModelSpec,
    graph: TaskGraph,
    device,
    dtype,
    options: ProfileOptions,
    progress: Progress,
    degree: int = 1,
    group=None,
) -> dict[str, dict[int, float]]:
    """Role -> batch size -> median seconds, with the runtime's decoder stage code (a group member's share for
    degree > 1)."""
    import torch

    bench = _decoder_bench(spec, graph, device, dtype, options, degree, group)
    generator = torch.Generator().manual_seed(options.seed)
    out: dict[str, dict[int, float]] = {}
    for batch in options.batch_sizes:
        tensors = _decoder_inputs(bench, batch, generator)
        samples: dict[str, list[float]] = {}
        for rep in range(options.warmup + options.repetitions):
            with torch.no_grad():
                step = _decoder_step(bench, batch, tensors)
            if rep >= options.warmup:
                for role, seconds in step.items():
                    samples.setdefault(role, []).append(seconds)
            progress(f"{spec.name} batch {batch}", 1)
        for role, median in _medians(samples).items():
            out.setdefault(role, {})[batch] = median
    return out


def time_graph(
    spec: ModelSpec, device, dtype, options: ProfileOptions, progress: Progress
) -> dict[str, dict[int, float]]:
    """fx node -> batch size -> median seconds, with the runtime's stage module and TimedInterpreter."""
    import torch

    from llm_planner.runtime import graph as rg

    gm, example = rg.build_graph_model(spec.to_dict())
    compute = {n.name: 0 for n in gm.graph.nodes if n.op not in ("get_attr", "placeholder", "output")}
    split = rg.split_graph(gm, compute)
    assert len(split.stages) == 1, "one owner gives one stage"
    stage = split.stages[0]
    module = rg.stage_module(gm, stage).to(device=device, dtype=dtype).eval()
    out: dict[str, dict[int, float]] = {}
    for batch in options.batch_sizes:
        inputs = rg.make_batch(example, batch, options.seed).to(device=device, dtype=dtype)
        samples: dict[str, list[float]] = {}
        for rep in range(options.warmup + options.repetitions):
            times: dict[str, float] = {}
            with torch.no_grad():
                rg.TimedInterpreter(module, times, sync_cuda=device.type == "cuda").run(*(inputs for _ in stage.inputs))
            if rep >= options.warmup:
                for name, seconds in times.items():
                    samples.setdefault(name, []).append(seconds)
            progress(f"{spec.name} batch {batch}", 1)
        for name, median in _medians(samples).items():
            out.setdefault(name, {})[batch] = median
    return out


def group_degrees_of(cluster: ClusterSpec, device: DeviceSpec) -> list[int]:
    """The degrees of the tensor-parallel groups that `device`'s class of identical devices can form
    (llm_planner.core.tensor_groups)."""

    if not cluster.kind(device.kind).forms_tensor_groups:
        return []
    count = sum(1 for d in cluster.devices() if d.node == device.node and d.kind == device.kind)
    return group_degrees(count, count)


def profile_device(
    spec: ModelSpec,
    graph: TaskGraph,
    device,
    options: ProfileOptions,
    progress: Progress,
    degrees: list[int] | tuple[int, ...] = (),
) -> dict[str, TaskTiming]:
    """Task key -> timing of every distinct task of `graph` on the torch `device`; for decoders in block
    granularity also one member's share on a group of each degree in `degrees` that the model splits over."""
    import torch

    if device.type == "cpu" and options.threads is not None:
        torch.set_num_threads(options.threads)
    dtype = torch_dtype(spec.dtype)
    decoder = "decoder_config" in graph.meta_dict()
    measured = (
        time_decoder(spec, graph, device, dtype, options, progress)
        if decoder
        else time_graph(spec, device, dtype, options, progress)
    )
    timings = _timings(graph, measured, options, decoder, 1)
    if decoder and graph.meta_dict().get("granularity") == "block":
        for k in degrees:
            if all(t.shards_over(k) for t in graph.tasks):
                timings.update(
                    _timings(graph, time_decoder(spec, graph, device, dtype, options, progress, k), options, True, k)
                )
    return timings


def time_group(spec: ModelSpec, graph: TaskGraph, device, options: ProfileOptions, group) -> dict[str, TaskTiming]:
    """A group's tasks as the group runs them: every member times its share at once, collectives included
    (keys "<key>@group<k>"; what the first member measured, which waited for the others in each collective)."""

    measured = time_decoder(
        spec, graph, device, torch_dtype(spec.dtype), options, lambda what, n: None, group.size, group
    )
    return _timings(graph, measured, options, True, group.size, joint=True)


def _timings(
    graph: TaskGraph,
    measured: dict[str, dict[int, float]],
    options: ProfileOptions,
    decoder: bool,
    degree: int,
    joint: bool = False,
) -> dict[str, TaskTiming]:
    sizes = list(options.batch_sizes)
    timings: dict[str, TaskTiming] = {}
    for task in graph.tasks:
        key = group_key(task_key(graph, task), degree, joint)
        if key is None or key in timings:
            continue
        name = task.label("role", task.kind) if decoder else task.name
        if name in measured:
            medians = [measured[name][b] for b in sizes]
        elif not decoder and task.kind in ("input", "output"):
            medians = [0.0] * len(sizes)  # the runtime does no work for them
        else:
            log.warning("task %s was not timed (no runtime counterpart); it keeps the roofline", task.name)
            continue
        timings[key] = prof.task_timing(task.name, sizes, medians, options.repetitions)
    return timings
