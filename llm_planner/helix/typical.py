"""The machine capacities Helix's scheduler routes by: its "typical" token throughput per
machine type and number of layers held (docs/helix.md, "Routing").

Helix's max-flow scheduler gives each machine of a layout the capacity its model statistics
class computes (`model_manager/<model>/<model>.py` with `helper.py`), not the machine's rate at
its batch limit. With L the model's layers, n_m the cluster's machines of type m (all of them,
used or not), and the class's dict literals `typical_layers_dict` (a first guess of the layers
each type holds, replaced by the second such dict, the types' caps, when the cluster holds fewer
than 1.2 L layers at the first guess) and `normalized_perf_dict` (a first guess of each type's
layer rate), it iterates ten times

    perf_m <- typical(m, typical_layers_m) x typical_layers_m

and a machine of type m holding l layers gets typical(m, l), where, with t_m = 1 / perf_m and
t_avg the mean of t over the cluster's layers at the typical counts,

    ratio   = l t_m / ((L - l) t_avg + l t_m)            its share of a request's round trip
    E       = int(0.3 x 16 x blocks(l))                  KV entries per layer it plans to use
    r       = E / 990 x ratio / 240,  P = round(750 r),  D = round(E / 990 x ratio)
              (r > 1: r, P, D = 1, 750, 240)
    typical = (P + D) / (l (prompt(P) + decode(D)))                     when r >= 1, else
              (P + D) / r  /  (l (prompt(int(P / r)) + decode(D) / r))

with prompt() and decode() the type's per-layer profiles, linear between their rows (750, 240
and 990 = 750 + 240 are Helix's AVG_INPUT_LEN and AVG_OUTPUT_LEN, 0.3 its KV_CACHE_HWM, 16 its
vLLM block size). `load_typical_guesses` reads the two dicts from the class's syntax tree, never
running it; a folder whose file lacks them has no typical rates (the flow then uses the
machine's rate at its batch limit, llm_planner.helix.flow).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.engine import BLOCK_TOKENS, EngineTables
from llm_planner.helix.inputs import HelixError, read_profile_csv
from llm_planner.helix.model_card import parse_card

AVG_INPUT = 750  # Helix's AVG_INPUT_LEN
AVG_OUTPUT = 240  # Helix's AVG_OUTPUT_LEN
PLANNED_KV_SHARE = 0.3  # Helix's KV_CACHE_HWM in the typical statistics
SPARE_COPIES = 1.2  # the first guess of layers stands when the cluster holds this many copies of the model
ITERATIONS = 10
_GUESSES = ("typical_layers_dict", "normalized_perf_dict")


@dataclass(frozen=True, kw_only=True)
class TypicalGuesses:
    """The statistics class's first guesses, by Helix's machine type name ("A100")."""

    layers: dict[str, int]
    cap_layers: dict[str, int]  # used when the cluster is short of layers at `layers`
    perf: dict[str, float]
    source: str = "the model's statistics class"  # the file they were read from


def load_typical_guesses(card_path: str | Path) -> TypicalGuesses | None:
    """The dicts of a model's statistics class (module docstring), in the file's order; None when
    the file or the dicts are absent (a hand-made folder); HelixError naming the file and the dict
    when they are there but not Helix's shape."""
    path = Path(card_path)
    tree = parse_card(path)
    if tree is None:
        return None
    found: dict[str, list[dict]] = {name: [] for name in _GUESSES}
    assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1]
    for node in sorted(assigned, key=lambda n: (n.lineno, n.col_offset)):  # source order
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in found and isinstance(node.value, ast.Dict):
            found[target.id].append(_str_number_dict(path, target.id, node))
    layers, perf = found["typical_layers_dict"], found["normalized_perf_dict"]
    if not layers and not perf:
        return None
    if len(layers) != 2 or len(perf) != 1:
        raise HelixError(
            f"{path}: expected typical_layers_dict assigned as a dict literal twice (the first guess, then the "
            f"types' caps) and normalized_perf_dict once, found {len(layers)} and {len(perf)}"
        )
    for d in layers:
        if not all(type(v) is int for v in d.values()):
            raise HelixError(f"{path}: typical_layers_dict: layers must be integers, got {d}")
    perf_values = {k: float(v) for k, v in perf[0].items()}
    return TypicalGuesses(layers=layers[0], cap_layers=layers[1], perf=perf_values, source=str(path))


