"""The plan-helix estimates against Helix's own simulator on every layout simulated so far
(docs/helix.md, "The engine, replayed").

    LLM_PLANNER_HELIX=<checkout> .venv/bin/python benchmarks/bench_helix_replay.py

For each recorded simulation (benchmarks/results/helix*/runs.jsonl, written by bench_helix.py:
one Helix deployment, its decode tokens/s over Helix's 60 s + 600 s window) it computes, at this
commit, the routed estimate (`plan-helix --score`'s steady-state formula, llm_planner.helix.flow)
and the replay (llm_planner.helix.replay, the same window), each on the deployment's own cluster
file, and their ratios to the simulated figure. Helix's simulator is not run here: the simulated
column is the recorded one (each results folder's meta.json names the commit it was recorded at).
Needs a Helix checkout for its cluster files, model folders and request lengths. It runs with
PYTHONHASHSEED=0 (it restarts itself so): a layout whose max flow has several solutions of the same
value (Helix's cluster42 layout) is split by networkx in an order that follows the hash seed, in
Helix's simulator as here, and Helix's runs recorded here pin it to 0. The table is
printed and written, with results.csv and meta.json, to --out (default
benchmarks/results/helix-replay).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import provenance  # benchmarks/provenance.py, beside this script

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PROMPT_LEN = 763.1  # the Azure Conversation trace's mean prompt (used only without Helix's trace)
COLUMNS = ("case", "layout", "simulated", "routed", "routed_ratio", "replayed", "replayed_ratio", "replay_s")
MODELS = {"llama70b": "simulator/model_manager/llama2_70b", "llama30b": "simulator/model_manager/llama1_30b"}


@dataclass(frozen=True)
class Case:
    name: str
    recorded: str  # results folder under benchmarks/results
    layout: str  # the layout as runs.jsonl names it
    cluster: str  # absolute, or inside the Helix checkout
    profiles: str  # machine profiles, inside the Helix checkout
    layout_path: str  # absolute, or inside the Helix checkout
    simulator_cluster: str | None = None  # Helix's own graph for its own layouts
    model: str = "llama70b"


def cases() -> list[Case]:
    single, high, geo = (
        f"artifact_evaluation/{c}/config" for c in ("single_cluster", "high_heterogeneity", "distributed_clusters")
    )
    layouts = "artifact_evaluation/{}/layout_{}/ilp"
    out = [_helix_own("single24 70B", "helix", layouts.format("single_cluster", "llama70b"), f"{single}/cluster24.ini")]
    for name in ("plan-helix-llama2-70b.ini", "plan-helix-llama2-70b-fast-first.ini", "serving-llama2-70b-1s.ini"):
        out.append(
            Case(
                "single24 70B",
                "helix",
                name,
                f"{single}/cluster24.ini",
                f"{single}/machine_profiles.ini",
                str(RESULTS / "helix" / name),
            )
        )
    for gpu in ("a100", "l4", "t4"):
        base = layouts.format("single_cluster", "llama30b") + f"/{gpu}"
        out.append(_helix_own("single24 30B", "helix-cases/single24-30b", base, f"{single}/{gpu}.ini", "llama30b"))
    out += _deployments("single24 30B", "single24-30b", 3, f"{single}/machine_profiles.ini", "llama30b")
    base = layouts.format("high_heterogeneity", "llama70b")
    out.append(_helix_own("cluster42 70B", "helix-cases/cluster42-70b", base, f"{high}/cluster42.ini"))
    out += _deployments("cluster42 70B", "cluster42-70b", 2, f"{high}/machine_profiles.ini")
    base = layouts.format("distributed_clusters", "llama70b")
    out.append(_helix_own("3cluster24 70B", "helix-cases/3cluster24-70b", base, f"{geo}/3cluster24.ini"))
    out.append(
        Case(
            "3cluster24 70B",
            "helix-cases/3cluster24-70b",
            "3cluster24-70b.ini",
            f"{geo}/3cluster24.ini",
            f"{geo}/machine_profiles.ini",
            str(RESULTS / "helix-cases" / "3cluster24-70b.ini"),
        )
    )
    return out


def _helix_own(name: str, recorded: str, folder: str, cluster: str, model: str = "llama70b") -> Case:
    """Helix's own MILP layout in `folder` of its checkout, with its own simulator cluster file."""
    profiles = str(Path(cluster).with_name("machine_profiles.ini"))
    layout = f"{folder}/ilp_sol.ini"
    return Case(name, recorded, layout, cluster, profiles, layout, f"{folder}/simulator_cluster.ini", model)


