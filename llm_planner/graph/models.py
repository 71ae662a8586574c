"""Model names -> task graphs: the one entry point the CLI and the verifier use.

A ModelSpec names a preset (`llm-planner models` lists them), a transformers
config.json file or a directory holding one, and carries the builder options.
Builders that need torch are imported lazily, so decoder presets and graph
files work without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from llm_planner.core.constants import DTYPE_BYTES, GRANULARITIES, PHASES
from llm_planner.graph import decoder_graph, decoder_presets, hf_config, rwnn
from llm_planner.graph.attention_window import check_window
from llm_planner.graph.ir import GraphError, TaskGraph

__all__ = ["DTYPE_BYTES", "GRANULARITIES", "PHASES", "ModelSpec", "build_model_graph", "list_models"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str  # preset name, config.json path, or a directory with config.json
    phase: str = "decode"  # decoders: "prefill" (prompt of seq_len) or one "decode" step
    seq_len: int | None = None  # decoders: prompt (prefill) or context (decode) length; None = min(2048, model's max)
    granularity: str = "block"  # decoders: one task per "block", or attention/MLP per "sublayer"
    dtype: str = "fp16"  # element type of weights and activations
    seed: int = 0  # random graphs (RWNN)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise GraphError(f"model: unknown key(s) {sorted(unknown)}")
        return cls(**data)

    def check(self) -> "ModelSpec":
        if self.phase not in PHASES:
            raise GraphError(f"model phase must be one of {PHASES}, got {self.phase!r}")
        if self.dtype not in DTYPE_BYTES:
            raise GraphError(f"model dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.granularity not in GRANULARITIES:
            raise GraphError(f"model granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        if self.seq_len is not None and self.seq_len < 1:
            raise GraphError(f"model seq_len must be >= 1, got {self.seq_len}")
        return self


def list_models() -> list[tuple[str, str, str]]:
    """(name, family, description) of every preset."""

    out = [(name, "decoder", desc) for name, desc in decoder_presets.preset_descriptions()]
    out += [("resnet18", "cnn", "ResNet-18 from a transformers ResNetConfig, traced with torch.fx (needs torch)")]
    out += [("resnet50", "cnn", "ResNet-50 from a transformers ResNetConfig, traced with torch.fx (needs torch)")]
    out += [(name, "rwnn", desc) for name, desc in rwnn.preset_descriptions()]
    return out


def _resnet_graph(spec: ModelSpec) -> TaskGraph:
    """A CNN preset, traced with torch.fx: the one model family that needs torch and transformers, which
    the planning install (requirements-plan.txt) leaves out."""
    try:
        import transformers  # noqa: F401  (fx builds the network from a transformers ResNetConfig)

        from llm_planner.graph import fx
    except ImportError as exc:
        raise GraphError(
            f"model {spec.name!r} is traced with torch.fx and needs torch and transformers, but "
            f"{exc.name or exc} is not installed (pip install -r requirements.txt installs them)"
        ) from None
    return fx.build_resnet_graph(spec.name, dtype=spec.dtype)


def build_model_graph(spec: ModelSpec) -> TaskGraph:
    """Build the task graph of a preset, a config file or a config directory."""

    spec.check()
    if spec.name in ("resnet18", "resnet50"):
        return _resnet_graph(spec)
    if rwnn.is_rwnn_name(spec.name):
        return rwnn.build_rwnn_graph_from_name(spec.name, seed=spec.seed, dtype=spec.dtype)
    config = hf_config.named_config(spec.name)
    if config is None:
        names = ", ".join(name for name, _, _ in list_models())
        raise GraphError(
            f"unknown model {spec.name!r}: not a preset, a config.json or a directory holding one (presets: {names})"
        )
    if config.is_moe:  # its layers' times are not affine in the batch: the placement solvers' costs
        raise GraphError(
            f"model {spec.name!r} is a mixture of experts ({config.num_experts} experts, top-"
            f"{config.experts_per_token}): only --objective serving plans it (the latency and throughput "
            "objectives, profiling and the runtime do not model experts yet)"
        )
    seq_len = spec.seq_len if spec.seq_len is not None else min(2048, config.max_positions)
    check_window(config, seq_len, f"seq_len {seq_len} tokens", hf_config.model_source(spec.name))
    return decoder_graph.build_decoder_graph(
        config, phase=spec.phase, seq_len=seq_len, granularity=spec.granularity, dtype=spec.dtype
    )
