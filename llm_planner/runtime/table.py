"""The rank table: the file `launch` writes and every rank reads (JSON, documented in launch/README.md).

Pure data, no torch and no mpi4py: the launcher imports it to write the file.

    {"format": "llm_planner.rank_table", "version": 1,
     "ranks": [{"rank": 0, "device": "localhost/cpu-core:0", "node": "localhost",
                "hostname": "localhost", "device_type": "cpu", "gpu_index": null,
                "tasks": {"0": ["embed", "block.0"]}, "plan_device": "localhost/cpu-core:0",
                "group": []}, ...],
     "run": {"plan_path": ..., "workload": "decoder" | "graph" | "serving", ...}}
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_planner.core.atomic import write_atomic
from llm_planner.core.fileio import is_version, read_document
from llm_planner.core.names import hostname_problem

RANK_TABLE_FORMAT = "llm_planner.rank_table"
RANK_TABLE_VERSION = 1
WORKLOADS = ("decoder", "graph", "serving")


class RankTableError(ValueError):
    """A rank table file that cannot be used; the message names the file and field."""


@dataclass(frozen=True, kw_only=True)
class RankEntry:
    rank: int
    device: str  # plan device name "<node>/<kind>:<index>"
    node: str
    hostname: str
    device_type: str  # "cpu" | "gpu" | "accelerator" (the kind's type in the cluster spec)
    gpu_index: int | None  # cuda:N for a GPU: its position among the node's GPU devices
    tasks: dict[str, list[str]]  # shard index (as a string) -> the rank's tasks in plan order
    plan_device: str = ""  # the plan's device this rank serves: its own name, or the group it is a member of
    group: list[int] = field(default_factory=list)  # the ranks of that group, leader first (empty: a single device)


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What the ranks run and where they write; every field is set by the launcher."""

    plan_path: str
    workload: str  # one of WORKLOADS
    workdir: str  # error files, the report and outputs go here
    report_path: str
    timeout_s: float  # every rank aborts the job after this long
    checkpoint: str | None = None  # decoder: Hugging Face checkpoint directory (safetensors)
    prompt_ids: list[list[int]] = field(default_factory=list)  # decoder: one prompt per request
    max_new_tokens: int = 16
    batches: int = 1  # batches in flight, each cut as the plan's shards (llm_planner.runtime.plan_schedule)
    seed: int = 0  # seeded weights (no checkpoint) and the CNN input batch
    dtype: str | None = None  # element type to run in; None: the plan's dtype
    attn_implementation: str = "sdpa"
    fail_rank: int | None = None  # fault injection: this rank raises once the run starts (tests the failure path)
    warmup: int = 0  # untimed runs of the whole workload before the timed one (one-time costs stay out of the times)
    serving: dict[str, Any] | None = None  # serving plans: replicas, stages, load (serve_spec.ServeSpec)


@dataclass(frozen=True, kw_only=True)
class RankTable:
    ranks: tuple[RankEntry, ...]
    run: RunSpec

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def rank_of_device(self) -> dict[str, int]:
        return {r.device: r.rank for r in self.ranks}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RANK_TABLE_FORMAT,
            "version": RANK_TABLE_VERSION,
            "world_size": self.world_size,
            "ranks": [dataclasses.asdict(r) for r in self.ranks],
            "run": dataclasses.asdict(self.run),
        }

    def save(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n", RankTableError)


def rank_table_from_dict(data: Any, source: str = "<memory>") -> RankTable:
    if not isinstance(data, dict) or data.get("format") != RANK_TABLE_FORMAT:
        raise RankTableError(f'{source}: not a rank table (expected "format": "{RANK_TABLE_FORMAT}")')
    if not is_version(data.get("version"), RANK_TABLE_VERSION):
        raise RankTableError(f"{source}: version: unsupported rank table version {data.get('version')!r}")
    try:
        ranks = tuple(RankEntry(**r) for r in data["ranks"])
        run = RunSpec(**data["run"])
    except (KeyError, TypeError) as exc:
        raise RankTableError(f"{source}: malformed rank table: {exc}") from None
    for r in ranks:  # each goes into mpiexec's hostfile
        problem = hostname_problem(r.hostname) if isinstance(r.hostname, str) else "expected a string"
        if problem is not None:
            raise RankTableError(f"{source}: ranks[{r.rank}].hostname: {problem}")
    if [r.rank for r in ranks] != list(range(len(ranks))):
        raise RankTableError(f"{source}: ranks: ranks must be 0..{len(ranks) - 1} in order")
    if not isinstance(run.warmup, int) or isinstance(run.warmup, bool) or run.warmup < 0:
        raise RankTableError(f"{source}: run.warmup: expected a whole number of runs >= 0, got {run.warmup!r}")
    if run.workload not in WORKLOADS:
        raise RankTableError(f"{source}: run.workload: must be one of {WORKLOADS}, got {run.workload!r}")
    return RankTable(ranks=ranks, run=run)


def load_rank_table(path: str | Path) -> RankTable:
    data = read_document(path, RankTableError)
    return rank_table_from_dict(data, source=str(path))
