"""Inputs -> PlacementProblem: the path shared by `plan` and `verify`.

A problem is rebuilt from a plan's recorded inputs (cluster path, model spec or
graph file, objective, batch, shards, dtype) through the same builders, so the
verifier never reads solver state. Hashes recorded in the plan detect inputs
that changed since it was made.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from llm_planner.core.fileio import read_bytes, read_document, read_text
from llm_planner.core.plan import PlanInputs
from llm_planner.core.spec import ClusterSpec, load_cluster
from llm_planner.cost.profile import file_sha256, load_profile
from llm_planner.graph import workloads
from llm_planner.graph.hf_config import config_file_of
from llm_planner.graph.ir import GraphError, TaskGraph, graph_from_dict
from llm_planner.graph.models import ModelSpec, build_model_graph
from llm_planner.placement.fit import memory_shortfall, placement_conflict
from llm_planner.placement.problem import PlacementProblem, ProblemError, build_problem

# Tasks x devices of one problem: the task cost tables and the heuristics grow with it (a
# 50,000-task chain on 6 devices is at the limit; benchmarks/bench_limits.py). The transfer
# tables, edges x devices^2, have their own limit (problem.placement.MAX_TRANSFER_ENTRIES).
MAX_TASK_DEVICE_PAIRS = 300_000


class InputError(ValueError):
    """Inputs that do not fit together (no cluster, changed files, a model no cluster memory holds)."""


def load_graph_file(path: str | Path) -> tuple[TaskGraph, ClusterSpec | None]:
    """Read a task graph JSON file; workload files also define their own devices."""

    data = read_document(path, GraphError, finite=True)
    if workloads.is_workload(data):
        return workloads.workload_from_dict(data, source=str(path))
    return graph_from_dict(data, source=str(path)), None


def load_graph_and_cluster(
    *, cluster_path: str | None, model: ModelSpec | None = None, graph_path: str | None = None
) -> tuple[TaskGraph, ClusterSpec]:
    if (model is None) == (graph_path is None):
        raise InputError("give exactly one of a model name (--model) and a graph file (--graph)")
    own_cluster = None
    if graph_path is not None:
        graph, own_cluster = load_graph_file(graph_path)
    else:
        assert model is not None
        graph = build_model_graph(model)
    if cluster_path is not None:
        cluster = load_cluster(cluster_path)
    elif own_cluster is None:
        raise InputError("--cluster is required: only workload graph files describe their own devices")
    else:
        cluster = own_cluster
    pairs = graph.num_tasks * len(cluster.devices())
    if pairs > MAX_TASK_DEVICE_PAIRS:
        raise InputError(
            f"{_names(cluster_path, model, graph_path)}: {graph.num_tasks:,} tasks x {len(cluster.devices()):,} "
            f"devices = {pairs:,} placement pairs; the limit is {MAX_TASK_DEVICE_PAIRS:,} (docs/inputs.md)"
        )
    return graph, cluster


def _names(cluster_path: str | None, model: ModelSpec | None, graph_path: str | None) -> str:
    """The inputs in a message: "<graph file or model> on <cluster file>"."""
    what = str(graph_path) if graph_path is not None else f"model {model.name!r}" if model is not None else "the inputs"
    return f"{what} on {cluster_path}" if cluster_path is not None else what


def problem_from_inputs(
    *,
    cluster_path: str | None,
    model: ModelSpec | None = None,
    graph_path: str | None = None,
    objective: str = "latency",
    batch_size: int = 1,
    max_shards: int | None = None,
    options: dict | None = None,
    profile_path: str | None = None,
    max_tp: int | None = 1,
) -> PlacementProblem:
    """Load files, build the graph and precompute costs; records the inputs for the plan.

    With `profile_path`, the builder takes measured costs (llm_planner.cost.profile, read here) in
    place of the roofline wherever the profile has them. `max_tp`: the largest tensor-parallel group offered
    (None: as large as the cluster has; 1: none).
    """
    graph, cluster = load_graph_and_cluster(cluster_path=cluster_path, model=model, graph_path=graph_path)
    profile = None
    if profile_path is not None:
        profile = load_profile(profile_path)
    dtype = model.dtype if model is not None else "fp16"
    shards = len(cluster.devices()) if max_shards is None else max_shards
    if max_tp is None:
        max_tp = max((n for node in cluster.nodes for _, n in node.devices), default=1)
    inputs = PlanInputs(
        cluster=str(cluster_path) if cluster_path is not None else None,
        cluster_sha256=cluster.sha256,
        model=model.to_dict() if model is not None else {"graph": str(graph_path)},
        graph_sha256=graph.sha256(),
        objective=objective,
        batch_size=batch_size,
        max_shards=shards,
        dtype=dtype,
        options=dict(options or {}),
        profile=str(profile_path) if profile_path is not None else None,
        profile_sha256=_profile_sha256(profile_path),
        max_tp=max_tp,
        model_file_sha256=_model_file_sha256(
            model_file(model.to_dict() if model is not None else {"graph": graph_path})
        ),
    )
    try:
        problem = build_problem(
            graph,
            cluster,
            objective=objective,
            batch_size=batch_size,
            max_shards=shards,
            dtype=dtype,
            inputs=inputs,
            max_tp=max_tp,
            profile=profile,
        )
    except ProblemError as exc:
        raise InputError(f"{_names(cluster_path, model, graph_path)}: {exc}") from None
    conflict = placement_conflict(problem)
    if conflict is not None:
        raise InputError(f"{_names(cluster_path, model, graph_path)}: {conflict}")
    short = memory_shortfall(problem)
    if short is not None:
        batch = f" with a batch of {batch_size}" if batch_size > 1 else ""
        raise InputError(
            f"{_names(cluster_path, model, graph_path)}: the cluster's memory cannot hold the model{batch}: {short}"
        )
    return problem


def _profile_sha256(profile_path: str | None) -> str:
    if profile_path is None:
        return ""

    return file_sha256(profile_path)


def model_file(model: dict) -> str | None:
    """The file a recorded model names: its graph file, or the config.json its name names (None: a preset)."""
    if model.get("graph") is not None:
        return str(model["graph"])
    name = model.get("name")
    config = config_file_of(name) if isinstance(name, str) and name else None
    return str(config) if config is not None else None


def _model_file_sha256(path: str | None) -> str:
    return "" if path is None else hashlib.sha256(read_bytes(path, InputError)).hexdigest()


INPUT_SUFFIXES = (".yaml", ".yml", ".json")


def _check_input_files(inputs: PlanInputs, graph_path: str | None, check_hashes: bool) -> None:
    """A plan's input paths name cluster, graph and profile files (by their suffix; regular files,
    as fileio reads every file); the recorded hashes of the cluster and the profile match their bytes."""
    for field, path in (("cluster", inputs.cluster), ("model.graph", graph_path), ("profile", inputs.profile)):
        if path is not None and Path(path).suffix.lower() not in INPUT_SUFFIXES:
            raise InputError(
                f"inputs.{field}: {path!r} is not a cluster, graph or profile file "
                f"(expected {', '.join(INPUT_SUFFIXES)})"
            )
    if not check_hashes:
        return
    model = model_file(inputs.model)
    if model is not None:
        if not inputs.model_file_sha256:
            raise InputError(f"inputs.model_file_sha256: missing: the model names {model}, whose sha256 a plan records")
        if _model_file_sha256(model) != inputs.model_file_sha256:
            raise InputError(f"{model}: the model's file changed since the plan was made (sha256 differs)")
    if inputs.cluster and inputs.cluster_sha256:
        if hashlib.sha256(read_text(inputs.cluster, InputError).encode()).hexdigest() != inputs.cluster_sha256:
            raise InputError(f"{inputs.cluster}: the cluster file changed since the plan was made (sha256 differs)")
    if inputs.profile and inputs.profile_sha256:
        if hashlib.sha256(read_bytes(inputs.profile, InputError)).hexdigest() != inputs.profile_sha256:
            raise InputError(f"{inputs.profile}: the profile file changed since the plan was made (sha256 differs)")


def problem_from_plan_inputs(inputs: PlanInputs, *, check_hashes: bool = True) -> PlacementProblem:
    """Rebuild the problem a plan was made for; InputError if a file changed since (checked before
    the file is parsed, so a plan naming some other file gets no line of it quoted back)."""
    model_dict = dict(inputs.model)
    graph_path = model_dict.pop("graph", None)
    _check_input_files(inputs, graph_path, check_hashes)
    model = None if graph_path is not None else ModelSpec.from_dict(model_dict)
    problem = problem_from_inputs(
        cluster_path=inputs.cluster,
        model=model,
        graph_path=graph_path,
        objective=inputs.objective,
        batch_size=inputs.batch_size,
        max_shards=inputs.max_shards,
        options=inputs.options,
        profile_path=inputs.profile,
        max_tp=inputs.max_tp,
    )
    if check_hashes:
        assert problem.inputs is not None
        if inputs.cluster_sha256 and problem.inputs.cluster_sha256 != inputs.cluster_sha256:
            raise InputError(f"{inputs.cluster}: the cluster file changed since the plan was made (sha256 differs)")
        if problem.inputs.graph_sha256 != inputs.graph_sha256:
            raise InputError(f"model {inputs.model}: the task graph differs from the one the plan was made for")
        if inputs.profile_sha256 and problem.inputs.profile_sha256 != inputs.profile_sha256:
            raise InputError(f"{inputs.profile}: the profile file changed since the plan was made (sha256 differs)")
    return problem