def _str_number_dict(path: Path, name: str, node: ast.Assign) -> dict:
    """{machine type: positive number} of a dict display of literals; HelixError naming the dict otherwise."""
    out = {}
    for key, value in zip(node.value.keys, node.value.values):
        good_key = isinstance(key, ast.Constant) and isinstance(key.value, str)
        good_value = isinstance(value, ast.Constant) and type(value.value) in (int, float) and 0 < value.value < 1e12
        if not (good_key and good_value):
            raise HelixError(
                f"{path}: {name} (line {node.lineno}): expected {{machine type: positive number}} written as literals"
            )
        out[key.value] = value.value
    if not out:
        raise HelixError(f"{path}: {name} (line {node.lineno}): empty")
    return out


def load_prompt_table(folder: str | Path, machine_type: str) -> LayerTable:
    """A type's per-layer prompt profile (tokens -> seconds)."""
    rows = read_profile_csv(Path(folder) / machine_type.lower() / "prompt_bs2time.csv")
    return LayerTable(sizes=tuple(b for b, _ in rows), seconds=tuple(s for _, s in rows))


@dataclass(frozen=True, kw_only=True)
class TypicalRates:
    """Helix's typical token throughput of every (type, layers) for one cluster's machine counts."""

    rates: dict[tuple[str, int], float]  # (tables name, layers) -> tokens/s

    def rate(self, kind: str, layers: int) -> float:
        return self.rates[(kind, layers)]


def typical_rates(
    guesses: TypicalGuesses,
    counts: dict[str, int],
    tables: dict[str, EngineTables],
    prompts: dict[str, LayerTable],
    num_layers: int,
) -> TypicalRates:
    """Typical throughputs for a cluster of `counts` machines per Helix type name (module docstring)."""
    missing = [m for m in counts if m not in guesses.layers or m not in guesses.cap_layers or m not in guesses.perf]
    if missing:
        raise HelixError(
            f"{guesses.source}: typical_layers_dict and normalized_perf_dict have no entry for machine types "
            f"{missing} of the cluster (Helix's routing needs one for every type it runs)"
        )
    held = sum(n * guesses.layers[m] for m, n in counts.items())
    typical = {m: (guesses.layers if held >= SPARE_COPIES * num_layers else guesses.cap_layers)[m] for m in counts}
    perf = {m: guesses.perf[m] for m in counts}
    for _ in range(ITERATIONS):
        perf = {
            m: _typical(m, typical[m], perf, typical, counts, tables, prompts, num_layers) * typical[m] for m in counts
        }
    rates = {
        (m.lower(), layers): _typical(m, layers, perf, typical, counts, tables, prompts, num_layers)
        for m in counts
        for layers in range(1, tables[m.lower()].max_layers + 1)
    }
    return TypicalRates(rates=rates)


def _typical(m, layers, perf, typical, counts, tables, prompts, num_layers) -> float:
    """Helix's typical throughput of a type-m machine holding `layers` layers."""
    t = {k: 1 / p for k, p in perf.items()}
    held = sum(counts[k] * typical[k] for k in counts)
    avg = sum(counts[k] * typical[k] * t[k] for k in counts) / held
    ratio = layers * t[m] / ((num_layers - layers) * avg + layers * t[m])
    table, prompt = tables[m.lower()], prompts[m.lower()]
    entries = int(PLANNED_KV_SHARE * (BLOCK_TOKENS * table.kv_blocks[layers] * layers) / layers)  # as Helix rounds
    seq = AVG_INPUT + AVG_OUTPUT
    requests = entries / seq * ratio / AVG_OUTPUT
    p_tokens, d_tokens = round(requests * AVG_INPUT), round(entries / seq * ratio)
    if requests >= 1:
        p_tokens, d_tokens = (AVG_INPUT, AVG_OUTPUT) if requests > 1 else (p_tokens, d_tokens)
        return (p_tokens + d_tokens) / (layers * (prompt.at(p_tokens) + table.decode.at(d_tokens)))
    scale = 1 / requests
    total = scale * (p_tokens + d_tokens)
    seconds = layers * (prompt.at(int(p_tokens * scale)) + table.decode.at(d_tokens) * scale)
    if seconds <= 0:  # Helix's own formula divides by zero here
        raise HelixError(
            f"{m} with {layers} layers: Helix's typical throughput is undefined (its statistics plan no prompt or "
            "decode tokens for it, or its profiles give them no time)"
        )
    return total / seconds
