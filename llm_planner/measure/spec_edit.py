"""Set fields of a YAML document in place, keeping its comments, order and layout.

`set_fields(text, {("device_kinds", 0, "overhead_s"): "412 us", ...})` replaces
the value of each field that exists and adds the ones that do not (as a new
line in a block mapping, or `, key: value` before the `}` of a flow mapping).
It works on the positions PyYAML's composer reports, then checks its own work:
the result must load to the original document with exactly these fields
changed; otherwise it raises EditError and the caller can fall back to
re-dumping the document (comments lost).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


class EditError(ValueError):
    """The document could not be edited in place (odd layout); nothing was changed."""


def render(value: Any) -> str:
    """One plain YAML scalar for a number or a simple string ("412 us")."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[: -len("...")].strip() if text.endswith("...") else text


def _child(node: yaml.Node, key: str | int) -> yaml.Node | None:
    if isinstance(key, int):
        if not isinstance(node, yaml.SequenceNode) or key >= len(node.value):
            raise EditError(f"no item {key} here")
        return node.value[key]
    if not isinstance(node, yaml.MappingNode):
        raise EditError(f"{key!r}: the parent is not a mapping")
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _last_leaf(node: yaml.Node) -> yaml.Node:
    """The node that ends a block collection: its last scalar, or its last flow collection."""
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style and node.value:
        node = node.value[-1][1] if isinstance(node, yaml.MappingNode) else node.value[-1]
    return node


def _edit(text: str, root: yaml.Node, path: Path_, value: str) -> tuple[int, int, str]:
    """(start, end, replacement) for one field."""
    node = root
    for key in path[:-1]:
        nxt = _child(node, key)
        if nxt is None:
            raise EditError(f"{'.'.join(map(str, path))}: {key!r} is missing")
        node = nxt
    key = path[-1]
    current = _child(node, key)
    if current is not None:
        if not isinstance(current, yaml.ScalarNode):
            raise EditError(f"{'.'.join(map(str, path))}: not a scalar")
        return current.start_mark.index, current.end_mark.index, value
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise EditError(f"{'.'.join(map(str, path))}: cannot add a key to an empty or non-mapping parent")
    if node.flow_style:
        close = text.rindex("}", node.start_mark.index, node.end_mark.index)
        return close, close, f", {key}: {value}"
    last_key = node.value[-1][0]
    end = _last_leaf(node).end_mark.index
    newline = text.find("\n", end)  # insert after the line where the mapping's last value ends
    end = len(text) if newline < 0 else newline + 1
    prefix = "" if end == 0 or text[end - 1] == "\n" else "\n"
    return end, end, f"{prefix}{' ' * last_key.start_mark.column}{key}: {value}\n"


def _set(data: Any, path: Path_, value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def set_fields(text: str, fields: dict[Path_, Any]) -> str:
    """The document with `fields` (path -> number or plain string) set; EditError if it cannot be done in place."""
    try:
        root = yaml.compose(text)
        expected = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise EditError(f"not valid YAML: {exc}") from None
    if root is None:
        raise EditError("empty document")
    edits = [(*_edit(text, root, path, render(value)), n) for n, (path, value) in enumerate(fields.items())]
    out = text
    for start, end, replacement, _ in sorted(edits, key=lambda e: (e[0], e[3]), reverse=True):
        out = out[:start] + replacement + out[end:]
    expected = copy.deepcopy(expected)
    for path, value in fields.items():
        _set(expected, path, yaml.safe_load(render(value)))
    try:
        ok = yaml.safe_load(out) == expected
    except yaml.YAMLError:
        ok = False
    if not ok:
        raise EditError("the edited document does not read back as expected")
    return out


def dump_with_fields(text: str, fields: dict[Path_, Any]) -> str:
    """Fallback: the document re-dumped with the fields set (comments and layout are lost)."""
    data = yaml.safe_load(text)
    for path, value in fields.items():
        _set(data, path, yaml.safe_load(render(value)))
    return yaml.safe_dump(data, sort_keys=False, width=120)
