"""A serving stage's iterations replayed as CUDA graphs between its attentions (piecewise graphs).

Eager PyTorch makes one host call per kernel, about fifty per decoder layer, and on a GPU the
device waits for the host (docs/serve-runtime.md, "On a GPU"). Engines capture their iterations
in CUDA graphs; vLLM's piecewise form leaves attention, whose shapes change with every
sequence's length, eager. So does this one. For a stage of n layers:

    piece 0:     the embedding (first stage), the rotary angles, layer 0 up to its attention
                 (norm, q/k/v projection, rotary)
    piece i:     layer i - 1 after its attention (output projection, residual, MLP, residual),
                 then layer i up to its attention
    piece n:     layer n - 1 after its attention
    eager:       each layer's attention (llm_planner.runtime.serve_stage.attend, over the
                 iteration's real tokens) between the pieces, and on the last stage the final
                 norm and LM head on the sampled rows

Every piece reads and writes static buffers sized for the stage's largest iteration (hidden
state, q, k, v, attention output, token ids, positions, rotary angles). An iteration of T tokens
replays the pieces captured for the smallest size >= T (`SIZES`: 1, 2, 4, multiples of 8 to 256,
of 16 to 512, and the buffers' size if smaller), all captured before the first iteration
(`capture_all`, largest first, one memory pool); its rows past T are padding.
No piece mixes rows (linears, norms and activations act on each row alone; attention, which
mixes them, sees the real rows only), so padding changes no real row beyond the rounding of a
matrix product of another shape. An iteration larger than the buffers or than 512 tokens runs
eagerly: its kernels are large enough that launching them costs little beside them.

Graphs are captured on a CUDA device for a stage on one device whose MLPs are dense
(`capture_refusal`): a tensor-parallel group's collectives go through MPI on the host, and a
mixture of experts routes with shapes that depend on the tokens, neither of which a graph holds.
Without capture (`capture=False`, and on a CPU) the pieces run as plain calls on the same
buffers, which is how the tests check this path's tokens against the eager one's.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from functools import partial

import torch

from llm_planner.runtime.serve_stage import ServeStage, attend

SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))  # an iteration of more tokens runs eagerly


def size_for(tokens: int, max_tokens: int) -> int | None:
    """The smallest capture size that holds `tokens`, within `max_tokens` (None: none does)."""
    at = bisect.bisect_left(SIZES, tokens)
    if at == len(SIZES):
        return None
    size = min(SIZES[at], max_tokens)
    return size if size >= tokens else None


def capture_refusal(stage: ServeStage) -> str | None:
    """Why this stage's pieces cannot be captured as CUDA graphs (None: they can)."""
    if stage.device.type != "cuda":
        return f"the stage runs on {stage.device.type}, not CUDA"
    if stage.ops.size > 1:
        return "a tensor-parallel group's collectives run through MPI on the host"
    if any(block.moe is not None for block in stage.blocks):
        return "a mixture of experts routes tokens with shapes a graph cannot hold"
    return None


class Buffers:
    """The pieces' static tensors, for iterations of up to `rows` tokens."""

    def __init__(self, stage: ServeStage, rows: int):
        block = stage.blocks[0]
        dtype, device = block.qkv.weight.dtype, stage.device

        def zeros(*shape, kind=dtype):
            return torch.zeros(rows, *shape, dtype=kind, device=device)

        self.ids, self.position = zeros(kind=torch.long), zeros(kind=torch.long)
        self.x = zeros(stage.config.hidden_size)
        self.q, self.attention = zeros(block.heads, block.d), zeros(block.heads, block.d)
        self.k, self.v = zeros(block.kv, block.d), zeros(block.kv, block.d)
        self.cos = self.sin = None
        if stage.rotary is not None:
            self.cos, self.sin = zeros(block.d), zeros(block.d)


