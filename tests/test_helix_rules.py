"""What Helix accepts in a layout (llm_planner.helix.rules), the model's shapes read from Helix's folder
(llm_planner.helix.model_card), and, with a Helix checkout in LLM_PLANNER_HELIX, Helix's own layout
checks (benchmarks/helix_check.py) run on files plan-helix writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_helix_plan import tables, write_tables

from llm_planner.cli.main import main
from llm_planner.helix.engine import load_engine_tables
from llm_planner.helix.inputs import HelixError, load_helix_cluster
from llm_planner.helix.layout_file import LayoutError, helix_layout, read_helix_layout
from llm_planner.helix.model_card import load_model_card
from llm_planner.helix.plan import load_inputs
from llm_planner.helix.rules import check_helix_layout

REPO = Path(__file__).resolve().parents[1]
T4_A, A100, T4_B = "compute_node_2", "compute_node_3", "compute_node_4"  # test_helix's cluster; caps 4, 8, 4


@pytest.mark.parametrize(
    "stages, problem",
    [
        ([(T4_A, 0, 4), (A100, 4, 12)], None),
        ([(T4_A, 0, 4), (T4_B, 0, 4), (A100, 4, 12)], None),  # two machines on one range
        ([(T4_A, 0, 5), (A100, 5, 12)], "compute_node_2 (T4) holds 5 layers (0-4); Helix lets a machine"),
        ([(T4_A, 0, 3), (A100, 3, 12)], "compute_node_3 (A100) holds 9 layers (3-11)"),
        ([(T4_A, 0, 4), (T4_A, 4, 8), (A100, 8, 12)], "already holds layers [0, 4]"),  # one range per machine
        ([(T4_A, 0, 4), ("compute_node_9", 4, 12)], "compute_node_9 is not a machine of"),
        ([(T4_A, 0, 4), (A100, 5, 12)], "no chain of ranges covers layers 0..11"),
    ],
)
def test_check_helix_layout(tmp_path, stages, problem):
    cluster = load_helix_cluster(write_tables(tmp_path))
    if problem is None:
        assert set(check_helix_layout(stages, cluster, tables(tmp_path), 12)) == {s[0] for s in stages}
    else:
        with pytest.raises(LayoutError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            check_helix_layout(stages, cluster, tables(tmp_path), 12)


def test_a_multi_gpu_machine_holds_one_range(tmp_path):
    names = {"t4x2/t4:0": "compute_node_2", "t4x2/t4:1": "compute_node_2"}  # two GPUs of one machine
    cluster = load_helix_cluster(write_tables(tmp_path))
    with pytest.raises(LayoutError, match="one contiguous range"):
        check_helix_layout(
            [("t4x2/t4:0", 0, 4), ("t4x2/t4:1", 4, 8), (A100, 8, 12)], cluster, tables(tmp_path), 12, names
        )


def test_max_num_layers_caps_below_the_tables(tmp_path):
    write_tables(tmp_path)
    source = tmp_path / "llama2_70b" / "a100" / "llama2_70b_a100.py"
    source.write_text("max_num_layers: int = 6\n" + source.read_text())
    assert load_engine_tables(tmp_path / "llama2_70b", "A100").max_layers == 6
    source.write_text("max_num_layers: int = 9\n" + source.read_text().split("\n", 1)[1])
    with pytest.raises(HelixError, match="max_num_layers = 9, but vllm_num_blocks_dict stops at 8"):
        load_engine_tables(tmp_path / "llama2_70b", "A100")


CARD = """\
class MyModelStatistics:
    def __init__(self):
        self.token_size: float = 2 * Byte
        self.activation_size: float = 768 * 2 * Byte
        self.model_param_sizes = [{sizes}] * {layers}
