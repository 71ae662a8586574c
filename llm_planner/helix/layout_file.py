"""Write a layer placement as the layout file Helix's simulator reads (docs/helix.md).

Helix's layout ("solution") file gives each machine one contiguous range of decoder layers:

    [Settings]
    offset=2

    [Solution]
    compute_node_2=[0, 1, 2, 3]
    compute_node_5=[4, 5, 6]

`compute_node_<i + 2>` is ComputeNode-i of the cluster file (offset 2: Helix's simulator
numbers the coordinator's source and sink 0 and 1). Machines not listed hold nothing. One or
more pipelines are all one layout: a request may go from a machine whose range ends at layer e
to any machine whose range starts at e (Helix's simulator builds those links itself), so two
pipelines that share no boundary stay apart, and ranges that meet join them.

`helix_layout(stages)` takes (name, first_layer, end_layer) triples, end exclusive, where a
name is a Helix name (`compute_node_7`, `ComputeNode-5`) or one of our device names with
`names` mapping it to Helix (llm_planner.helix.inputs.device_helix_names for a spec made by
`llm-planner import helix`). The devices of one multi-GPU machine map to the same machine
and must then hold the same range.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from llm_planner.core.fmt import quote
from llm_planner.helix.inputs import (
    MAX_LAYERS,
    MAX_MACHINES,
    NODE_INDEX_OFFSET,
    bounded_int,
    helix_node_index,
    helix_node_name,
)

_SIMULATOR_NAME = re.compile(r"^compute_node_(\d+)$")
_CLUSTER_NAME = re.compile(r"^ComputeNode-(\d+)$")


class LayoutError(ValueError):
    """Stages that do not make a Helix layout; the message names the stage."""


def helix_name(name: str, names: Mapping[str, str] | None = None) -> str:
    """The simulator's node name for a Helix name or one of our device names (through `names`)."""
    if names is not None and name in names:
        name = names[name]
    try:
        if match := _CLUSTER_NAME.match(name):
            return helix_node_name(bounded_int(match.group(1), 0, MAX_MACHINES - 1))
        if (match := _SIMULATOR_NAME.match(name)) and bounded_int(
            match.group(1), 0, MAX_MACHINES - 1 + NODE_INDEX_OFFSET
        ) >= NODE_INDEX_OFFSET:
            return name
    except ValueError as exc:
        raise LayoutError(f"{quote(name)}: its machine index {exc}") from None
    hint = " (pass `names`, e.g. helix_import.device_helix_names, to map our device names)" if names is None else ""
    raise LayoutError(
        f"{name!r} is not a Helix node name (compute_node_<k>, k >= {NODE_INDEX_OFFSET}, or ComputeNode-<i>){hint}"
    )


def layout_ranges(
    stages: Iterable[tuple[str, int, int]], names: Mapping[str, str] | None = None, num_layers: int | None = None
) -> dict[str, tuple[int, int]]:
    """Helix node name -> (first layer, end layer), checked: non-empty ranges within the model,
    one range per machine, and (with num_layers) a chain of ranges from layer 0 to num_layers."""
    ranges: dict[str, tuple[int, int]] = {}
    for i, (name, first, end) in enumerate(stages):
        node = helix_name(str(name), names)
        if not (isinstance(first, int) and isinstance(end, int) and 0 <= first < end):
            raise LayoutError(f"stage {i} ({name}): layers [{first}, {end}) are not a non-empty range of layer indices")
        if num_layers is not None and end > num_layers:
            raise LayoutError(f"stage {i} ({name}): layers [{first}, {end}) go past the model's {num_layers} layers")
        if ranges.get(node, (first, end)) != (first, end):
            raise LayoutError(
                f"stage {i} ({name}): machine {node} already holds layers {list(ranges[node])}, "
                f"not [{first}, {end}); a Helix machine holds one contiguous range"
            )
        ranges[node] = (first, end)
    if not ranges:
        raise LayoutError("no stages")
    if num_layers is not None:
        reached, frontier = {0}, [0]
        while frontier:
            start = frontier.pop()
            for first, end in ranges.values():
                if first == start and end not in reached:
                    reached.add(end)
                    frontier.append(end)
        if num_layers not in reached:
            raise LayoutError(
                f"no chain of ranges covers layers 0..{num_layers - 1} "
                f"(a range must start where the previous one ends); reached {sorted(reached)}"
            )
    return ranges


def helix_layout(
    stages: Iterable[tuple[str, int, int]], names: Mapping[str, str] | None = None, num_layers: int | None = None
) -> str:
    """Helix's layout file text for `stages` (see the module docstring)."""
    ranges = layout_ranges(stages, names, num_layers)
    lines = ["[Settings]", f"offset={NODE_INDEX_OFFSET}", "", "[Solution]"]
    for node in sorted(ranges, key=helix_node_index):
        first, end = ranges[node]
        lines.append(f"{node}={list(range(first, end))}")
    return "\n".join(lines) + "\n"


_LAYER_LIST = re.compile(r"^\[\s*(?:-?\d+(?:\s*,\s*-?\d+)*)?\s*\]$", re.ASCII)


def read_helix_layout(text: str, source: str = "<layout>") -> dict[str, tuple[int, int]]:
    """Helix node name -> (first layer, end layer) of a layout file's text; LayoutError naming `source`
    and the line for anything but sections, `key=value` lines of them and comments."""
    section, ranges = None, {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            section = line.strip("[]").strip()
            continue
        where = f"{source}: line {number}"
        if "=" not in line:
            raise LayoutError(f"{where}: {quote(line)} is neither a [section] nor a key=value line")
        key, value = (part.strip() for part in line.split("=", 1))
        if section == "Settings" and key == "offset" and value != str(NODE_INDEX_OFFSET):
            raise LayoutError(
                f"{where}: [Settings] offset: {quote(value)}; the layouts read here use {NODE_INDEX_OFFSET}"
            )
        if section != "Solution":
            continue
        name, span = _solution_line(key, value, where)
        if name in ranges:
            raise LayoutError(f"{where}: [Solution] {quote(key)} is given twice")
        if span is not None:  # a machine listed with no layers holds nothing
            ranges[name] = span
    if not ranges:
        raise LayoutError(f"{source}: [Solution]: no machine holds any layer")
    return ranges


def _solution_line(key: str, value: str, where: str) -> tuple[str, tuple[int, int] | None]:
    """The machine a [Solution] line names and its (first, end) layers (None: none)."""
    try:
        name = helix_name(key)
    except LayoutError as exc:
        raise LayoutError(f"{where}: [Solution]: {exc}") from None
    if not _LAYER_LIST.match(value):
        raise LayoutError(
            f"{where}: [Solution] {quote(key)}: {quote(value)} is not a list of layer indices [i, j, ...]"
        )
    try:
        layers = [bounded_int(x, 0, MAX_LAYERS - 1) for x in re.findall(r"-?\d+", value, re.ASCII)]
    except ValueError as exc:
        raise LayoutError(f"{where}: [Solution] {quote(key)}: a layer index {exc}") from None
    if not layers:
        return name, None
    if layers != list(range(layers[0], layers[0] + len(layers))):
        raise LayoutError(f"{where}: [Solution] {key}: layers {value} are not a contiguous ascending range")
    return name, (layers[0], layers[-1] + 1)
