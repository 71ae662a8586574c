"""Plans work from any working directory: `plan` stores its input paths relative to the plan file's folder
(absolute ones outside the plan's folder and its sibling trees as they are), and `verify`, `show`, `launch`
and `measure` read them back against that folder;
the recorded sha256 of each input is still checked."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import SPECS
from plan_files import write_inputs

from llm_planner.cli.main import main
from llm_planner.core.plan import load_plan
from llm_planner.core.plan_paths import relative_to_plan, resolve_from_plan


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """A: where `plan` runs and the inputs live (in a subfolder); B: where the plan is written; C: elsewhere."""
    a, b, c = (tmp_path / name for name in ("A", "B", "C"))
    for folder in (a / "specs", b, c):
        folder.mkdir(parents=True)
    shutil.copy(SPECS / "rtx4090-workstation.yaml", a / "specs" / "c.yaml")
    monkeypatch.chdir(a)
    return a, b, c


def _stored_inputs(plan: Path) -> dict:
    return yaml.safe_load(plan.read_text())["inputs"]


def test_a_plan_made_in_one_folder_into_another_verifies_and_shows_from_a_third(folders, monkeypatch, capsys):
    a, b, c = folders
    assert main(["plan", "--cluster", "specs/c.yaml", "--model", "gpt2", "--no-baselines", "-o", "../B/p.yaml"]) == 0
    assert _stored_inputs(b / "p.yaml")["cluster"] == os.path.join("..", "A", "specs", "c.yaml")
    monkeypatch.chdir(c)
    capsys.readouterr()
    for argv in (["verify", "../B/p.yaml"], ["verify", str(b / "p.yaml")], ["show", "../B/p.yaml"]):
        assert main(argv) == 0, capsys.readouterr()
    assert main(["launch", "../B/p.yaml", "--dry-run"]) == 0, capsys.readouterr()
    assert load_plan(Path("../B/p.yaml")).inputs.cluster == str(a / "specs" / "c.yaml")


def test_a_graph_file_plan_written_beside_its_inputs_moves_with_them(folders, monkeypatch, capsys):
    """Inputs and plan in one folder: the folder can be moved or copied whole and still verifies."""
    a, b, c = folders
    write_inputs(a / "specs")
    argv = ["plan", "--cluster", "specs/c.yaml", "--graph", "specs/g.json", "--batch", "4", "--max-shards", "2"]
    assert main([*argv, "--no-baselines", "-o", "specs/p.yaml"]) == 0
    stored = _stored_inputs(a / "specs" / "p.yaml")
    assert (stored["cluster"], stored["model"]) == ("c.yaml", {"graph": "g.json"})
    shutil.copytree(a / "specs", c / "moved")
    shutil.rmtree(a / "specs")
    monkeypatch.chdir(b)
    capsys.readouterr()
    assert main(["verify", str(c / "moved" / "p.yaml")]) == 0, capsys.readouterr()


def test_absolute_input_paths_outside_the_plans_tree_stay_absolute(folders, monkeypatch, capsys):
    """An absolute input that is neither in the plan's folder nor in a sibling tree (the plan is in
    B/deep, under B; the input under A) is stored as given: the plan moved alone still finds it."""
    a, b, c = folders
    cluster = str(a / "specs" / "c.yaml")
    plan = b / "deep" / "p.yaml"
    plan.parent.mkdir()
    assert main(["plan", "--cluster", cluster, "--model", "gpt2", "--no-baselines", "-o", str(plan)]) == 0
    assert _stored_inputs(plan)["cluster"] == cluster
    shutil.move(plan, c / "p.yaml")  # the plan moves alone; its input is where it was
    monkeypatch.chdir(c)
    capsys.readouterr()
    assert main(["verify", "p.yaml"]) == 0, capsys.readouterr()


@pytest.mark.parametrize("objective", ["latency", "serving"])
def test_absolute_inputs_in_a_sibling_tree_move_with_the_plan(folders, monkeypatch, capsys, objective):
    """The one path rule for both plan kinds: an absolute input in a sibling tree of the plan's folder
    (A/specs beside B) is stored relative, so the plan and its inputs verify once moved together."""
    a, b, c = folders
    argv = ["plan", "--cluster", str(a / "specs" / "c.yaml"), "--model", "gpt2", "-o", str(b / "p.yaml")]
    extra = ["--objective", "serving", "--prompt-len", "64", "--output-len", "16", "--tpot-slo", "10 ms"]
    assert main(argv + (extra if objective == "serving" else ["--no-baselines"])) == 0
    assert _stored_inputs(b / "p.yaml")["cluster"] == "../A/specs/c.yaml"
    shutil.move(c, b / "C")  # keep C out of the way
    moved = a.parent.parent / f"{a.parent.name}-moved"  # the whole tree: the plan and its inputs together
    shutil.move(a.parent, moved)
    monkeypatch.chdir(moved)
    capsys.readouterr()
    assert main(["verify", str(moved / "B" / "p.yaml")]) == 0, capsys.readouterr()


def test_a_model_config_directory_is_stored_relative_to_the_plan(folders, monkeypatch, capsys):
    a, b, c = folders
    (a / "tiny").mkdir()
    config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128}
    (a / "tiny" / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--cluster", "specs/c.yaml", "--model", "tiny", "--no-baselines", "-o", "../B/p.yaml"]) == 0
    assert _stored_inputs(b / "p.yaml")["model"]["name"] == os.path.join("..", "A", "tiny")
    monkeypatch.chdir(c)
    (c / "tiny").mkdir()  # a folder of the same name where verify runs is not the one the plan means
    capsys.readouterr()
    assert main(["verify", "../B/p.yaml"]) == 0, capsys.readouterr()


def test_a_serving_plans_model_config_directory_is_stored_relative_to_the_plan(folders, monkeypatch, capsys):
    """The same rule for a serving plan: its model.name, a config folder, is stored relative to the
    plan's folder, and verify, show, export and launch --dry-run read it from another folder."""
    a, b, c = folders
    (a / "tiny").mkdir()
    config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128}
    (a / "tiny" / "config.json").write_text(json.dumps(config))
    argv = ["plan", "--cluster", "specs/c.yaml", "--model", "tiny", "--objective", "serving", "--no-baselines"]
    argv += ["--prompt-len", "32", "--output-len", "16", "--tpot-slo", "10 ms", "-o", "../B/p.yaml"]
    assert main(argv) == 0
    stored = yaml.safe_load((b / "p.yaml").read_text())["model"]["name"]
    assert stored == os.path.join("..", "A", "tiny")
    monkeypatch.chdir(c)
    (c / "tiny").mkdir()  # a folder of the same name where they run is not the one the plan means
    capsys.readouterr()
    for args in (["verify"], ["show"], ["export", "--to", "vllm", "-o", str(c / "run.sh")]):
        assert main([args[0], "../B/p.yaml", *args[1:]]) == 0, capsys.readouterr()
    assert main(["launch", "../B/p.yaml", "--dry-run", "--workdir", str(c / "w")]) == 0, capsys.readouterr()


