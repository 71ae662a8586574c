"""A model's shapes as Helix's model manager folder states them (docs/helix.md).

Helix's folder for a model (`simulator/model_manager/llama1_30b/`) holds, beside one folder per
machine type, `<folder>.py`: the model's statistics class, which sets

    self.token_size: float = 2 * Byte
    self.activation_size: float = 6656 * 2 * Byte
    self.model_param_sizes = [1 * GB] * 60

(a token id and a token's hidden state on the wire, and each decoder layer's parameter bytes;
the list's length is the number of layers). `load_model_card` reads those three assignments
from the file's syntax tree, never running it: each value may only be numbers and Helix's unit
names joined by `*`, and the list a display of such values or one value repeated by `* N`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from llm_planner.core.fileio import read_text
from llm_planner.helix.inputs import HELIX_UNITS, MAX_LAYERS, HelixError

_FIELDS = ("token_size", "activation_size", "model_param_sizes")


@dataclass(frozen=True, kw_only=True)
class ModelCard:
    source: str  # the file read
    num_layers: int
    token_bytes: float
    activation_bytes: float  # one token's hidden state between machines
    layer_param_bytes: tuple[float, ...]  # by layer


def model_card_path(folder: str | Path) -> Path:
    """Where Helix keeps a model folder's statistics: `<folder>/<folder name>.py`."""
    return Path(folder) / f"{Path(folder).name}.py"


def parse_card(path: str | Path) -> ast.Module | None:
    """The syntax tree of a statistics class file (never run); None when there is no such file,
    HelixError naming it when it is not valid Python."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return ast.parse(read_text(path, HelixError), filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise HelixError(f"{path}: not valid Python: {getattr(exc, 'msg', type(exc).__name__)}") from None


def load_model_card(folder: str | Path) -> ModelCard | None:
    """The model's shapes from its Helix folder; None when the folder has no `<folder name>.py`."""
    path = model_card_path(folder)
    tree = parse_card(path)
    if tree is None:
        return None
    found: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        target, value = _self_assignment(node)
        if target in _FIELDS:
            if target in found:
                raise HelixError(f"{path}: self.{target}: assigned more than once (line {node.lineno})")
            found[target] = value
    missing = [f"self.{name}" for name in _FIELDS if name not in found]
    if missing:
        raise HelixError(f"{path}: {', '.join(missing)}: missing (the model's statistics Helix's loader reads)")
    params = _sizes(path, found["model_param_sizes"])
    return ModelCard(
        source=str(path),
        num_layers=len(params),
        token_bytes=_positive(path, "token_size", found["token_size"]),
        activation_bytes=_positive(path, "activation_size", found["activation_size"]),
        layer_param_bytes=params,
    )


def _self_assignment(node: ast.AST) -> tuple[str | None, ast.AST | None]:
    """(attribute, value) of `self.x = v` or `self.x: T = v`; (None, None) for anything else."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None, None
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr, value
    return None, None


def _product(node: ast.AST) -> float | None:
    """The value of `number [* number or unit name]...`; None for any other expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in HELIX_UNITS:
        return HELIX_UNITS[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _product(node.left), _product(node.right)
        return None if left is None or right is None else left * right
    return None


def _positive(path: Path, name: str, node: ast.AST) -> float:
    value = _product(node)
    if value is None or not 0 < value < 1e15:
        raise HelixError(
            f"{path}: self.{name} (line {node.lineno}): expected a positive '<number> * <unit>' "
            f"(units: {', '.join(HELIX_UNITS)})"
        )
    return value


def _sizes(path: Path, node: ast.AST) -> tuple[float, ...]:
    """`[a, b, ...]` or `[a] * n` of layer sizes."""
    count = 1
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.left, ast.List):
        repeat = node.right
        if not (isinstance(repeat, ast.Constant) and type(repeat.value) is int and 1 <= repeat.value <= MAX_LAYERS):
            raise HelixError(
                f"{path}: self.model_param_sizes (line {node.lineno}): the repeat count must be an integer "
                f"in 1..{MAX_LAYERS:,}"
            )
        node, count = node.left, repeat.value
    if not isinstance(node, ast.List) or not node.elts or len(node.elts) * count > MAX_LAYERS:
        raise HelixError(
            f"{path}: self.model_param_sizes (line {node.lineno}): expected a list of layer sizes "
            f"([<size>, ...] or [<size>] * <layers>, at most {MAX_LAYERS:,} layers)"
        )
    return tuple(_positive(path, "model_param_sizes", e) for e in node.elts) * count