def _deployments(name: str, stem: str, count: int, profiles: str, model: str = "llama70b") -> list[Case]:
    """plan-helix's deployments <stem>-<k>.ini, each on its own <stem>-<k>.cluster.ini."""
    own = RESULTS / "helix-cases"
    return [
        Case(
            name,
            f"helix-cases/{stem}",
            f"{stem}-{k}.ini",
            str(own / f"{stem}-{k}.cluster.ini"),
            profiles,
            str(own / f"{stem}-{k}.ini"),
            model=model,
        )
        for k in range(count)
    ]


def simulated(case: Case) -> float | None:
    """The recorded decode tokens/s of the case's layout (the first matching run)."""
    path = RESULTS / case.recorded / "runs.jsonl"
    for line in path.read_text().splitlines():
        run = json.loads(line)
        if run["layout"] == case.layout and run.get("online_tokens_per_s") is None:
            return run["decode_tokens_per_s"]
    return None


def estimate(case: Case, checkout: Path) -> tuple[float, float, float]:
    """(routed estimate, replayed, replay seconds) of the case's layout at this commit."""
    from llm_planner.helix.plan import load_inputs, read_checked_layout, score_ranges
    from llm_planner.helix.replayed import replay_layout
    from llm_planner.helix.simulator_file import simulator_hops

    at = lambda p: Path(p) if Path(p).is_absolute() else checkout / p  # noqa: E731
    inputs = load_inputs(at(case.cluster), at(case.profiles), checkout / MODELS[case.model], None)
    hops = simulator_hops(at(case.simulator_cluster)) if case.simulator_cluster else None  # Helix's own graph
    ranges = read_checked_layout(inputs, at(case.layout_path))
    routed = score_ranges(inputs, ranges, str(at(case.layout_path)), PROMPT_LEN, hops)[-1].tokens_per_s
    replayed = replay_layout(inputs, ranges, PROMPT_LEN, hops)
    return routed, replayed.estimate.tokens_per_s, replayed.seconds


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":  # the recorded simulations' seed (module docstring)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(RESULTS / "helix-replay"))
    args = p.parse_args()
    checkout = os.environ.get("LLM_PLANNER_HELIX")
    if not checkout or not (Path(checkout) / "simulator").is_dir():
        sys.exit("LLM_PLANNER_HELIX must name a Helix checkout (docs/helix.md)")
    sys.path.insert(0, str(REPO))
    facts = provenance.start(sys.argv)
    rows = []
    for case in cases():
        sim = simulated(case)
        routed, replayed, seconds = estimate(case, Path(checkout))
        rows.append(
            {
                "case": case.name,
                "layout": _label(case.layout),
                "simulated": f"{sim:.1f}" if sim is not None else "-",
                "routed": f"{routed:.1f}",
                "routed_ratio": f"{routed / sim:.3f}" if sim else "-",
                "replayed": f"{replayed:.1f}",
                "replayed_ratio": f"{replayed / sim:.3f}" if sim else "-",
                "replay_s": f"{seconds:.1f}",
            }
        )
        print(" | ".join(rows[-1].values()), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    facts["command"] = facts["command"].replace(checkout, "$HELIX")
    facts["total_wall_s"] = round(sum(float(r["replay_s"]) for r in rows), 1)
    provenance.write_results(out, COLUMNS, rows, facts)
    print((out / "table.md").read_text())


def _label(layout: str) -> str:
    """A layout's name in the table: ours by file name, Helix's own by its folder."""
    if not layout.startswith("artifact_evaluation/"):
        return layout
    return "Helix's " + "/".join(Path(layout).parts[1:-1])


if __name__ == "__main__":
    main()
