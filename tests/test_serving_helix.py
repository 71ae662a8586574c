"""A serving plan on an imported Helix cluster with its measured layer times, and back to Helix's layout:
written when Helix would accept it, refused (exit 2, machine and cap named) when it would not."""

from __future__ import annotations

import pytest
import yaml
from test_helix import run_import, write_helix

from llm_planner.cli.main import main
from llm_planner.helix.layout_file import read_helix_layout


def write_caps(tmp_path, caps: dict[str, int]) -> None:
    """Each type's tables in Helix's <model>_<type>.py form, with `max_num_layers` = caps[type]."""
    for kind, cap in caps.items():
        rows = ", ".join(f"{n}: {max(1, 4000 // n)}" for n in range(1, cap + 1))
        limits = ", ".join(f"{n}: 8" for n in range(1, cap + 1))
        source = (
            f"max_num_layers: int = {cap}\nvllm_num_blocks_dict = {{{rows}}}\ndecode_max_tokens_dict = {{{limits}}}\n"
        )
        (tmp_path / "llama2_70b" / kind / f"llama2_70b_{kind}.py").write_text(source)


def _plan(tmp_path):
    rc, spec, profile = run_import(tmp_path, write_helix(tmp_path))
    assert rc == 0
    plan = tmp_path / "plan.yaml"
    args = ["plan", "--cluster", str(spec), "--model", "llama2-7b", "--objective", "serving"]
    args += ["--prompt-len", "200", "--output-len", "100", "--tpot-slo", "2 s", "--profile", str(profile)]
    assert main([*args, "-o", str(plan)]) == 0
    assert main(["verify", str(plan)]) == 0
    return plan


def _export(tmp_path, plan, layout) -> int:
    args = ["export", str(plan), "--to", "helix", "--helix-cluster", str(tmp_path / "config" / "cluster.ini")]
    return main([*args, "--helix-profiles", str(tmp_path / "llama2_70b"), "-o", str(layout)])


@pytest.mark.slow  # plans a serving fleet from Helix's cluster: minutes on 2 cores
def test_serving_plan_on_an_imported_helix_cluster_exports_its_layout(tmp_path, capsys):
    plan = _plan(tmp_path)
    data = yaml.safe_load(plan.read_text())
    # the measured times are used: a stage's time is at least its layers at the profile's batch-2 decode time
    rep = data["serving"]["replicas"][0]
    assert rep["stage_s"][0] >= rep["layers"][0] * 1.0e-3
    deepest = max(layers for r in data["serving"]["replicas"] for layers in r["layers"])
    write_caps(tmp_path, {"a100": 32, "t4": 32})
    layout = tmp_path / "layout.ini"
    assert _export(tmp_path, plan, layout) == 0
    ranges = read_helix_layout(layout.read_text())
    covered = sorted(r for r in ranges.values())
    assert covered[0][0] == 0 and max(end for _, end in covered) == 32
    # Helix's caps below the plan's deepest stage: nothing is written, the machine and the cap are named
    write_caps(tmp_path, {"a100": deepest - 1, "t4": deepest - 1})
    capsys.readouterr()
    refused = tmp_path / "refused.ini"
    assert _export(tmp_path, plan, refused) == 2
    err = capsys.readouterr().err
    assert f"holds {deepest} layers" in err and f"hold at most {deepest - 1} (max_num_layers)" in err
    assert not refused.exists()
    assert main(["export", str(plan), "--to", "helix", "-o", str(layout)]) == 2
    assert "--helix-profiles" in capsys.readouterr().err
