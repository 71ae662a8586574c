"""The command line end to end: plan -> verify -> show, for GPT-3 175B and ResNet-18 with every
baseline (and MILP-SPLIT for GPT-2 Large; GPT-2 XL, GPT-3 and ResNet-50 under `slow`); clear errors with
exit code 2 for bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.placement.solve import BASELINES

GPT3 = ["--cluster", "cluster_specs/gpt3-six-servers.yaml", "--model", "gpt3-175b", "--batch", "8"]
# a decoder on a cluster with tensor-parallel groups of up to 8, whose plan and verify take seconds (GPT-3
# 175B's each derive a bound of about 15 s on an idle 2-core machine, twice that with a second job beside)
GPT2XL = ["--cluster", "cluster_specs/dgx-a100-l4.yaml", "--model", "gpt2-xl", "--batch", "8"]
# MILP-SPLIT of GPT-2 Large on the same cluster: its plan runs tensor-parallel pairs (GPT-2 XL's, 8 single
# GPUs) and takes 7 s to GPT-2 XL's 12 to 20 on 2 cores
GPT2L = ["--cluster", "cluster_specs/dgx-a100-l4.yaml", "--model", "gpt2-large", "--batch", "8"]
# a CNN through fx on a CPU and two GPUs: ResNet-18 in the default suite (plan and verify each derive its bound
# in about 0.5 s on 2 cores), ResNet-50 under `slow` (about 4 s each)
RESNET = ["--cluster", "cluster_specs/cpu-two-gpus.yaml", "--model", "resnet18", "--batch", "4"]
RESNET50 = ["--cluster", "cluster_specs/cpu-two-gpus.yaml", "--model", "resnet50", "--batch", "4"]


@pytest.fixture(autouse=True)
def _at_repo(repo, monkeypatch):
    monkeypatch.chdir(repo)


# Every baseline on ResNet-18 in the default suite; the tensor-parallel ones (megatron, tp-replicas) on
# GPT-2 XL under `heavy` (8-9 s each: CI's test command runs them after the default suite); every baseline
# on GPT-3 175B (30 to 80 s each on 2 cores: plan and verify each derive its bound) and on ResNet-50 under
# `slow`.
SLOW_MODELS = ("gpt3-175b", "resnet50")
HEAVY_MODELS = ("gpt2-xl",)
BASELINE_CASES = [
    pytest.param(
        model_args,
        solver,
        id=f"{solver}-{name}",
        marks=[pytest.mark.slow] if name in SLOW_MODELS else [pytest.mark.heavy] if name in HEAVY_MODELS else [],
    )
    for solver in BASELINES
    for model_args, name in ((GPT3, "gpt3-175b"), (RESNET, "resnet18"), (RESNET50, "resnet50"), (GPT2XL, "gpt2-xl"))
    if name != "gpt2-xl" or solver in ("megatron", "tp-replicas")
]


@pytest.mark.parametrize("model_args, solver", BASELINE_CASES)
def test_baseline_plans_verify(model_args, solver, tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["plan", *model_args, "--solver", solver, "--no-baselines", "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    for key in ("objective_s", "lower_bound_s", "gap", "assignment"):
        assert key in data
    assert data["lower_bound_s"] <= data["objective_s"] * (1 + 1e-9)
    assert main(["verify", str(out)]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.parametrize(
    "model_args",
    [
        pytest.param(GPT2L, id="gpt2-large"),
        pytest.param(GPT2XL, id="gpt2-xl", marks=pytest.mark.slow),
        pytest.param(GPT3, id="gpt3-175b", marks=pytest.mark.slow),
    ],
)
@pytest.mark.heavy
def test_milp_split_plan_verifies_and_shows(model_args, tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["plan", *model_args, "--solver", "milp-split", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "milp-split" in printed and "baseline:heft" in printed
    assert main(["verify", str(out)]) == 0
    gantt = tmp_path / "gantt.png"
    assert main(["show", str(out), "--gantt", str(gantt)]) == 0
    assert gantt.stat().st_size > 1000
    shown = capsys.readouterr().out
    assert "memory per device" in shown and "of usable" in shown and "degree" in shown


def test_plan_written_to_a_json_path_is_json_and_reads_back(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", *RESNET, "--solver", "heft", "--no-baselines", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["format"] == "llm_planner.core.plan" and data["lower_bound_s"] <= data["objective_s"] * (1 + 1e-9)
    assert main(["verify", str(out)]) == 0
    assert main(["show", str(out)]) == 0


@pytest.mark.heavy
def test_tampered_plan_is_rejected(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["plan", *GPT2XL, "--solver", "heft", "--no-baselines", "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    data["objective_s"] *= 0.5
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["verify", str(out)]) == 2  # the file contradicts itself: its gap says otherwise
    assert "plan.yaml: gap: the file says" in capsys.readouterr().err.replace("\n", "")
    data["gap"] = max(0.0, (data["objective_s"] - data["lower_bound_s"]) / data["objective_s"])
    data["throughput_samples_per_s"] = data["batch_size"] / data["objective_s"]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["verify", str(out)]) == 1  # consistent with itself, not with the simulation
    assert "objective" in capsys.readouterr().out


def test_model_that_does_not_fit_names_the_shortfall(capsys):
    code = main(
        [
            "plan",
            "--cluster",
            "cluster_specs/cpu-two-gpus.yaml",
            "--model",
            "gpt3-175b",
            "--solver",
            "milp-split",
            "-o",
            "/dev/null",
        ]
    )
    assert code == 2  # bad input: no placement can fit, found before solving
    err = capsys.readouterr().err
    assert "short by" in err and "GB" in err and "cpu-two-gpus.yaml" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--cluster", "cluster_specs/nope.yaml", "--model", "gpt2"], "nope.yaml: cannot read"),
        (["plan", "--cluster", "cluster_specs/cpu-two-gpus.yaml", "--model", "gpt9"], "unknown model 'gpt9'"),
        (
            ["plan", "--cluster", "cluster_specs/cpu-two-gpus.yaml", "--model", "gpt2", "--batch", "0"],
            "argument --batch: must be a whole number from 1 to",
        ),
        (
            ["plan", "--cluster", "cluster_specs/cpu-two-gpus.yaml", "--model", "gpt2", "--time-limit", "-1"],
            "argument --time-limit: must be a finite number of seconds above 0",
        ),
        (["verify", "cluster_specs/cpu-two-gpus.yaml"], "not a plan file"),
        (["plan", "--model", "gpt2"], "--cluster is required"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_models_lists_presets(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("gpt3-175b", "llama2-70b", "opt-66b", "resnet50", "rwnn-ws-3x32"):
        assert name in out


def test_compare_symmetry_writes_table_csv_and_chart(tmp_path, capsys):
    import csv

    # the CLI's plumbing (the criteria themselves are tested against brute force in test_symmetry.py)
    args = [
        "compare-symmetry",
        "--cluster",
        "cluster_specs/cpu-two-gpus.yaml",
        "--model",
        "gpt3-125m",
        "--max-shards",
        "1",
        "--time-limit",
        "30",
        "--criteria",
        "none,first,solver",
        "--out-dir",
        str(tmp_path),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "symmetry breaking" in out and "first" in out
    with open(tmp_path / "symmetry.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["criterion"], r["solver"]) for r in rows] == [
        (c, s) for s in ("milp", "milp-split") for c in ("none", "first", "solver")
    ]
    exact = [float(r["objective_s"]) for r in rows if r["solver"] == "milp" and r["status"] == "optimal"]
    assert exact and max(exact) == pytest.approx(min(exact), rel=1e-3)  # every criterion keeps the optimum
    assert (tmp_path / "symmetry.png").stat().st_size > 0


def test_compare_symmetry_rejects_an_unknown_criterion(capsys):
    code = main(
        ["compare-symmetry", "--cluster", "cluster_specs/four-gpus.yaml", "--model", "gpt2", "--criteria", "none,speed"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--criteria" in err and "speed" in err


def test_every_argument_of_every_command_says_what_it_is():
    import argparse

    from llm_planner.cli.main import _build_parser

    parser = _build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = [
        f"{name} {action.dest}"
        for name, sub in commands.items()
        for action in sub._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert not missing, missing


def test_show_of_a_throughput_plan_gives_each_devices_load_whose_largest_is_the_plans(tmp_path):
    """`compute` is a device's task time in one batch; a throughput plan adds its load per batch (compute and
    the transfers it sends and receives), and the busiest device's is the plan's max_load_s."""
    from llm_planner.core.plan import load_plan
    from llm_planner.core.units import parse_seconds
    from llm_planner.placement.inputs import problem_from_plan_inputs
    from llm_planner.placement.views import device_table

    out = tmp_path / "plan.yaml"
    assert (
        main(["plan", *RESNET, "--objective", "throughput", "--solver", "heft", "--no-baselines", "-o", str(out)]) == 0
    )
    plan = load_plan(out)
    table = device_table(plan, problem_from_plan_inputs(plan.inputs))
    heads = [c.header for c in table.columns]
    assert heads[3:5] == ["compute", "load per batch"]
    loads, computes = ([parse_seconds(cell.replace(",", "")) for cell in table.columns[col]._cells] for col in (4, 3))
    assert all(load >= compute * (1 - 1e-3) for load, compute in zip(loads, computes))
    assert max(loads) == pytest.approx(plan.max_load_s, rel=2e-3)