"""


def test_plan_helix_reads_the_model_from_helix_folder(tmp_path, capsys):
    """A folder Helix holds for a model no preset names plans without --model: its <folder>.py gives the shapes."""
    cluster = write_tables(tmp_path)
    folder = tmp_path / "my_model"
    shutil.copytree(tmp_path / "llama2_70b", folder)
    (folder / "my_model.py").write_text(CARD.format(sizes="0.1 * GB", layers=10))
    card = load_model_card(folder)
    assert (card.num_layers, card.activation_bytes, card.token_bytes) == (10, 1536.0, 2.0)
    assert card.layer_param_bytes == (1e8,) * 10
    out = tmp_path / "layout.ini"
    assert main(["plan-helix", "--cluster", str(cluster), "--profiles", str(folder), "-o", str(out)]) == 0
    assert "layers 0..9" not in capsys.readouterr().err
    ranges = check_helix_layout(_read(out), load_helix_cluster(cluster), tables(tmp_path), 10)
    assert max(end for _, end in ranges.values()) == 10


@pytest.mark.parametrize(
    "sizes, layers, problem",
    [
        ("__import__('os')", 10, "expected a positive '<number> \\* <unit>'"),
        ("1 * GB", 0, "repeat count must be an integer"),
        ("-1 * GB", 3, "expected a positive"),
    ],
)
def test_bad_model_card_exit_2(tmp_path, capsys, sizes, layers, problem):
    cluster = write_tables(tmp_path)
    folder = tmp_path / "my_model"
    shutil.copytree(tmp_path / "llama2_70b", folder)
    (folder / "my_model.py").write_text(CARD.format(sizes=sizes, layers=layers))
    assert main(["plan-helix", "--cluster", str(cluster), "--profiles", str(folder), "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "my_model.py: self.model_param_sizes" in err
    assert re.search(problem, err)


def _read(path: Path):
    return read_helix_layout(path.read_text())


# ---------------------------------------------------------------------------------------------------------------
# Helix's own checks, on Helix's published clusters and model folders

HELIX = os.environ.get("LLM_PLANNER_HELIX")
needs_helix = pytest.mark.skipif(
    not HELIX, reason="LLM_PLANNER_HELIX is not set: Helix's own layout checks need a Helix checkout (docs/helix.md)"
)
CASES = {  # (cluster file, model folder, Helix's model name)
    "single24-70b": ("artifact_evaluation/single_cluster/config/cluster24.ini", "llama2_70b", "llama70b"),
    "single24-30b": ("artifact_evaluation/single_cluster/config/cluster24.ini", "llama1_30b", "llama30b"),
    "cluster42-70b": ("artifact_evaluation/ablation/config/cluster42.ini", "llama2_70b", "llama70b"),
    "3cluster24-70b": ("artifact_evaluation/ablation/config/3cluster24.ini", "llama2_70b", "llama70b"),
}


def helix_said(cluster: Path, layout: Path, model: str, machines: Path | None = None) -> tuple[bool, str, dict]:
    """Helix's own checks on a layout (accepted, its HELIX_CHECK line) and its routing capacities on
    the cluster ({type: {layers: tokens/s}}); `machines`: its machine profiles (default: beside the cluster)."""
    machines = machines or cluster.with_name("machine_profiles.ini")
    python = os.environ.get("LLM_PLANNER_HELIX_PYTHON", sys.executable)
    run = subprocess.run(
        [python, str(REPO / "benchmarks" / "helix_check.py"), "--cluster", str(cluster)]
        + ["--machine-profiles", str(machines), "--layout", str(layout)]
        + ["--model", model],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": HELIX, "MPLBACKEND": "Agg"},
        timeout=300,
    )
    said = [line for line in run.stdout.splitlines() if line.startswith("HELIX_CHECK")]
    assert said, f"helix_check.py said nothing: {run.stderr[-2000:]}"
    typical = [line for line in run.stdout.splitlines() if line.startswith("HELIX_TYPICAL ")]
    return run.returncode == 0, said[-1], json.loads(typical[-1].removeprefix("HELIX_TYPICAL ")) if typical else {}


def helix_accepts(cluster: Path, layout: Path, model: str, machines: Path | None = None) -> tuple[bool, str]:
    return helix_said(cluster, layout, model, machines)[:2]


@needs_helix
@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_helix_writes_what_helix_accepts(tmp_path, case):
    cluster_rel, folder, model = CASES[case]
    cluster = Path(HELIX) / cluster_rel
    out = tmp_path / "layout.ini"
    profiles = Path(HELIX) / "simulator" / "model_manager" / folder
    assert main(["plan-helix", "--cluster", str(cluster), "--profiles", str(profiles), "-o", str(out)]) == 0
    # one layout, or one deployment (its own cluster file and layout) per chain
    written = [(cluster, out)] if out.exists() else []
    written += [(p.with_name(p.stem + ".cluster.ini"), p) for p in sorted(tmp_path.glob("layout-?.ini"))]
    assert written
    for cluster_file, layout in written:
        ok, said, typical = helix_said(cluster_file, layout, model, cluster.with_name("machine_profiles.ini"))
        assert ok, f"{layout.name}: {said}"
        # the capacities our routed estimate gives Helix's max flow are Helix's own, on this deployment
        inputs = load_inputs(cluster_file, cluster.with_name("machine_profiles.ini"), profiles, None)
        ours = inputs.rates_for(inputs.cluster)
        for kind, by_layers in typical.items():
            for layers, rate in by_layers.items():
                assert ours.rate(kind.lower(), int(layers)) == pytest.approx(rate, rel=1e-12), (kind, layers)


@needs_helix
def test_helix_refuses_what_the_rules_refuse(tmp_path):
    """Layouts our rules refuse, Helix refuses too; Helix's own MILP layout passes both."""
    cluster = Path(HELIX) / CASES["single24-70b"][0]
    milp = Path(HELIX) / "artifact_evaluation/single_cluster/layout_llama70b/ilp/ilp_sol.ini"
    assert helix_accepts(cluster, milp, "llama70b")[0]
    # ComputeNode-6 is an A100 (cap 12), ComputeNode-1 a T4 (cap 4)
    for stages in ([("ComputeNode-6", 0, 13)], [("ComputeNode-1", 0, 5)]):
        layout = tmp_path / "refused.ini"
        layout.write_text(helix_layout(stages))
        ok, said = helix_accepts(cluster, layout, "llama70b")
        assert not ok and "Bad number of layers on node" in said


@needs_helix
@pytest.mark.parametrize(
    "cluster_rel, layout_rel",
    [
        ("single_cluster/config/cluster24.ini", "single_cluster/layout_llama70b/ilp/ilp_sol.ini"),
        ("distributed_clusters/config/3cluster24.ini", "distributed_clusters/layout_llama70b/ilp/ilp_sol.ini"),
    ],
)
def test_score_takes_helix_own_layouts(capsys, cluster_rel, layout_rel):
    root = Path(HELIX) / "artifact_evaluation"
    profiles = Path(HELIX) / "simulator" / "model_manager" / "llama2_70b"
    args = ["plan-helix", "--cluster", str(root / cluster_rel), "--profiles", str(profiles)]
    assert main([*args, "--score", str(root / layout_rel)]) == 0
    assert "routed by a max flow" in capsys.readouterr().out
