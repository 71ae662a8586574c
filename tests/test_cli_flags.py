"""The flags of `plan` and friends, as a fuzzing review found them: numbers that overflowed, hung or
were silently read in the wrong unit, flags of the other objective silently ignored, zero counts
taken as the default, `show --gantt` writing nothing, compare-symmetry's lists unchecked. Each is
refused with exit 2 and one `error:` line naming the flag, never a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from conftest import SPECS
from serving_fixtures import write_fleet
from test_precision import T4_SERVER

from llm_planner.cli import flags
from llm_planner.cli.main import _build_parser, main

WORKSTATION = str(SPECS / "rtx4090-workstation.yaml")
LATENCY = ["plan", "--cluster", WORKSTATION, "--model", "gpt2", "--solver", "heft", "--no-baselines"]
SERVING = ["plan", "--objective", "serving", "--cluster", WORKSTATION, "--model", "gpt2", "--no-baselines"]
SHAPE = ["--prompt-len", "128", "--output-len", "64"]


def refused(argv: list[str], capsys, *words: str) -> str:
    """main(argv) exits 2 with one error line holding every word, no traceback; that line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "Traceback" not in captured.out + captured.err and err.count("error:") == 1, err
    assert all(w in err for w in words), err
    return err


@pytest.mark.parametrize(
    "target, words",
    [
        ("1e308 s", ["--tpot-slo", "'1e308 s' is outside 1 ms to 10 s"]),  # was OverflowError
        ("1e6 s", ["--tpot-slo", "outside 1 ms to 10 s"]),  # ran for hours
        ("50", ["--tpot-slo", "'50' has no unit: write '50 ms' or '50 s'"]),  # was 50 s
        ("inf ms", ["--tpot-slo"]),
        ("-50 ms", ["--tpot-slo", "outside"]),
    ],
)
def test_a_tpot_target_needs_a_unit_and_a_time_in_range(target, words, tmp_path, capsys):
    refused([*SERVING, *SHAPE, "--tpot-slo", target, "-o", str(tmp_path / "p.yaml")], capsys, *words)
    assert not (tmp_path / "p.yaml").exists()


