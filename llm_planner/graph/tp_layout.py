"""The tensor-parallel layout of a decoder's tasks, declared once (the Megatron-LM layout:
Shoeybi et al. 2019, "Megatron-LM: training multi-billion parameter language models using
model parallelism", sec. 3). No torch needed.

For each task kind (embed, attn, mlp, final_norm, lm_head; a block is attn then mlp) a
`TaskLayout` lists every parameter tensor of the task and how a member of a group of k holds it:

    column      a linear's output features split k ways (ColumnParallelLinear: Y_i = X A_i; the
                input is every member's, the output stays split), its bias split with it
    row         a linear's input features split k ways (RowParallelLinear: Y = sum_i X_i A_i, one
                all-reduce), its bias replicated and added once after the sum
    vocab       the rows of a token table or of the LM head split into contiguous ranges whose
                sizes differ by at most one (`even_range`): VocabParallelEmbedding and the head
    replicated  every member holds it whole: norms, row-parallel biases, learned positions,
                OPT's projections

Column and row splits go in whole units of a named count ("heads", "KV heads", "MLP width"):
a group's degree k must divide each count of a task (`divides`, the graph's `tp_divides`).
embed, final_norm and lm_head split no count (vocabulary ranges may be uneven); their count
is the hidden size, so they join exactly the groups whose degree divides it.

Each call of a task makes the collectives listed, with their payloads per position:
an all-reduce of the partial sums after each row-parallel linear and after the
vocabulary-parallel table lookup (a member's rows, zeros for ids outside them); after the
vocabulary-parallel head, an all-gather of each member's greedy candidate (its largest
logit and that logit's index, two float32), of which the largest wins. Per-position
activations that every member reads or writes whole (norms, residuals, a sublayer's input
and output) are `replicated_traffic`.

Shapes are (out_features, in_features) for linears (torch's convention, whatever a
checkpoint stores), (rows, width) for tables and (n,) for vectors.

Who reads it: llm_planner.graph.decoder_graph turns a layout into a task's `tp_` cost fields
(`tp_fields`), from which llm_planner.cost.roofline.shard_of gives a member's FLOPs, bytes and memory
and cost.collective_pieces the collectives' time; llm_planner.runtime.tp_layers builds each
member's share from column-, row- and vocabulary-parallel primitives
(llm_planner.runtime.tp_primitives) following the same layout, reads exactly
`TPWeight.member_range` of each tensor, and makes exactly the collectives listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llm_planner.graph.moe import shared_gate
from llm_planner.graph.transformer import DecoderConfig

SPLITS = ("column", "row", "vocab", "replicated")
COLLECTIVES = ("all_reduce", "all_gather")
KINDS = ("embed", "attn", "mlp", "block", "final_norm", "lm_head")
ARGMAX_BYTES = 4  # the head's candidates (largest logit, its index) travel as float32


def even_range(total: int, k: int, index: int) -> tuple[int, int]:
    """Member `index`'s contiguous part [lo, hi) of `total` rows split k ways (sizes differ by at most one)."""
    return total * index // k, total * (index + 1) // k


@dataclass(frozen=True, kw_only=True)
class TPWeight:
    """One parameter tensor of a task and how a group's members hold it (module docstring)."""

    name: str  # its role in the task: "q", "q.bias", "o", "attn_norm.weight", "tokens", "head", ...
    shape: tuple[int, ...]
    split: str  # one of SPLITS
    unit: str | None = None  # column / row: the count it splits in whole parts of (TaskLayout.units)
    indexed: bool = False  # a table: a call reads only the rows of its tokens

    @property
    def dim(self) -> int | None:
        """The dimension split: output features (column, vocab), input features (row), None when replicated."""
        if self.split == "replicated":
            return None
        return 1 if self.split == "row" and len(self.shape) == 2 else 0

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    def member_range(self, k: int, index: int) -> tuple[int, int]:
        """The part [lo, hi) along `dim` that member `index` of k holds (all of it when replicated)."""
        if self.dim is None:
            return 0, self.shape[0]
        return even_range(self.shape[self.dim], k, index)

    def member_shape(self, k: int, index: int) -> tuple[int, ...]:
        if self.dim is None:
            return self.shape
        lo, hi = self.member_range(k, index)
        return tuple(hi - lo if d == self.dim else n for d, n in enumerate(self.shape))


