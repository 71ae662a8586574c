"""Plan files: each defect of the hardening issue as its first failing example (a file the verifier
accepted or crashed on), atomic writes, and `plan -o` checked before the solve."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import yaml
from plan_files import a_plan, verify_outcome, write_inputs, written_plan

from llm_planner.core.plan import PlanError, load_plan, save_plan
from llm_planner.placement.verify import verify_plan


@pytest.fixture
def plan_path(tmp_path):
    return written_plan(tmp_path)


def edit(path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def rejected(path, code: int, *fragments: str) -> str:
    got, messages = verify_outcome(path)
    assert got == code, messages
    hits = [m for m in messages if all(f in m for f in fragments)]
    assert hits, messages
    return hits[0]


def test_the_written_plan_verifies(plan_path):
    assert verify_outcome(plan_path) == (0, [])


@pytest.mark.parametrize("field", ["objective_s", "max_load_s", "lower_bound_s"])
def test_an_infinite_number_is_bad_input_naming_the_field(plan_path, field):
    edit(plan_path, lambda d: d.__setitem__(field, float("inf")))
    message = rejected(plan_path, 2, f"{plan_path}: {field}: must be a finite number")
    assert "inf" in message


@pytest.mark.parametrize("field", ["objective_s", "max_load_s"])
def test_an_infinite_number_matches_no_simulation(tmp_path, field):
    problem = write_inputs(tmp_path)
    plan = dataclasses.replace(a_plan(problem), **{field: float("inf")})
    report = verify_plan(plan, problem)
    assert not report.ok and any(f"{field} is inf" in v for v in report.violations)


@pytest.mark.parametrize("field, value", [("gap", 0.0), ("throughput_samples_per_s", 1e6), ("batch_size", 5)])
def test_a_derived_field_that_says_otherwise_is_refused(plan_path, field, value):
    edit(plan_path, lambda d: d.__setitem__(field, value))
    rejected(plan_path, 2, f"{plan_path}: {field}: the file says")


def test_a_hand_edited_top_level_assignment_is_refused_by_verify_and_every_reader(plan_path):
    from llm_planner.core.plan import PlanError

    edit(plan_path, lambda d: d["assignment"].__setitem__("c", "node0/cpu:0"))
    rejected(
        plan_path, 2, f"{plan_path}: assignment: differs from shards[0].assignment", "c: the file has 'node0/cpu:0'"
    )
    with pytest.raises(PlanError, match="assignment"):
        load_plan(plan_path)  # what launch, show and measure read


def test_a_device_order_that_is_not_the_schedules_is_refused(plan_path):
    edit(plan_path, lambda d: d["device_order"]["node0/fast:0"].reverse())
    rejected(plan_path, 2, f"{plan_path}: device_order: differs from the order of the schedule")


def test_optimal_with_a_gap_beyond_the_relative_gap_is_a_violation(plan_path):
    edit(plan_path, lambda d: d["solver"].__setitem__("status", "optimal"))
    gap = load_plan(plan_path).gap
    rejected(plan_path, 1, "solver.status", "claims `optimal`", f"{gap:.4%}")


def test_optimal_with_a_gap_that_only_a_forged_bound_closes_is_a_violation(tmp_path):
    """Within the relative gap by its own bound, which is above the one verify re-derives (tests/test_verify_bound.py
    has the whole forged example)."""
    path = written_plan(tmp_path)
    edit(path, lambda d: d.update(lower_bound_s=d["objective_s"] * (1 - 1e-5), gap=1e-5))
    edit(path, lambda d: d["solver"].__setitem__("status", "optimal"))
    rejected(path, 1, "solver.status", "claims `optimal`")
    rejected(path, 1, "lower_bound_s", "above the bound", "re-derives")


@pytest.mark.parametrize("size", [1.5, 3.0, "3", True])
def test_a_shard_size_that_is_not_an_integer_is_bad_input(plan_path, size):
    edit(plan_path, lambda d: d["shards"][0].__setitem__("size", size))
    rejected(plan_path, 2, f"{plan_path}: shards[0].size: expected an integer")


def test_start_soon_is_bad_input_not_a_type_error(plan_path):
    edit(plan_path, lambda d: d["schedule"][0].__setitem__("start_s", "soon"))
    rejected(plan_path, 2, f"{plan_path}: schedule[0].start_s: expected a number, got str 'soon'")


def test_a_number_yaml_reads_as_text_gets_a_hint(plan_path):
    plan_path.write_text(plan_path.read_text().replace("start_s: 0.0\n", "start_s: 0e0\n", 1))
    rejected(plan_path, 2, "schedule[0].start_s", "write 1e-3 as 1.0e-3")


@pytest.mark.parametrize(
    "where, value, what",
    [
        (("solver",), None, "solver: expected a mapping, got null"),
        (("shards",), {"size": 4}, "shards: expected a list"),
        (("inputs", "model"), ["g.json"], "inputs.model: expected a mapping, got a list"),
        (("schedule", 0, "task"), None, "schedule[0].task: expected a string, got null"),
        (("objective",), "speed", "objective: must be one of latency, throughput"),
        (("inputs", "batch_size"), True, "inputs.batch_size: expected an integer, got bool True"),
    ],
)
def test_wrong_types_nulls_and_lists_for_mappings_are_bad_input(plan_path, where, value, what):
    def change(d):
        for key in where[:-1]:
            d = d[key]
        d[where[-1]] = value

    edit(plan_path, change)
    rejected(plan_path, 2, f"{plan_path}: {what}")


def test_unknown_and_missing_fields_are_bad_input(plan_path):
    edit(plan_path, lambda d: d.__setitem__("objective_ms", d.pop("objective_s")))
    rejected(plan_path, 2, f"{plan_path}: objective_ms: unknown field")
    edit(plan_path, lambda d: d.pop("objective_ms"))
    rejected(plan_path, 2, f"{plan_path}: objective_s: missing required field")


def test_non_utf8_and_duplicate_keys_are_bad_input(plan_path):
    text = plan_path.read_text()
    plan_path.write_bytes(text.replace("name: test", "name: t\xe9st").encode("latin-1"))
    rejected(plan_path, 2, str(plan_path), "not UTF-8")
    plan_path.write_text(text.replace("objective_s:", "objective_s: 1.0\nobjective_s:", 1))
    rejected(plan_path, 2, str(plan_path), "objective_s")


def test_a_start_later_than_its_device_order_allows_is_a_violation(plan_path):
    def delay(d):  # the last item moved later, its duration kept: feasible, but not the plan's schedule
        last = d["schedule"][-1]
        last["start_s"] += 1.0
        last["finish_s"] += 1.0
        d["objective_s"] = last["finish_s"]
        d["gap"] = (d["objective_s"] - d["lower_bound_s"]) / d["objective_s"]
        d["throughput_samples_per_s"] = d["batch_size"] / d["objective_s"]

    edit(plan_path, delay)
    rejected(plan_path, 1, "starts at", "its device order runs it at")


def test_an_input_the_rebuilt_problem_does_not_have_is_a_violation(plan_path):
    edit(plan_path, lambda d: d["inputs"].__setitem__("dtype", "fp32"))
    rejected(plan_path, 1, "inputs.dtype: the plan records 'fp32'")


def test_the_cli_prints_one_message_and_no_traceback(plan_path):
    edit(plan_path, lambda d: d["schedule"][0].__setitem__("start_s", "soon"))
    run = subprocess.run(
        [sys.executable, "-m", "llm_planner.cli.main", "verify", str(plan_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "schedule[0].start_s" in run.stderr.replace("\n", "")


# -- atomic writes ---------------------------------------------------------------------


def test_a_failing_write_leaves_the_old_plan_whole(tmp_path, plan_path, monkeypatch):
    from llm_planner.core.plan import PlanError

    before = plan_path.read_bytes()
    other = dataclasses.replace(load_plan(plan_path), lower_bound_s=0.0)

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(PlanError, match=f"{plan_path}: cannot write: No space left on device"):
        save_plan(other, plan_path)
    assert plan_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "g.json", "plan.yaml"]  # no temporary file left


def test_an_interrupted_write_leaves_the_old_plan_whole(tmp_path, plan_path, monkeypatch):
    import llm_planner.core.atomic as atomic

    before = plan_path.read_bytes()

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "_fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_plan(load_plan(plan_path), plan_path)
    assert plan_path.read_bytes() == before and len(list(tmp_path.iterdir())) == 3


def test_a_write_keeps_the_files_mode_and_never_follows_a_link_to_a_file(tmp_path, plan_path):
    plan_path.chmod(0o640)
    save_plan(load_plan(plan_path), plan_path)
    assert (plan_path.stat().st_mode & 0o777) == 0o640
    before = plan_path.read_bytes()
    for name, target in (("link.yaml", plan_path), ("dangling.yaml", tmp_path / "none.yaml")):
        link = tmp_path / name
        link.symlink_to(target)
        with pytest.raises(ValueError, match=f"{name}: cannot write: it is a symbolic link"):
            save_plan(load_plan(plan_path), link)
        assert link.is_symlink() and plan_path.read_bytes() == before and not (tmp_path / "none.yaml").exists()
    save_plan(load_plan(plan_path), os.devnull)  # a device is written in place, never replaced
    assert not os.path.isfile(os.devnull)
    (tmp_path / "null-link").symlink_to(os.devnull)  # so is a link to one (/dev/stdout is such a link)
    save_plan(load_plan(plan_path), tmp_path / "null-link")
    assert (tmp_path / "null-link").is_symlink()


def test_plan_refuses_an_output_that_is_a_link_before_the_solve(tmp_path, monkeypatch, capsys):
    from llm_planner.cli.main import main
    from llm_planner.placement import solve as api

    write_inputs(tmp_path)
    monkeypatch.setattr(api, "solve", lambda *a, **k: pytest.fail("solved before checking -o"))
    (tmp_path / "victim.txt").write_text("keep")
    (tmp_path / "plan.yaml").symlink_to(tmp_path / "victim.txt")
    argv = ["plan", "--graph", str(tmp_path / "g.json"), "--cluster", str(tmp_path / "c.yaml")]
    assert main([*argv, "-o", str(tmp_path / "plan.yaml")]) == 2
    assert "plan.yaml: cannot write: it is a symbolic link" in capsys.readouterr().err
    assert (tmp_path / "victim.txt").read_text() == "keep"


@pytest.mark.parametrize("output", ["missing/plan.yaml", "."], ids=["missing-folder", "a-directory"])
def test_an_unwritable_output_fails_before_the_solve(tmp_path, monkeypatch, capsys, output):
    from llm_planner.cli.main import main
    from llm_planner.placement import solve as api

    write_inputs(tmp_path)
    monkeypatch.setattr(api, "solve", lambda *a, **k: pytest.fail("solved before checking -o"))
    out = tmp_path / output
    code = main(
        [
            "plan",
            "--graph",
            str(tmp_path / "g.json"),
            "--cluster",
            str(tmp_path / "c.yaml"),
            "--solver",
            "milp",
            "-o",
            str(out),
        ]
    )
    assert code == 2
    err = "".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"{out}:cannotwrite" in err and "Traceback" not in err


def test_a_plan_its_readers_would_refuse_is_never_written(tmp_path, plan_path):
    """A solver detail that is not finite (an exact MILP stopped with no bound of its own once wrote
    mip_gap: inf, which verify, show and launch then refused) stops the write, naming the field."""
    import dataclasses

    plan = load_plan(plan_path)
    before = plan_path.read_bytes()
    bad = dataclasses.replace(plan, solver=dataclasses.replace(plan.solver, details={"mip_gap": float("inf")}))
    with pytest.raises(PlanError, match=r"the plan about to be written.*mip_gap: must be a finite number"):
        save_plan(bad, plan_path)
    assert plan_path.read_bytes() == before
