"""What Helix accepts in a layout file, in one place (docs/helix.md, "What Helix accepts").

Helix's loader (`simulator/initial_layout/load_existing_layout.py`) and its model
(`model_manager/<model>/<type>/<model>_<type>.py: get_inference_settings`) refuse a layout where

1. a machine is not one of the cluster file's (`compute_node_<i + 2>`, i < total_compute_nodes);
2. a machine holds anything but one contiguous, ascending range of layers (the file has one
   `compute_node_k=[...]` per machine, so a multi-GPU machine holds one range: its GPUs are one
   tensor-parallel machine to Helix, never two stages);
3. a machine holds more layers than its type's `max_num_layers` (12 for an A100 on LLaMA-2 70B,
   4 for a T4), or a range that goes past the model's layers;
and its simulator finds no route unless some chain of ranges, each starting where the previous
ends, covers the model. `stage_fits` is rule 3 for one machine: the search (llm_planner.helix.search)
builds only stages it accepts; `check_helix_layout` applies all of them to a finished layout, and
plan-helix, `--score` and `export --to helix` call it before writing or scoring anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llm_planner.helix.engine import EngineTables
from llm_planner.helix.inputs import HelixCluster, helix_node_index, helix_node_name
from llm_planner.helix.layout_file import LayoutError, layout_ranges


def stage_fits(table: EngineTables, layers: int) -> bool:
    """Whether Helix lets a machine of `table`'s type hold `layers` layers (rule 3)."""
    return 1 <= layers <= table.max_layers


def machine_types(cluster: HelixCluster) -> dict[str, str]:
    """Helix node name -> its machine type's tables name (lower case), for every machine of `cluster`."""
    return {helix_node_name(i): name.lower() for i, name in enumerate(cluster.node_types)}


def check_helix_layout(
    stages: Iterable[tuple[str, int, int]] | Mapping[str, tuple[int, int]],
    cluster: HelixCluster,
    tables: Mapping[str, EngineTables],
    num_layers: int,
    names: Mapping[str, str] | None = None,
) -> dict[str, tuple[int, int]]:
    """Helix node name -> (first, end) of a layout Helix accepts; LayoutError naming the machine
    and the rule otherwise. `stages` are (name, first, end) triples (names through `names`, see
    llm_planner.helix.layout_file) or a layout already read (node -> range)."""
    triples = [(n, a, b) for n, (a, b) in stages.items()] if isinstance(stages, Mapping) else stages
    ranges = layout_ranges(triples, names, num_layers)  # rules 2 and the chain
    kinds = machine_types(cluster)
    for node, (first, end) in sorted(ranges.items(), key=lambda item: helix_node_index(item[0])):
        if node not in kinds:
            raise LayoutError(f"{node} is not a machine of {cluster.source} ({len(kinds)} machines)")
        table, kind = tables.get(kinds[node]), cluster.node_types[helix_node_index(node)]
        if table is None:
            raise LayoutError(f"{node}: no tables for its machine type {kind}")
        if not stage_fits(table, end - first):
            raise LayoutError(
                f"{node} ({kind}) holds {end - first} layers ({first}-{end - 1}); "
                f"Helix lets a machine of its type hold at most {table.max_layers} (max_num_layers)"
            )
    return ranges