@dataclass(frozen=True, kw_only=True)
class TPCollective:
    """One collective a call of the task makes, after the weight `after`."""

    op: str  # one of COLLECTIVES
    after: str  # the weight whose partial results it combines
    width: int  # elements per position: an all-reduce's whole tensor, an all-gather's part per member
    element_bytes: int | None = None  # None: the activations' dtype

    def bytes_per_position(self, dtype_bytes: int) -> int:
        return self.width * (self.element_bytes or dtype_bytes)


@dataclass(frozen=True, kw_only=True)
class TaskLayout:
    """A task kind's tensor-parallel layout (module docstring)."""

    kind: str  # one of KINDS
    weights: tuple[TPWeight, ...]
    units: tuple[tuple[str, int], ...]  # (name, count): a group's degree must divide each count
    collectives: tuple[TPCollective, ...] = ()
    replicated_traffic: int | None = None  # elements per position every member moves whole; None: all its traffic
    last_position_only: bool = False  # lm_head: the logits of the last position only
    replicated_cache: bool = False  # every member holds the task's whole KV cache (MLA's latent)

    def __post_init__(self) -> None:
        names = [w.name for w in self.weights]
        assert len(set(names)) == len(names), f"{self.kind}: weight names repeat: {names}"
        units = dict(self.units)
        for w in self.weights:
            assert w.split in SPLITS, f"{self.kind}.{w.name}: split {w.split!r}"
            assert (w.unit is not None) == (w.split in ("column", "row")), f"{self.kind}.{w.name}: unit {w.unit!r}"
            assert w.unit is None or w.shape[w.dim] % units[w.unit] == 0, f"{self.kind}.{w.name}: {w.unit}"
        for c in self.collectives:
            assert c.op in COLLECTIVES and c.after in names, f"{self.kind}: collective {c}"

    @property
    def divides(self) -> tuple[int, ...]:
        return tuple(count for _, count in self.units)

    def weight(self, name: str) -> TPWeight:
        return next(w for w in self.weights if w.name == name)

    def elements(self, *, split: str | None = None, indexed: bool | None = None) -> int:
        """Elements of the weights with that split and indexing (any, when None)."""
        return sum(
            w.elements
            for w in self.weights
            if (split is None or w.split == split) and (indexed is None or w.indexed == indexed)
        )

    def member_elements(self, k: int, index: int = 0) -> int:
        """Elements of the weights that member `index` of a group of k holds."""
        return sum(math.prod(w.member_shape(k, index)) for w in self.weights)

    def cannot_split(self, k: int) -> list[str]:
        """The counts ("heads 2") that a group of k cannot split; empty when it can."""
        return [f"{name} {count}" for name, count in self.units if count % k]


def _vector(name: str, n: int, split: str = "replicated", unit: str | None = None) -> TPWeight:
    return TPWeight(name=name, shape=(n,), split=split, unit=unit)


def _norm(cfg: DecoderConfig, name: str) -> tuple[TPWeight, ...]:
    """A norm's scale (and LayerNorm's shift), replicated; none without learned parameters."""
    if not cfg.norm_affine:
        return ()
    parts = ("weight", "bias") if cfg.norm == "layernorm" else ("weight",)
    return tuple(_vector(f"{name}.{p}", cfg.hidden_size) for p in parts)


def _linear(name: str, out: int, inp: int, split: str, unit: str | None, bias: bool) -> tuple[TPWeight, ...]:
    """A linear's weight and bias: a column-parallel bias splits with it, a row-parallel one is replicated."""
    weight = TPWeight(name=name, shape=(out, inp), split=split, unit=unit)
    if not bias:
        return (weight,)
    return (weight, _vector(f"{name}.bias", out, *((split, unit) if split == "column" else ("replicated", None))))


def embed_layout(cfg: DecoderConfig) -> TaskLayout:
    h, dw = cfg.hidden_size, cfg.word_embed_dim
    weights = [TPWeight(name="tokens", shape=(cfg.vocab_size, dw), split="vocab", indexed=True)]
    if cfg.learned_positions:
        rows = cfg.max_positions + cfg.position_offset
        weights.append(TPWeight(name="positions", shape=(rows, h), split="replicated", indexed=True))
    if dw != h:
        weights.append(TPWeight(name="project_in", shape=(h, dw), split="replicated"))
    return TaskLayout(
        kind="embed",
        weights=tuple(weights),
        units=(("hidden size", h),),
        collectives=(TPCollective(op="all_reduce", after="tokens", width=dw),),
    )


