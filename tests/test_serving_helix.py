"""A serving plan on an imported Helix cluster with its measured layer times, and back to Helix's layout."""

from __future__ import annotations

import pytest
import yaml
from test_helix import run_import, write_helix

from llm_planner.cli.main import main
from llm_planner.helix.layout_file import read_helix_layout


@pytest.mark.slow  # plans a 70B serving fleet from Helix's cluster: minutes on 2 cores
def test_serving_plan_on_an_imported_helix_cluster_exports_its_layout(tmp_path, capsys):
    rc, spec, profile = run_import(tmp_path, write_helix(tmp_path))
    assert rc == 0
    plan = tmp_path / "plan.yaml"
    assert (
        main(
            [
                "plan",
                "--cluster",
                str(spec),
                "--model",
                "llama2-7b",
                "--objective",
                "serving",
                "--prompt-len",
                "200",
                "--output-len",
                "100",
                "--tpot-slo",
                "2 s",
                "--profile",
                str(profile),
                "-o",
                str(plan),
            ]
        )
        == 0
    )
    assert main(["verify", str(plan)]) == 0
    data = yaml.safe_load(plan.read_text())
    # the measured times are used: a stage's time is at least its layers at the profile's batch-2 decode time
    rep = data["serving"]["replicas"][0]
    assert rep["stage_s"][0] >= rep["layers"][0] * 1.0e-3
    layout = tmp_path / "layout.ini"
    assert (
        main(
            [
                "export",
                str(plan),
                "--to",
                "helix",
                "--helix-cluster",
                str(tmp_path / "config" / "cluster.ini"),
                "-o",
                str(layout),
            ]
        )
        == 0
    )
    ranges = read_helix_layout(layout.read_text())
    covered = sorted(r for r in ranges.values())
    assert covered[0][0] == 0 and max(end for _, end in covered) == 32
    capsys.readouterr()
    assert main(["export", str(plan), "--to", "helix", "-o", str(layout)]) == 2
    assert "--helix-cluster" in capsys.readouterr().err