def test_the_help_states_the_range_and_the_unit(capsys):
    with pytest.raises(SystemExit):
        _build_parser().parse_args(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "from 1 ms to 10 s" in text and "a time with its unit" in text


def test_huge_workload_weights_give_the_plan_of_equal_weights(tmp_path, capsys):
    """Two shapes of weight 1e308 each (their sum is inf: NaN contexts, no prompt charged) plan as
    two of weight 1 (at 10 ms: the bounds a fifth of their time at 50 ms)."""
    plans = []
    for weight in ("1e308", "1"):
        shapes = tmp_path / f"shapes-{weight}.yaml"
        shapes.write_text(
            f"requests: [{{prompt_len: 100, output_len: 50, weight: {weight}}}, "
            f"{{prompt_len: 300, output_len: 20, weight: {weight}}}]\n"
        )
        out = tmp_path / f"plan-{weight}.yaml"
        argv = [*SERVING, "--workload", str(shapes), "--tpot-slo", "10 ms", "-o", str(out)]
        assert main(argv) == 0, capsys.readouterr().err
        plans.append(out.read_text().split("serving:", 1)[1].split("solve_time_s")[0])
    assert plans[0] == plans[1]


def test_a_weight_format_no_serving_kind_runs_is_refused_naming_the_flag_and_kinds(tmp_path, capsys):
    # a T4 (catalog entry t4, Turing) has no fp8 tensor cores, nor the compute capability 8.0 that
    # FP8 Marlin's weight-only kernels need (an A100 runs fp8 weights that way; the RTX 4090 natively)
    spec = tmp_path / "t4.yaml"
    spec.write_text(T4_SERVER)
    serving = [a if a != WORKSTATION else str(spec) for a in SERVING]
    refused(
        [*serving, *SHAPE, "--tpot-slo", "50 ms", "--weights", "fp8", "-o", str(tmp_path / "p.yaml")],
        capsys,
        "--weights fp8",
        "'t4'",
        "t4.yaml",
        "peak_flops give no fp8, and fp8 weight-only kernels (FP8 Marlin) run on GPUs of compute capability 8.0",
    )


def test_fp8_activations_are_refused_pointing_at_the_weight_and_kv_flags(tmp_path, capsys):
    argv = [*SERVING, *SHAPE, "--tpot-slo", "50 ms", "--dtype", "fp8", "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, "--dtype fp8", "--weights fp8 --kv-cache-dtype fp8")


@pytest.mark.parametrize(
    "weights, words",
    [("int5", ["--weights int5", "unknown weight format"]), ("int4-awq:64", ["--weights int4-awq:64", ":gN"])],
)
def test_a_weight_format_that_means_nothing_is_refused(weights, words, tmp_path, capsys):
    argv = [*SERVING, *SHAPE, "--tpot-slo", "50 ms", "--weights", weights, "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, *words)


@pytest.mark.parametrize("flag", ["--workload", "--profile"])
def test_an_input_that_is_a_directory_is_refused_naming_it(flag, tmp_path, capsys):
    shape = [] if flag == "--workload" else SHAPE
    argv = [*SERVING, *shape, "--tpot-slo", "50 ms", flag, str(tmp_path), "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, f"{tmp_path}: cannot read: not a regular file (a directory)")


@pytest.mark.parametrize(
    "extra",
    [["--batch", "4"], ["--solver", "milp"], ["--export", "vllm"], ["--seq-len", "512"], ["--phase", "prefill"]],
)
def test_a_flag_of_latency_and_throughput_is_refused_under_serving(extra, tmp_path, capsys):
    argv = [*SERVING, *SHAPE, "--tpot-slo", "50 ms", *extra, "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, f"{extra[0]} does not apply to --objective serving", "latency and throughput")


@pytest.mark.parametrize(
    "objective, extra",
    [("latency", ["--tpot-slo", "50 ms"]), ("throughput", ["--max-stages", "64"]), ("latency", ["--contiguous"])],
)
def test_a_flag_of_another_objective_is_refused(objective, extra, tmp_path, capsys):
    argv = [*LATENCY, "--objective", objective, *extra, "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, f"{extra[0]} does not apply to --objective {objective}")


def test_a_flag_given_at_its_default_value_is_still_given(tmp_path, capsys):
    """Given or not is the flag's presence, not its value: `--batch 1` is the default's value."""
    argv = [*SERVING, *SHAPE, "--tpot-slo", "50 ms", "--batch", "1", "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, "--batch does not apply to --objective serving")


def test_every_flag_of_plan_says_which_objectives_read_it():
    """A new flag of `plan` is listed as every objective's, or restricted: none is silently ignored."""
    plan = _build_parser()._subparsers._group_actions[0].choices["plan"]
    restricted = {flag for flag, _ in plan.get_default("_applies").values()}
    every = {s for a in plan._actions for s in a.option_strings if s.startswith("--")}
    shared = {"--help", "--model", "--cluster", "--dtype", "--objective", "--max-tp", "--time-limit"}
    assert every - restricted == shared | {"--output", "--no-baselines", "--profile"}
    assert restricted == set(flags.PLACEMENT_FLAGS) | set(flags.SERVING_FLAGS) | {"--contiguous"}


def test_defaults_are_filled_in_for_flags_not_given():
    args = _build_parser().parse_args(["plan", "--model", "gpt2", "--cluster", WORKSTATION])
    assert isinstance(args.batch, flags.Default) and not flags.given(args, "batch")
    flags.check_objective(args)
    flags.fill_defaults(args)
    assert (args.batch, args.solver, args.max_stages, args.allow_cpu) == (1, "milp-split", 64, False)
    assert not any(isinstance(v, flags.Default) for v in vars(args).values())


@pytest.mark.parametrize("flag", ["--max-micro-batches", "--max-classes-per-replica", "--max-stages"])
def test_a_zero_count_is_refused_not_taken_as_the_default(flag, tmp_path, capsys):
    argv = [*SERVING, *SHAPE, "--tpot-slo", "50 ms", flag, "0", "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, f"argument {flag}: must be a whole number from 1 to")


def test_show_gantt_of_a_serving_plan_is_refused(tmp_path, capsys):
    plan, gantt = tmp_path / "p.yaml", tmp_path / "g.png"
    assert main([*SERVING, *SHAPE, "--tpot-slo", "10 ms", "-o", str(plan)]) == 0
    capsys.readouterr()
    refused(["show", str(plan), "--gantt", str(gantt)], capsys, "--gantt", "a serving plan has no Gantt chart")
    assert not gantt.exists()


def test_show_gantt_to_a_full_device_exits_2_naming_it(tmp_path, capsys):
    plan = tmp_path / "p.yaml"
    assert main([*LATENCY, "-o", str(plan)]) == 0
    capsys.readouterr()
    refused(["show", str(plan), "--gantt", "/dev/full"], capsys, "/dev/full: cannot write")
    refused(["show", str(plan), "--gantt", str(tmp_path / "g.xyz")], capsys, "g.xyz: cannot write a figure as .xyz")
    assert main(["show", str(plan), "--gantt", str(tmp_path / "g.png")]) == 0
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")
    assert main(["show", str(plan), "--gantt", str(tmp_path / "g.svg")]) == 0
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()[:1000]


@pytest.mark.parametrize("solvers, word", [("", "(none given)"), ("bogus", "bogus"), ("milp,heft", "heft")])
def test_compare_symmetry_solvers_are_known_ones(solvers, word, tmp_path, capsys):
    argv = ["compare-symmetry", "--cluster", WORKSTATION, "--model", "gpt2", "--out-dir", str(tmp_path)]
    refused([*argv, "--solvers", solvers], capsys, "argument --solvers: unknown solver", word, "milp, milp-split")


def test_serving_flags_on_the_small_fleet_still_plan(tmp_path, capsys):
    """The counts' new types take what they took before (at 5 ms, where plan and verify derive the bound
    in a third of the time they take at 20 ms)."""
    argv = ["plan", "--objective", "serving", "--cluster", str(write_fleet(tmp_path)), "--model", "gpt2"]
    argv += [*SHAPE, "--tpot-slo", "0.005 s", "--max-micro-batches", "1", "--max-classes-per-replica", "1"]
    assert main([*argv, "--max-stages", "4", "--no-baselines", "-o", str(tmp_path / "p.yaml")]) == 0
    assert main(["verify", str(tmp_path / "p.yaml")]) == 0


def test_default_is_a_marker_not_a_value():
    marker = flags.Default(0)
    assert repr(marker) == "0" and marker != 0
    args = argparse.Namespace(objective="latency", x=marker, _applies={"x": ("--x", flags.SERVING)})
    flags.check_objective(args)  # not given: not refused
    args.x = 0
    with pytest.raises(flags.FlagError, match="--x does not apply to --objective latency"):
        flags.check_objective(args)


def test_an_export_file_without_export_is_refused(tmp_path, capsys):
    argv = [*LATENCY, "--export-file", str(tmp_path / "x.json"), "-o", str(tmp_path / "p.yaml")]
    refused(argv, capsys, "--export-file", "--export vllm or megatron")
    assert not (tmp_path / "p.yaml").exists()


def test_a_plan_file_target_out_of_range_is_refused_naming_the_field(tmp_path, capsys):
    """The same rule for a serving plan's own target (a tampered file), named as its field."""
    plan = tmp_path / "p.yaml"
    assert main([*SERVING, *SHAPE, "--tpot-slo", "10 ms", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert "tpot_slo_s: 0.01\n" in plan.read_text()
    plan.write_text(plan.read_text().replace("tpot_slo_s: 0.01\n", "tpot_slo_s: 1000000.0\n", 1))
    refused(["verify", str(plan)], capsys, "p.yaml: workload.tpot_slo_s: 1000000.0 is outside 1 ms to 10 s")


MIXED_FP8 = """
name: a100-and-4090
device_kinds:
  - {name: a100, catalog: a100-sxm-40g}
  - {name: rtx4090, catalog: rtx-4090}
nodes:
  - {name: dgx, devices: {a100: 2}}
  - {name: ws, devices: {rtx4090: 1}}
links:
  intra_node_default: {bw_bytes_per_s: 300 GB/s, latency_s: 2 us}
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
"""


def test_fp8_kernels_text_names_the_kinds_that_run_fp8_weights_weight_only(tmp_path):
    from llm_planner.cli.serving_text import fp8_kernels_text
    from llm_planner.core.spec import load_cluster

    spec = tmp_path / "mixed.yaml"
    spec.write_text(MIXED_FP8)
    cluster = load_cluster(spec)
    data = {
        "model": {"precision": {"weights": "fp8", "activations": "bf16", "kv_cache": "bf16"}},
        "serving": {"replicas": [{"devices": [[["dgx/a100:0", "dgx/a100:1"], ["ws/rtx4090:0"]]]}]},
    }
    assert fp8_kernels_text(data, cluster) == (
        "fp8 weights run weight-only (W8A16, vLLM's FP8 Marlin; no fp8 tensor cores) on a100; at fp8 (W8A8) on rtx4090"
    )
    data["model"]["precision"]["weights"] = "bf16"
    assert fp8_kernels_text(data, cluster) is None


def test_show_of_an_fp8_plan_says_how_its_kinds_run_the_weights(tmp_path, capsys):
    out = tmp_path / "fp8.yaml"
    argv = [*SERVING, *SHAPE, "--tpot-slo", "50 ms", "--weights", "fp8", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    assert "fp8 weights run at fp8 (W8A8) on rtx4090" in " ".join(capsys.readouterr().out.split())


def _budget_plan(concurrency: int, tpot_s: float, chunked: bool = True) -> dict:
    replica = {"pattern": "box/gpu: 1 stage x tp8 in 1 server", "concurrency": concurrency, "micro_batches": 1}
    return {
        "workload": {"requests": [{"prompt_len": 1024, "output_len": 256, "weight": 1.0}], "tpot_slo_s": 0.05},
        "options": {"max_batched_tokens": 2048, "chunked_prefill": chunked},
        "serving": {"replicas": [dict(replica, tpot_s=tpot_s)]},
    }


def test_a_plan_whose_token_budget_caps_its_concurrency_says_so():
    """2048 tokens, 1 + 1024/256 = 5 a sequence: 409 sequences fill the budget, 410 would not fit."""
    from llm_planner.cli.serving_text import budget_text

    note = budget_text(_budget_plan(409, 0.0375))
    assert "--max-batched-tokens 2048" in note and "5 tokens a sequence" in note and "box/gpu" in note
    assert budget_text(_budget_plan(409, 0.0499)) is None  # the TPOT target binds, not the budget
    assert budget_text(_budget_plan(300, 0.0375)) is None  # room for more in the budget
    assert budget_text(_budget_plan(409, 0.0375, chunked=False)) is None  # whole prompts: 1 token a sequence


def test_a_missing_request_length_is_said_to_be_required(capsys):
    refused([*SERVING, "--output-len", "64", "--tpot-slo", "50 ms"], capsys, "--prompt-len is required")
    refused([*SERVING, "--prompt-len", "64", "--tpot-slo", "50 ms"], capsys, "--output-len is required")


def test_a_bad_allowed_kv_cache_dtype_names_its_own_flag(capsys):
    argv = [*SERVING, *SHAPE, "--tpot-slo", "50 ms", "--allow-kv-cache-dtype", "int4"]
    refused(argv, capsys, "--allow-kv-cache-dtype int4: expected one of auto, fp8")


def test_contiguous_with_a_solver_that_does_not_apply_it_is_refused(tmp_path, capsys):
    argv = ["plan", "--cluster", "cluster_specs/cpu-two-gpus.yaml", "--model", "rwnn-ws-3x32"]
    argv += ["--objective", "throughput", "--batch", "4", "--contiguous", "-o", str(tmp_path / "p.yaml")]
    assert main([*argv, "--solver", "heft"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--contiguous: solver 'heft' does not keep each device's tasks contiguous; use --solver milp" in err
    assert not (tmp_path / "p.yaml").exists()


def test_an_export_file_that_is_the_plans_own_path_is_refused_before_solving(tmp_path, capsys):
    same = str(tmp_path / "same.yaml")
    argv = ["plan", "--cluster", "cluster_specs/four-gpus.yaml", "--model", "gpt2", "--batch", "2"]
    assert main([*argv, "--export", "vllm", "--export-file", same, "-o", same]) == 2
    assert "--export-file" in capsys.readouterr().err and not Path(same).exists()