def attn_layout(cfg: DecoderConfig) -> TaskLayout:
    """q/k/v column-parallel by head (each member's KV cache holds its KV heads), o row-parallel."""
    if cfg.is_mla:
        return mla_layout(cfg)
    h, a, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return TaskLayout(
        kind="attn",
        weights=(
            *_norm(cfg, "attn_norm"),
            *_linear("q", a, h, "column", "heads", cfg.qkv_bias),
            *_linear("k", kv, h, "column", "KV heads", cfg.qkv_bias),
            *_linear("v", kv, h, "column", "KV heads", cfg.qkv_bias),
            *_linear("o", h, a, "row", "heads", cfg.out_bias),
            *((_vector("q_norm.weight", cfg.head_dim), _vector("k_norm.weight", cfg.head_dim)) if cfg.qk_norm else ()),
        ),
        units=(("heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads)),
        collectives=(TPCollective(op="all_reduce", after="o", width=h),),
        replicated_traffic=7 * h,  # the norm 2h, the sublayer's input h and output h, the residual 3h
    )


def mla_layout(cfg: DecoderConfig) -> TaskLayout:
    """Multi-head latent attention as vLLM and SGLang split it (llm_planner.graph.mla): the latent
    projections q_a and kv_a and their norms replicated, q_b and kv_b column-parallel by head, o
    row-parallel, the latent cache whole on every member."""
    h, n, r_q, r_kv, d_r = cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    if r_q:
        q = (
            *_linear("q_a", r_q, h, "replicated", None, cfg.qkv_bias),
            _vector("q_a_norm.weight", r_q),
            *_linear("q_b", n * cfg.head_dim, r_q, "column", "heads", False),
        )
    else:
        q = _linear("q", n * cfg.head_dim, h, "column", "heads", False)
    return TaskLayout(
        kind="attn",
        weights=(
            *_norm(cfg, "attn_norm"),
            *q,
            *_linear("kv_a", r_kv + d_r, h, "replicated", None, cfg.qkv_bias),
            _vector("kv_a_norm.weight", r_kv),
            *_linear("kv_b", n * (cfg.qk_nope_head_dim + cfg.v_head_dim), r_kv, "column", "heads", False),
            *_linear("o", h, n * cfg.v_head_dim, "row", "heads", cfg.out_bias),
        ),
        units=(("heads", n),),
        collectives=(TPCollective(op="all_reduce", after="o", width=h),),
        # the norm and residual add (5h); the latents every member computes whole (llm_planner.graph.mla
        # member_traffic's replicated terms): q_a's and kv_a's inputs and outputs, q_b's and kv_b's
        # inputs, o's output, the latents' norms and the rope key's rotation
        replicated_traffic=8 * h + 4 * r_q + 4 * r_kv + 3 * d_r,
        replicated_cache=True,
    )


def mlp_layout(cfg: DecoderConfig) -> TaskLayout:
    """up (and gate) column-parallel, down row-parallel."""
    if cfg.is_moe:
        return moe_mlp_layout(cfg)
    h, inner = cfg.hidden_size, cfg.intermediate_size
    gate = _linear("gate", inner, h, "column", "MLP width", cfg.mlp_bias) if cfg.gated_mlp else ()
    return TaskLayout(
        kind="mlp",
        weights=(
            *_norm(cfg, "mlp_norm"),
            *gate,
            *_linear("up", inner, h, "column", "MLP width", cfg.mlp_bias),
            *_linear("down", h, inner, "row", "MLP width", cfg.mlp_bias),
        ),
        units=(("MLP width", inner),),
        collectives=(TPCollective(op="all_reduce", after="down", width=h),),
        replicated_traffic=7 * h,  # as attn
    )


def moe_mlp_layout(cfg: DecoderConfig) -> TaskLayout:
    """An MoE layer's MLP (llm_planner.graph.moe) with its experts tensor-parallel, as vLLM and
    SGLang run them without expert parallelism: every member holds a slice of every expert (gate
    and up column-parallel, down row-parallel over the experts' width), the router (and the
    shared expert's gate) replicated, the shared expert split like a dense MLP; one all-reduce of
    the routed and shared outputs' sum."""
    h, m, s = cfg.hidden_size, cfg.moe_intermediate_size, cfg.shared_expert_size
    weights = [*_norm(cfg, "mlp_norm"), TPWeight(name="router", shape=(cfg.num_experts, h), split="replicated")]
    for e in range(cfg.num_experts):
        weights += [
            TPWeight(name=f"experts.{e}.gate", shape=(m, h), split="column", unit="expert width"),
            TPWeight(name=f"experts.{e}.up", shape=(m, h), split="column", unit="expert width"),
            TPWeight(name=f"experts.{e}.down", shape=(h, m), split="row", unit="expert width"),
        ]
    units = [("expert width", m)]
    if s:
        weights += [
            TPWeight(name="shared.gate", shape=(s, h), split="column", unit="shared expert width"),
            TPWeight(name="shared.up", shape=(s, h), split="column", unit="shared expert width"),
            TPWeight(name="shared.down", shape=(h, s), split="row", unit="shared expert width"),
        ]
        weights += [TPWeight(name="shared.scale", shape=(1, h), split="replicated")] * shared_gate(cfg)
        units.append(("shared expert width", s))
    return TaskLayout(
        kind="mlp",
        weights=tuple(weights),
        units=tuple(units),
        collectives=(TPCollective(op="all_reduce", after=f"experts.{cfg.num_experts - 1}.down", width=h),),
        replicated_traffic=7 * h + cfg.num_experts,  # as attn, and the router's scores
    )


def final_norm_layout(cfg: DecoderConfig) -> TaskLayout:
    h, dw = cfg.hidden_size, cfg.word_embed_dim
    project = (TPWeight(name="project_out", shape=(dw, h), split="replicated"),) if dw != h else ()
    norm = _norm(cfg, "final_norm") if cfg.final_norm else ()
    return TaskLayout(kind="final_norm", weights=(*norm, *project), units=(("hidden size", h),))


def lm_head_layout(cfg: DecoderConfig) -> TaskLayout:
    """Vocabulary-parallel over the last position; each member's greedy candidate all-gathered."""
    return TaskLayout(
        kind="lm_head",
        weights=(TPWeight(name="head", shape=(cfg.vocab_size, cfg.word_embed_dim), split="vocab"),),
        units=(("hidden size", cfg.hidden_size),),
        collectives=(TPCollective(op="all_gather", after="head", width=2, element_bytes=ARGMAX_BYTES),),
        replicated_traffic=cfg.word_embed_dim,  # its input
        last_position_only=True,
    )


def block_layout(cfg: DecoderConfig) -> TaskLayout:
    """attn then mlp: both sublayers' weights, counts and collectives."""
    attn, mlp = attn_layout(cfg), mlp_layout(cfg)
    return TaskLayout(
        kind="block",
        weights=attn.weights + mlp.weights,
        units=attn.units + mlp.units,
        collectives=attn.collectives + mlp.collectives,
        replicated_traffic=attn.replicated_traffic + mlp.replicated_traffic,
        replicated_cache=attn.replicated_cache,
    )


def task_layout(cfg: DecoderConfig, kind: str) -> TaskLayout:
    """The layout of a task kind (KINDS)."""
    builders = {
        "embed": embed_layout,
        "attn": attn_layout,
        "mlp": mlp_layout,
        "block": block_layout,
        "final_norm": final_norm_layout,
        "lm_head": lm_head_layout,
    }
    if kind not in builders:
        raise ValueError(f"task kind {kind!r}: no tensor-parallel layout (kinds: {', '.join(KINDS)})")
    return builders[kind](cfg)


def tp_fields(layout: TaskLayout, *, tokens: int, dtype_bytes: int) -> dict[str, Any]:
    """The task's tensor-parallel cost fields (llm_planner.graph.ir.Task) for `tokens` positions per
    sequence: counts, replicated weights and traffic, indexed tables, the collectives' calls and
    payloads per sample. `tp_replicated_bytes_per_sample` None: all the task's traffic."""
    b = dtype_bytes
    positions = 1 if layout.last_position_only else tokens

    def payload(op: str) -> float:
        return float(sum(c.bytes_per_position(b) * positions for c in layout.collectives if c.op == op))

    return dict(
        tp_divides=layout.divides,
        tp_replicated_weight_bytes=float(layout.elements(split="replicated") * b),
        tp_replicated_indexed_bytes=float(layout.elements(split="replicated", indexed=True) * b),
        tp_replicated_bytes_per_sample=(
            None if layout.replicated_traffic is None else float(layout.replicated_traffic * positions * b)
        ),
        tp_replicated_mem_bytes_per_sample=None if layout.replicated_cache else 0.0,
        tp_allreduces=sum(c.op == "all_reduce" for c in layout.collectives),
        tp_allreduce_bytes_per_sample=payload("all_reduce"),
        tp_allgathers=sum(c.op == "all_gather" for c in layout.collectives),
        tp_allgather_bytes_per_sample=payload("all_gather"),
        weight_bytes_indexed=float(layout.elements(indexed=True) * b),
    )
