"""What a served plan runs, as the rank table carries it (`run.serving`): plain data, no torch.

    {"model": <model.name>, "replicas": [{"pattern": <layout text>, "concurrency": C, "micro_batches": m, "share": x,
                   "stages": [{"ranks": [world ranks, leader first], "first_layer": a, "layers": n,
                               "attention": "tp" | "dp"}, ...]},
                  ...],
     "max_batched_tokens": B, "context_len": L,
     "load": {"shapes": [[P, O, w], ...], "vocab_size": V, "seed": s, "request_rate": null | R},
     "max_requests": N | null, "duration_s": S | null, "cuda_graphs": true | false}

The launcher (llm_planner.launch.serve_launch) writes it from a serving plan: one replica per
copy of each replica pattern, its stages on the ranks of the devices the plan assigned them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_planner.runtime.serve_requests import LoadSpec


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    ranks: tuple[int, ...]  # the stage's ranks, leader first (one: a single device)
    first_layer: int
    layers: int
    attention: str = "tp"  # "tp": a tensor-parallel group; "dp": data-parallel attention, experts split

    @property
    def leader(self) -> int:
        return self.ranks[0]


@dataclass(frozen=True, kw_only=True)
class ReplicaSpec:
    pattern: str
    concurrency: int
    micro_batches: int
    share: float  # the replica's share of the requests (its predicted tokens/s over the total)
    stages: tuple[StageSpec, ...]


@dataclass(frozen=True, kw_only=True)
class Role:
    """Where a rank serves: its replica, its stage in the pipeline, and its index in the stage's group."""

    replica: int
    stage: int
    member: int


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    model: str  # the plan's model.name (a preset, a config.json or its directory)
    replicas: tuple[ReplicaSpec, ...]
    max_batched_tokens: int
    context_len: int
    load: LoadSpec
    max_requests: int | None
    duration_s: float | None
    cuda_graphs: bool = True  # CUDA graphs of the stages that can take them (llm_planner.runtime.serve_graphs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "replicas": [
                {
                    "pattern": r.pattern,
                    "concurrency": r.concurrency,
                    "micro_batches": r.micro_batches,
                    "share": r.share,
                    "stages": [
                        {
                            "ranks": list(s.ranks),
                            "first_layer": s.first_layer,
                            "layers": s.layers,
                            "attention": s.attention,
                        }
                        for s in r.stages
                    ],
                }
                for r in self.replicas
            ],
            "max_batched_tokens": self.max_batched_tokens,
            "context_len": self.context_len,
            "load": {
                "shapes": [list(s) for s in self.load.shapes],
                "vocab_size": self.load.vocab_size,
                "seed": self.load.seed,
                "request_rate": self.load.request_rate,
            },
            "max_requests": self.max_requests,
            "duration_s": self.duration_s,
            "cuda_graphs": self.cuda_graphs,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ServeSpec":
        replicas = tuple(
            ReplicaSpec(
                pattern=r["pattern"],
                concurrency=int(r["concurrency"]),
                micro_batches=int(r["micro_batches"]),
                share=float(r["share"]),
                stages=tuple(
                    StageSpec(
                        ranks=tuple(s["ranks"]),
                        first_layer=int(s["first_layer"]),
                        layers=int(s["layers"]),
                        attention=str(s.get("attention", "tp")),
                    )
                    for s in r["stages"]
                ),
            )
            for r in d["replicas"]
        )
        load = d["load"]
        return cls(
            model=str(d["model"]),
            replicas=replicas,
            max_batched_tokens=int(d["max_batched_tokens"]),
            context_len=int(d["context_len"]),
            load=LoadSpec(
                shapes=tuple((int(p), int(o), float(w)) for p, o, w in load["shapes"]),
                vocab_size=int(load["vocab_size"]),
                seed=int(load["seed"]),
                request_rate=load["request_rate"],
            ),
            max_requests=d["max_requests"],
            duration_s=d["duration_s"],
            cuda_graphs=bool(d.get("cuda_graphs", True)),
        )

    def role(self, rank: int) -> Role:
        for r, replica in enumerate(self.replicas):
            for s, stage in enumerate(replica.stages):
                if rank in stage.ranks:
                    return Role(replica=r, stage=s, member=stage.ranks.index(rank))
        raise ValueError(f"rank {rank} serves no stage of the plan")

    @property
    def shares(self) -> list[float]:
        return [r.share for r in self.replicas]
