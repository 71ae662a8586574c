"""Plan files as an audit of verify, show, export and plan found them: a FIFO given as a plan refused
before anything blocks; an output path that names one of the command's inputs refused before the
input is destroyed; a serving plan without replicas refused naming the field; a serving plan read as
one however its text is laid out (indented JSON, long comments); `-o plan.json` written as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from test_cli_flags import SERVING, SHAPE, WORKSTATION, refused

from llm_planner.cli.main import main


@pytest.fixture(scope="module")
def plan_yaml(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plans") / "plan.yaml"
    assert main([*SERVING, *SHAPE, "--tpot-slo", "50 ms", "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("command", [["verify"], ["show"], ["export", "--to", "vllm"], ["launch", "--dry-run"]])
def test_a_fifo_as_the_plan_is_refused_without_blocking(tmp_path, capsys, command):
    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)
    argv = [command[0], str(fifo), *command[1:]]
    if command[0] == "export":
        argv += ["-o", str(tmp_path / "serve.sh")]
    refused(argv, capsys, "plan.yaml", "not a regular file (a FIFO)")


def test_plan_will_not_write_over_its_cluster_or_workload(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(Path(WORKSTATION).read_text())
    before = cluster.read_text()
    argv = [a if a != WORKSTATION else str(cluster) for a in SERVING]
    refused([*argv, *SHAPE, "--tpot-slo", "50 ms", "-o", str(cluster)], capsys, "is the input --cluster")
    assert cluster.read_text() == before
    workload = tmp_path / "wl.yaml"
    workload.write_text(yaml.safe_dump({"requests": [{"prompt_len": 128, "output_len": 64}]}))
    refused([*SERVING, "--workload", str(workload), "--tpot-slo", "50 ms", "-o", str(workload)], capsys, "--workload")


def test_export_will_not_write_over_the_plan_or_its_cluster(plan_yaml, capsys):
    before = plan_yaml.read_text()
    refused(["export", str(plan_yaml), "--to", "vllm", "-o", str(plan_yaml)], capsys, "is the input plan")
    assert plan_yaml.read_text() == before
    refused(["export", str(plan_yaml), "--to", "vllm", "-o", WORKSTATION], capsys, "is the input inputs.cluster")


def test_a_serving_plan_without_replicas_is_refused_naming_the_field(plan_yaml, tmp_path, capsys):
    data = yaml.safe_load(plan_yaml.read_text())
    data["serving"]["replicas"] = []
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump(data, sort_keys=False))
    for argv in (["verify", str(empty)], ["show", str(empty)], ["export", str(empty), "--to", "vllm"]):
        refused(argv, capsys, "empty.yaml", "serving.replicas", "expected 1 to")


@pytest.mark.heavy  # plans and verifies a serving plan in full: over ten seconds on 2 cores
def test_a_serving_plan_is_one_however_its_text_is_laid_out(plan_yaml, tmp_path, capsys):
    data = yaml.safe_load(plan_yaml.read_text())
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(data, indent=2))
    assert main(["verify", str(pretty)]) == 0
    commented = tmp_path / "commented.yaml"
    commented.write_text("# a note\n" * 1000 + plan_yaml.read_text())
    assert main(["verify", str(commented)]) == 0


@pytest.mark.heavy  # plans and verifies a serving plan in full: over ten seconds on 2 cores
def test_a_serving_plan_named_json_is_written_as_json(tmp_path):
    out = tmp_path / "plan.json"
    assert main([*SERVING, *SHAPE, "--tpot-slo", "50 ms", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["format"] == "llm_planner.serving_plan"
    assert main(["verify", str(out)]) == 0


def test_helix_flags_are_refused_for_the_engines_exports(plan_yaml, tmp_path, capsys):
    argv = ["export", str(plan_yaml), "--to", "vllm", "-o", str(tmp_path / "s.sh"), "--helix-cluster", "c.ini"]
    refused(argv, capsys, "--helix-cluster applies to --to helix, not --to vllm")


def test_launch_will_not_write_its_report_over_the_plan(plan_yaml, capsys):
    before = plan_yaml.read_text()
    refused(["launch", str(plan_yaml), "--dry-run", "--report", str(plan_yaml)], capsys, "is the input plan")
    refused(["launch", str(plan_yaml), "--dry-run", "--report", str(plan_yaml.parent)], capsys, "it is a directory")
    assert plan_yaml.read_text() == before


def _edited(plan_yaml: Path, tmp_path: Path, name: str, edit) -> Path:
    data = yaml.safe_load(plan_yaml.read_text())
    edit(data)
    out = tmp_path / name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@pytest.mark.parametrize("version", [6.0, True, "6"])
def test_a_version_that_only_equals_a_known_one_is_refused(plan_yaml, tmp_path, capsys, version):
    plan = _edited(plan_yaml, tmp_path, "v.yaml", lambda d: d.update(version=version))
    for argv in (["verify", str(plan)], ["show", str(plan)]):
        refused(argv, capsys, "v.yaml", "format", "version 5 or 6")


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("tpot_slo_s", 3600.0, "3600.0 is outside 1 ms to 10 s"),
        ("ttft_slo_s", 0.0001, "0.0001 is outside 1 ms to 3600 s"),
    ],
)
def test_show_refuses_a_target_verify_would(plan_yaml, tmp_path, capsys, key, value, said):
    plan = _edited(plan_yaml, tmp_path, "slo.yaml", lambda d: d["workload"].update({key: value}))
    for argv in (["verify", str(plan)], ["show", str(plan)]):
        refused(argv, capsys, "slo.yaml", f"workload.{key}", said)


@pytest.mark.heavy  # 6-7 s: CI's test command runs it after the default suite
def test_export_to_a_dash_writes_standard_output(plan_yaml, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(plan_yaml), "--to", "vllm", "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith("#!")
    assert not (tmp_path / "-").exists()
