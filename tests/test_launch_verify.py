"""`launch` verifies the plan before it writes a file or starts a rank, and refuses what `verify` refuses:
the first examples of the issue (overlapping tensor-parallel groups, a device used alone and in its group,
a misaligned group, memory overflow, a reversed group name), each without starting mpiexec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from runtime_fixtures import LOCALHOST, decoder_plan, save_config, tiny_gpt2

from llm_planner.cli.main import main
from llm_planner.core.tensor_groups import member_names
from llm_planner.launch.launch_types import LaunchError, PlanRejected
from llm_planner.launch.plan_launch import launch_plan

GROUPS = {"embed": "localhost/cpu-core:0-1", "block.2": "localhost/cpu-core:2-3"}  # two groups of two
SECOND = "localhost/cpu-core:2-3"


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return save_config(tiny_gpt2(), tmp_path_factory.mktemp("gpt2"))


@pytest.fixture
def groups_plan(gpt2_dir, tmp_path) -> Path:
    return decoder_plan(tmp_path / "plan.yaml", gpt2_dir, [GROUPS], max_tp=4)


def renamed(path: Path, old: str, new: str) -> Path:
    """The plan with device `old` called `new` everywhere (assignments, schedule, device orders): the
    file stays self-consistent, so only the check against the cluster can refuse it."""
    members = member_names(old)

    def walk(value):
        if isinstance(value, dict):
            return {(new if k == old else k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return new if value == members else [walk(v) for v in value]
        return new if value == old else value

    out = path.with_name(f"renamed-{new.rsplit(':', 1)[1]}.yaml")
    out.write_text(yaml.safe_dump(walk(yaml.safe_load(path.read_text())), sort_keys=False))
    return out


def refused(path: Path, tmp_path: Path, *fragments: str) -> LaunchError:
    """Refused before anything is written or started: no workdir, no hostfile, no rank."""
    workdir = tmp_path / "w"
    with pytest.raises(LaunchError) as info:
        launch_plan(path, workdir=str(workdir))  # not a dry run: it would start mpiexec if not refused
    message = str(info.value)
    assert str(path) in message and all(f in message for f in fragments), message
    assert not workdir.exists()
    return info.value


def test_the_groups_plan_itself_launches_as_a_dry_run(groups_plan, tmp_path):
    table = launch_plan(groups_plan, dry_run=True, workdir=str(tmp_path / "w")).rank_table
    assert [r.group for r in table.ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_overlapping_groups_are_refused(groups_plan, tmp_path):
    error = refused(renamed(groups_plan, SECOND, "localhost/cpu-core:0-3"), tmp_path, "share a physical device")
    assert isinstance(error, PlanRejected) and error.exit_code == 1


def test_a_device_used_alone_and_in_its_group_is_refused(groups_plan, tmp_path):
    path = renamed(groups_plan, SECOND, "localhost/cpu-core:1")
    refused(path, tmp_path, "'localhost/cpu-core:1' and 'localhost/cpu-core:0-1'", "share a physical device")


def test_a_misaligned_group_is_refused(groups_plan, tmp_path):
    error = refused(renamed(groups_plan, SECOND, "localhost/cpu-core:1-2"), tmp_path, "is not an aligned block")
    assert error.exit_code == 2  # the cluster cannot form it: bad input, as `verify` says


def test_a_reversed_group_name_is_refused_not_run_on_zero_ranks(groups_plan, tmp_path):
    error = refused(renamed(groups_plan, SECOND, "localhost/cpu-core:3-2"), tmp_path, "'localhost/cpu-core:3-2'")
    assert error.exit_code == 2 and "a group needs at least 2 devices" in str(error)


def test_a_plan_that_overflows_a_devices_memory_is_refused(gpt2_dir, tmp_path):
    data = yaml.safe_load(LOCALHOST.read_text())
    data["device_kinds"][0]["mem_bytes"] = "400 kB"  # the model's 0.9 MB fits on four cores, not on one
    cluster = tmp_path / "small.yaml"
    cluster.write_text(yaml.safe_dump(data))
    path = decoder_plan(tmp_path / "one.yaml", gpt2_dir, [{"embed": 0}], cluster=cluster)
    refused(path, tmp_path, "device 'localhost/cpu-core:0' needs", "of memory but holds")


def test_a_forged_bound_is_refused(gpt2_dir, tmp_path):
    path = decoder_plan(tmp_path / "plan.yaml", gpt2_dir, [{"embed": 0, "block.2": 1}])
    data = yaml.safe_load(path.read_text())
    data.update(lower_bound_s=data["objective_s"], gap=0.0)
    data["solver"]["status"] = "optimal"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    refused(path, tmp_path, "lower_bound_s: the plan claims", "solver.status: the plan claims")


def test_the_command_line_exits_1_with_the_verifiers_messages(groups_plan, tmp_path, capsys):
    path = renamed(groups_plan, SECOND, "localhost/cpu-core:0-3")
    assert main(["launch", str(path), "--dry-run", "--workdir", str(tmp_path / "w")]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"{path}: the verifier rejects this plan" in text and "share a physical device" in text
    assert not (tmp_path / "w").exists()


def test_a_cluster_file_edited_since_planning_is_checked_as_it_is_now(gpt2_dir, tmp_path):
    """Launch keeps running on a cluster whose file changed (hostnames filled in, say) when the plan still
    verifies against it; verify itself refuses the changed hash."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(LOCALHOST.read_text())
    path = decoder_plan(tmp_path / "plan.yaml", gpt2_dir, [{"embed": 0, "block.2": 1}], cluster=cluster)
    cluster.write_text(LOCALHOST.read_text() + "# hosts checked\n")
    assert launch_plan(path, dry_run=True, workdir=str(tmp_path / "w")).ok
    data = yaml.safe_load(LOCALHOST.read_text())
    data["device_kinds"][0]["peak_flops"] = {"fp32": "1 GFLOP/s"}  # the plan's times are no longer this cluster's
    cluster.write_text(yaml.safe_dump(data))
    refused(path, tmp_path / "x", "claims objective")