def test_the_inputs_hashes_are_still_checked(folders, monkeypatch, capsys):
    a, b, c = folders
    assert main(["plan", "--cluster", "specs/c.yaml", "--model", "gpt2", "--no-baselines", "-o", "../B/p.yaml"]) == 0
    with open(a / "specs" / "c.yaml", "a") as f:
        f.write("\n# edited\n")
    monkeypatch.chdir(c)
    capsys.readouterr()
    assert main(["verify", "../B/p.yaml"]) == 2
    err = capsys.readouterr().err
    assert str(a / "specs" / "c.yaml") in err and "changed since the plan was made" in err


def test_a_plan_moved_away_from_its_inputs_names_where_it_looked(folders, monkeypatch, capsys):
    a, b, c = folders
    assert main(["plan", "--cluster", "specs/c.yaml", "--model", "gpt2", "--no-baselines", "-o", "../B/p.yaml"]) == 0
    (c / "deeper").mkdir()
    shutil.move(b / "p.yaml", c / "deeper" / "p.yaml")
    capsys.readouterr()
    assert main(["verify", str(c / "deeper" / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert str(c / "A" / "specs" / "c.yaml") in err and "Traceback" not in err


@pytest.mark.parametrize("given", ["c.yaml", "specs/c.yaml", "../x/c.yaml", "./a/../c.yaml"])
def test_relative_paths_round_trip_through_a_plan_in_any_folder(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    for plan in ("p.yaml", "B/p.yaml", "../p.yaml", str(tmp_path / "B" / "C" / "p.yaml")):
        stored = relative_to_plan(given, plan)
        assert not os.path.isabs(stored)
        assert resolve_from_plan(stored, plan) == os.path.normpath(os.path.join(tmp_path, given))
    assert relative_to_plan("/abs/c.yaml", "B/p.yaml") == "/abs/c.yaml" == resolve_from_plan("/abs/c.yaml", "B/p.yaml")
    assert relative_to_plan(str(tmp_path / "A" / "c.yaml"), "B/p.yaml") == "../A/c.yaml"  # a sibling tree
    assert relative_to_plan(str(tmp_path / "B" / "in" / "c.yaml"), "B/p.yaml") == "in/c.yaml"  # the plan's folder
    assert relative_to_plan(None, "p.yaml") is None and resolve_from_plan(None, "p.yaml") is None
