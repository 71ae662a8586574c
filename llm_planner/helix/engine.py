"""Helix's runtime as a throughput model: its per-machine-type tables and a steady-state
estimate of the decode tokens/s its simulator gives a layout (docs/helix.md, "Planning for
Helix's engine").

Helix (ASPLOS'25) describes each machine type of a model by files under its model manager
folder (e.g. `simulator/model_manager/llama2_70b/<type>/`): `decode_bs2time.csv` and
`prompt_bs2time.csv` (one layer's time in ms by batch) and `llama2_70b_<type>.py`, whose dict
literals give, by the number of layers a machine holds, the KV-cache blocks of 16 tokens per
layer (`vllm_num_blocks_dict`) and the largest decode batch (`decode_max_tokens_dict`);
`max_num_layers` is the most layers a machine of the type may hold (Helix's model refuses more;
without it, the tables' last row). `load_engine_tables` reads them, without running Helix's code.

The model of a layout made of stages (each `width` machines of one type holding the same
`layers`; a request passes one machine per stage):

- Queries in flight: Helix admits a new query while the fullest machine's expected KV use
  (prompt + 240 tokens per query on each of its layers) stays at most 80%, so
  C = 0.8 x min over stages of width x 16 x blocks(layers) / (prompt + 240).
- Its machines run what is queued as one batch, layer after layer; the model takes the C
  queries to move as a bunch (an assumption: on a layout measured, docs/helix.md, the
  simulator's machines run many small batches instead): one decode step of a query takes a
  round through every stage, where each machine runs its C / width requests in batches of at
  most its decode limit,
  plus the first request of the bunch alone (it arrives before the others and starts a batch
  by itself; Helix charges a one-request decode twice), plus each hop's latency and the
  bunch's transfer (every request is sent on its own).
- Decode tokens/s = C / round time.

Prompts share the machines and are not charged here; docs/helix.md compares the model with
the simulator on the layouts we measured.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_planner.core.fileio import read_text
from llm_planner.core.fmt import quote
from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.inputs import MAX_LAYERS, MAX_TABLE_VALUE, HelixError, read_profile_csv

BLOCK_TOKENS = 16  # tokens in one of vLLM's KV blocks (Helix's VLLM_BLOCK_SIZE)
EXPECTED_OUTPUT = 240  # tokens Helix's scheduler expects a query to add (AVG_OUTPUT_LEN)
FEED_HWM = 0.8  # Helix's offline feeder admits a query while the fullest machine is at most this full
TOKEN_BYTES = 2  # a token id on the wire, besides its activation
_TABLES = {"kv_blocks": "vllm_num_blocks_dict", "decode_limit": "decode_max_tokens_dict"}
_OPTIONAL_TABLES = {"prompt_requests": "prompt_max_requests_dict"}


@dataclass(frozen=True, kw_only=True)
class EngineTables:
    """One machine type's tables from Helix's model manager; times in seconds."""

    name: str  # the machine type's folder ("a100")
    decode: LayerTable  # one layer's seconds by batch, from batch 0
    kv_blocks: dict[int, int]  # layers held -> KV blocks per layer
    decode_limit: dict[int, int]  # layers held -> most decode requests in one batch
    max_layers: int  # the most layers Helix lets a machine of this type hold (its max_num_layers)
    prompt_requests: dict[int, int] | None = None  # layers held -> most prompts in one batch; None: not stated

    def prompt_limit(self, layers: int) -> int:
        """The most prompts one batch holds (its prompt_max_requests_dict; 1 where the type's file has none)."""
        if self.prompt_requests is None:
            return 1
        if layers not in self.prompt_requests:
            raise HelixError(f"{self.name}: prompt_max_requests_dict has no entry for {layers} layers")
        return self.prompt_requests[layers]

    def decode_s(self, batch: float) -> float:
        """One layer's decode time for `batch` requests, linear between the table's rows."""
        if batch > self.decode.sizes[-1]:
            last = self.decode.sizes[-1]
            raise HelixError(f"{self.name}: a decode batch of {batch:g} is past its table (last row {last})")
        return self.decode.at(batch)


@dataclass(frozen=True)
class Stage:
    kind: str  # machine type (an EngineTables.name)
    width: int  # machines holding the same layers; requests are split among them
    layers: int


@dataclass(frozen=True, kw_only=True)
class Network:
    latency_s: float  # one hop
    bw_bytes_per_s: float
    activation_bytes: int  # one token's hidden state


@dataclass(frozen=True, kw_only=True)
class Estimate:
    tokens_per_s: float  # decode tokens/s
    queries: float  # in flight
    round_s: float  # one decode step of a query


def load_engine_tables(folder: str | Path, machine_type: str) -> EngineTables:
    """The tables of `machine_type` (Helix's name, e.g. "A100") under a model manager folder."""
    base = Path(folder) / machine_type.lower()
    decode = read_profile_csv(base / "decode_bs2time.csv")
    sources = sorted(base.glob("*.py"))
    if len(sources) != 1:
        raise HelixError(f"{base}: expected one <model>_<type>.py with the type's tables, found {len(sources)}")
    tables = _dict_literals(sources[0])
    if set(tables["kv_blocks"]) != set(tables["decode_limit"]):
        raise HelixError(f"{sources[0]}: {_TABLES['kv_blocks']} and {_TABLES['decode_limit']} list different layers")
    if decode[0][0] != 0:
        raise HelixError(f"{base / 'decode_bs2time.csv'}: the first row must be batch 0 ('0,0'), not {decode[0][0]}")
    if max(tables["decode_limit"].values()) > decode[-1][0]:
        raise HelixError(
            f"{sources[0]}: {_TABLES['decode_limit']}: a batch of {max(tables['decode_limit'].values())} is past "
            f"{base / 'decode_bs2time.csv'}'s last row ({decode[-1][0]})"
        )
    return EngineTables(
        name=base.name,
        decode=LayerTable(sizes=tuple(b for b, _ in decode), seconds=tuple(s for _, s in decode)),
        kv_blocks=tables["kv_blocks"],
        decode_limit=tables["decode_limit"],
        max_layers=_layer_cap(sources[0], tables),
        prompt_requests=tables.get("prompt_requests"),
    )


def _layer_cap(path: Path, tables: dict) -> int:
    """The type's `max_num_layers` (its tables' last row when the file does not set it); Helix's
    model builds its settings for 1..max_num_layers from the tables, so they must reach it."""
    cap = tables.get("max_layers", max(tables["kv_blocks"]))
    if cap > max(tables["kv_blocks"]):
        raise HelixError(
            f"{path}: max_num_layers = {cap}, but {_TABLES['kv_blocks']} stops at {max(tables['kv_blocks'])} layers"
        )
    return cap


def _dict_literals(path: Path) -> dict[str, dict[int, int]]:
    """The two tables of a type's Python file, read as literals from its syntax tree (never run)."""
    try:
        tree = ast.parse(read_text(path, HelixError), filename=str(path))
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        what = getattr(exc, "msg", str(exc))
        if "integer string conversion" in what:  # Python's own limit, sys.get_int_max_str_digits()
            what = f"an integer of more than {sys.get_int_max_str_digits():,} digits"
        raise HelixError(f"{path}: not valid Python: {what}{where}") from None
    except (RecursionError, MemoryError):  # the parser's own limits: `1+1+...`, `-----1`, deep brackets
        raise HelixError(f"{path}: an expression nested too deeply for Python's parser") from None
    found, cap = {}, None
    for node in ast.walk(tree):
        for name in _assigned_names(node):
            if name == "max_num_layers":
                cap = _int_literal(path, node)
            if name in _TABLES.values() or name in _OPTIONAL_TABLES.values():
                if name in found:
                    raise HelixError(f"{path}: {name}: assigned more than once (line {node.lineno})")
                found[name] = _int_dict(path, name, node.value)
    out = {}
    for key, name in _TABLES.items():
        if name not in found:
            raise HelixError(f"{path}: {name}: missing (the type's table by number of layers held)")
        out[key] = found[name]
    for key, name in _OPTIONAL_TABLES.items():
        if name in found:
            out[key] = found[name]
    if cap is not None:
        out["max_layers"] = cap
    return out


def _int_literal(path: Path, node: ast.Assign | ast.AnnAssign) -> int:
    """`max_num_layers: int = 18`: a positive integer literal."""
    if not (_is_int(node.value) and 1 <= node.value.value <= MAX_LAYERS):
        raise HelixError(
            f"{path}: max_num_layers (line {node.lineno}): expected an integer literal in 1..{MAX_LAYERS:,}"
        )
    return node.value.value


def _assigned_names(node: ast.AST) -> list[str]:
    """Names a plain `x = ...` or `x: T = ...` statement assigns."""
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _int_dict(path: Path, name: str, node: ast.AST) -> dict[int, int]:
    """A dict display of integer literals {layers: value}, layers 1, 2, ... (no expression is evaluated)."""
    value = _flat_int_dict(node)
    if value is None:
        raise HelixError(
            f"{path}: {name}: expected {{layers: positive int}} for layers 1, 2, ... written as integer literals "
            f"(line {node.lineno})"
        )
    for layers, entry in value.items():
        if not (1 <= layers <= MAX_LAYERS and 1 <= entry <= MAX_TABLE_VALUE):
            raise HelixError(
                f"{path}: {name}: the entry {quote(layers, 40)}: {quote(entry, 40)} is outside layers "
                f"1..{MAX_LAYERS:,} and values 1..{MAX_TABLE_VALUE:,} (line {node.lineno})"
            )
    if sorted(value) != list(range(1, len(value) + 1)):
        raise HelixError(f"{path}: {name}: expected {{layers: positive int}} for layers 1, 2, ..., got {quote(value)}")
    return value


def _flat_int_dict(node: ast.AST) -> dict[int, int] | None:
    """{int: int} of a dict display whose keys and values are int literals; None for anything else."""
    if not isinstance(node, ast.Dict) or not node.keys:
        return None
    items = list(zip(node.keys, node.values))
    if not all(_is_int(k) and _is_int(v) for k, v in items):
        return None
    return {k.value: v.value for k, v in items}


def _is_int(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


def stage_room(stage: Stage, table: EngineTables) -> int:
    """A stage's KV blocks per layer over its machines: what its queries in flight grow with."""
    return stage.width * table.kv_blocks[stage.layers]


def room_queries(room: int, prompt_len: float) -> float:
    """The queries Helix's admission keeps in flight when the fullest stage has this room."""
    return FEED_HWM * BLOCK_TOKENS * room / (prompt_len + EXPECTED_OUTPUT)


def queries_in_flight(stages: list[Stage], tables: dict[str, EngineTables], prompt_len: float) -> float:
    """The queries Helix's admission keeps in flight (module docstring)."""
    return room_queries(min(stage_room(s, tables[s.kind]) for s in stages), prompt_len)


def stage_round_s(stage: Stage, table: EngineTables, queries: float, network: Network) -> float:
    """One stage's share of a round: its machines' batches over its layers, then the hop out."""
    share, limit = queries / stage.width, table.decode_limit[stage.layers]
    full, rest = divmod(share, limit)
    batches = full * table.decode_s(limit) + (table.decode_s(rest) if rest > 0 else 0.0)
    first = 2 * table.decode_s(1)  # the bunch's first request, alone, charged twice
    send = network.latency_s + share * (network.activation_bytes + TOKEN_BYTES) / network.bw_bytes_per_s
    return stage.layers * (batches + first) + send


def estimate(stages: list[Stage], tables: dict[str, EngineTables], prompt_len: float, network: Network) -> Estimate:
    """Decode tokens/s of a layout of `stages` under Helix's engine (module docstring)."""
    queries = queries_in_flight(stages, tables, prompt_len)
    round_s = network.latency_s + sum(stage_round_s(s, tables[s.kind], queries, network) for s in stages)
    return Estimate(tokens_per_s=queries / round_s, queries=queries, round_s=round_s)
