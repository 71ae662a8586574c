"""Run Helix's own layout checks on a layout file; used by tests/test_helix_rules.py.

Runs under a Python that can import a Helix checkout (the checkout on PYTHONPATH; it needs
networkx and an importable gurobipy, as Helix's simulator does); it does not import llm_planner.
It does what Helix does before simulating a layout: `LoadExistingLayout.from_ini` reads the
cluster file and machine profiles, `load_solution` reads the layout (offset, contiguous ranges),
and the model manager builds each used machine's inference settings for the layers it holds
(`get_inference_settings`, which refuses more than the type's `max_num_layers`).

Prints `HELIX_CHECK ok <machines>` and exits 0 when Helix accepts the layout, `HELIX_CHECK
refused <why>` and exits 1 when one of its checks fails. Before that, `HELIX_TYPICAL {json}`: the
capacity Helix's max flow gives each machine type for each number of layers it may hold, on this
cluster ({type: {layers: tokens/s}}, its `get_typical_token_throughput`).
"""

from __future__ import annotations

import argparse
import configparser
import json
import sys

MODELS = {"llama70b": "LLaMa70B", "llama30b": "LLaMa30B"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--machine-profiles", required=True)
    p.add_argument("--layout", required=True)
    p.add_argument("--model", choices=sorted(MODELS), default="llama70b")
    args = p.parse_args()
    from simulator.initial_layout.load_existing_layout import LoadExistingLayout
    from simulator.model_manager.model_manager import ModelManager, ModelName

    parser = configparser.ConfigParser()
    parser.read(args.cluster)
    num = int(parser["NodeNames"]["total_compute_nodes"])
    types = [parser[f"ComputeNode-{i}"]["type"] for i in range(num)]
    manager = ModelManager(getattr(ModelName, MODELS[args.model]), {t: types.count(t) for t in sorted(set(types))})
    typical = {
        t: {n: manager.get_typical_token_throughput(t, n) for n in range(1, manager.get_max_num_layers(t) + 1)}
        for t in sorted(set(types))
    }
    print("HELIX_TYPICAL " + json.dumps(typical))
    layout = LoadExistingLayout(manager)
    try:
        layout.from_ini(args.cluster, args.machine_profiles)
        layout.load_solution(args.layout)
        for index in layout.nodes_in_use:
            node = layout.nodes[index]
            manager.get_inference_settings(node.machine_type.type_name, node.end_layer_idx - node.start_layer_idx)
    except (AssertionError, KeyError, configparser.Error) as exc:
        print(f"HELIX_CHECK refused {type(exc).__name__}: {exc}")
        return 1
    print(f"HELIX_CHECK ok {len(layout.nodes_in_use)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
