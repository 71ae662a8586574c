"""A member's share of a mixture-of-experts MLP (llm_planner.graph.moe) with its experts
tensor-parallel, as the planner costs it (llm_planner.graph.tp_layout.moe_mlp_layout) and as vLLM
and SGLang run it without expert parallelism. On x [T, h] (the MLP norm's output):

    router   logits = x R^T (R [E, h], whole on every member); p = softmax(logits) in float32; the
             top-k of p (torch.topk), divided by their sum where the model type renormalises
             (mixtral always; qwen2_moe and qwen3_moe when the config's norm_topk_prob is true)
    experts  for each expert e some token chose, on the rows routed to it with weight w:
             w * down_e(silu(gate_e x) * up_e x), gate_e and up_e the member's rows of the expert's
             width (column-parallel), down_e its columns (row-parallel)
    shared   (qwen2_moe) sigmoid(x g^T) * down_s(silu(gate_s x) * up_s x): g [1, h] whole, the
             shared expert's width split like a routed expert's
    then one all-reduce of the routed and shared partial sums.

The sum over members of their partial outputs is the whole model's output: each member holds a
slice of every expert's width, and what multiplies a slice (the routing weight, the shared gate)
is computed from the same x with the same replicated weights on every member. The routing weights
multiply in float32 (mixtral) or in the activations' dtype (qwen2_moe, qwen3_moe), as the
transformers classes do.

Weights are read by their checkpoint names (`checkpoint_names`: what `save_pretrained` writes and
the published checkpoints hold, one tensor per expert); transformers 5 fuses each layer's experts
in memory (`experts.gate_up_proj`, `experts.down_proj`) and converts on loading, so the whole
model of the tests (`whole_model`) is loaded by transformers' own `from_pretrained`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from llm_planner.graph.hf_config import from_hf_config
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.runtime.tp_primitives import ColumnParallelLinear, frozen
from llm_planner.runtime.weights import CheckpointWeights, WeightsError


def checkpoint_names(cfg: DecoderConfig, p: str) -> dict[str, str]:
    """Declared MoE weight (llm_planner.graph.tp_layout.moe_mlp_layout) -> its tensor's name in a
    checkpoint of the model type, for the layer whose prefix is `p` ("model.layers.3")."""
    if cfg.hf_model_type == "mixtral":
        moe, parts = f"{p}.block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}
    else:
        moe, parts = f"{p}.mlp", {n: f"{n}_proj" for n in ("gate", "up", "down")}
    out = {"router": f"{moe}.gate.weight"}
    for e in range(cfg.num_experts):
        out.update({f"experts.{e}.{n}": f"{moe}.experts.{e}.{stored}.weight" for n, stored in parts.items()})
    if cfg.shared_expert_size:
        out.update({f"shared.{n}": f"{moe}.shared_expert.{n}_proj.weight" for n in ("gate", "up", "down")})
        out["shared.scale"] = f"{moe}.shared_expert_gate.weight"
    return out


def renormalises(hf_config) -> bool:
    """Whether the top-k routing weights are divided by their sum (module docstring): the
    DecoderConfig's norm_topk_prob (llm_planner.graph.hf_config decides it per model type)."""
    return from_hf_config(hf_config).norm_topk_prob


class MoEShard(torch.nn.Module):
    """A member's share of an MoE layer's MLP, without its norm (the module docstring)."""

    def __init__(
        self, cfg: DecoderConfig, t: dict[str, torch.Tensor], ops, *, renormalise: bool, experts: range | None = None
    ):
        """`experts`: those `t` holds and this member runs (None: every one, each a slice of its width)."""
        from transformers.activations import ACT2FN

        super().__init__()
        self.ops, self.top_k, self.renormalise = ops, cfg.experts_per_token, renormalise
        self.float_weights = cfg.hf_model_type == "mixtral"
        self.act = ACT2FN[cfg.activation]
        self.router = frozen(t["router"])
        self.experts = experts = range(cfg.num_experts) if experts is None else experts
        self.gate_up = frozen(torch.stack([torch.cat([t[f"experts.{e}.gate"], t[f"experts.{e}.up"]]) for e in experts]))
        self.down = frozen(torch.stack([t[f"experts.{e}.down"] for e in experts]))
        self.shared = None
        if cfg.shared_expert_size:
            self.shared = ColumnParallelLinear([t["shared.gate"], t["shared.up"]], [None, None])
            self.shared_down, self.shared_scale = frozen(t["shared.down"]), frozen(t["shared.scale"])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], experts [T, k]) of each token's top-k experts."""
        probs = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalise:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.float_weights else weights.to(x.dtype)), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        out = self.routed(x)
        if self.shared is not None:
            out += self.shared_part(x)
        return self.ops.all_reduce_(out).reshape(shape)

    def routed(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, h] -> the sum over the experts this member holds of their weighted outputs on their rows."""
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        first = self.experts.start
        for e in chosen.unique().tolist():
            if e not in self.experts:
                continue
            rows, slot = torch.where(chosen == e)
            gate, up = F.linear(x[rows], self.gate_up[e - first]).chunk(2, dim=-1)
            y = F.linear(self.act(gate) * up, self.down[e - first]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        return out

    def shared_part(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert times its gate on x [T, h] (this member's slice of its width)."""
        gate, up = self.shared(x)
        return torch.sigmoid(F.linear(x, self.shared_scale)) * F.linear(self.act(gate) * up, self.shared_down)


def whole_model(config, source) -> torch.nn.Module:
    """The whole transformers model of an MoE config holding `source`'s tensors (the reference of tests
    and benchmarks): a checkpoint loaded by `from_pretrained`; seeded tensors drawn under the names the
    model's own `save_pretrained` writes, saved, and loaded the same way. Every tensor must load:
    WeightsError names the keys a load missed or did not expect."""
    from transformers import AutoModelForCausalLM

    if isinstance(source, CheckpointWeights):
        return _load(config, source.directory)
    with tempfile.TemporaryDirectory() as tmp:
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        _redraw(Path(tmp) / "model.safetensors", source)
        return _load(config, Path(tmp))


def _redraw(path: Path, source) -> None:
    """Replace every tensor of a single-file checkpoint by `source`'s tensor of the same name."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        shapes = {name: f.get_slice(name).get_shape() for name in f.keys()}
    save_file({n: source.tensor(n, torch.Size(s)).contiguous() for n, s in shapes.items()}, str(path), {"format": "pt"})


def _load(config, directory: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        str(directory), config=config, dtype=torch.float32, output_loading_info=True, local_files_only=True
    )
    bad = {k: list(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise WeightsError(f"{directory}: the {config.model_type} model did not load every tensor: {bad}")
    return model.eval()