class Pieces:
    """Runs a stage's iterations piecewise (module docstring): `run` takes and returns what
    ServeStage.run does."""

    def __init__(self, stage: ServeStage, max_tokens: int, *, capture: bool):
        if capture and (why := capture_refusal(stage)) is not None:
            raise ValueError(f"CUDA graphs: {why}")
        # buffers for the largest size captured: a larger iteration runs eagerly, its own tensors
        self.stage, self.max_tokens, self.capture = stage, min(max_tokens, SIZES[-1]), capture
        self.buf = Buffers(stage, self.max_tokens)
        self.pieces: dict[int, list[Callable[[], None]]] = {}  # size -> its pieces, in order
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def capture_all(self) -> int:
        """Capture (or prepare) the pieces of every size an iteration may take; the number of sizes."""
        sizes = {size_for(t, self.max_tokens) for t in (*SIZES, self.max_tokens)} - {None}
        for size in sorted(sizes, reverse=True):
            self._pieces(size)
        return len(sizes)

    @property
    def sizes(self) -> list[int]:
        """The sizes captured (or prepared) so far."""
        return sorted(self.pieces)

    def run(self, entries, value: torch.Tensor) -> torch.Tensor:
        tokens = sum(e.tokens for e in entries)
        size = size_for(tokens, self.max_tokens)
        if size is None:
            return self.stage.run(entries, value)
        pieces = self._pieces(size)  # captured before this iteration's inputs are in the buffers
        index = self.stage.index(entries)
        self._load(index.position, value.to(self.stage.device), tokens, size)
        b = self.buf
        for piece, block in zip(pieces, self.stage.blocks):
            piece()
            q, k, v, out = b.q[:tokens], b.k[:tokens], b.v[:tokens], b.attention[:tokens]
            attend(q, k, v, block.cache_k, block.cache_v, index, block.rep, out=out)
        pieces[-1]()
        x = b.x[:tokens]
        return self.stage.sample(entries, x) if self.stage.last else x.clone()

    def _load(self, position: torch.Tensor, value: torch.Tensor, tokens: int, size: int) -> None:
        """The iteration's positions and input in the first `tokens` rows; the padding rows at
        position 0 (token 0 on the first stage), so every lookup stays in its table."""
        b = self.buf
        b.position[:tokens].copy_(position)
        b.position[tokens:size].zero_()
        if self.stage.embed is not None:
            b.ids[:tokens].copy_(value)
            b.ids[tokens:size].zero_()
        else:
            b.x[:tokens].copy_(value)
            b.x[tokens:size].zero_()  # padding rows stay finite however many iterations pass

    def _pieces(self, size: int) -> list[Callable[[], None]]:
        if size not in self.pieces:
            plain = [partial(self._piece, i, size) for i in range(len(self.stage.blocks) + 1)]
            self.pieces[size] = self._captured(plain) if self.capture else plain
        return self.pieces[size]

    def _piece(self, i: int, n: int) -> None:
        """Piece i (module docstring) over the buffers' first n rows."""
        stage, b = self.stage, self.buf
        x = b.x[:n]
        if i == 0:
            x = stage.embed(b.ids[:n], b.position[:n]) if stage.embed is not None else x
            rotary = stage.rotary_of(x, b.position[:n])
            if rotary is not None:
                b.cos[:n].copy_(rotary[0][0])
                b.sin[:n].copy_(rotary[1][0])
        else:
            x = stage.blocks[i - 1].after_attention(x, b.attention[:n].reshape(n, -1))
        if i < len(stage.blocks):
            rotary = None if b.cos is None else (b.cos[:n][None], b.sin[:n][None])
            q, k, v = stage.blocks[i].attention_inputs(x, rotary)
            b.q[:n].copy_(q)
            b.k[:n].copy_(k)
            b.v[:n].copy_(v)
        if x.data_ptr() != b.x.data_ptr():
            b.x[:n].copy_(x)

    def _captured(self, plain: list[Callable[[], None]]) -> list[Callable[[], None]]:
        """Each piece as a CUDA graph's replay, after one eager pass (the libraries' kernels chosen
        and their workspaces allocated outside the capture) on a side stream."""
        device = self.stage.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for piece in plain:
                piece()
        torch.cuda.current_stream(device).wait_stream(side)
        graphs = []
        for piece in plain:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                piece()
            graphs.append(graph.replay)
        return graphs
