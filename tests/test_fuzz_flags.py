"""Fuzzing the flags of `plan`: numbers (huge, beyond float range, inf, nan, negative, zero, tiny,
malformed) in every numeric flag of each objective, times with and without their unit in the
serving targets, and the flags of the other objective.

The CLI, called in-process, either plans and the plan passes `verify`, or (a batch too large for
any device) says the solver found no plan with exit 1, or exits 2 with one
`error:` line that names the flag and no traceback. A bare number as a target, or a flag of the
other objective, is always refused (exit 2) with the fix or the objective named. An exception
other than the input errors escapes main() and fails the test; a hang fails at the test timeout.
Examples are derandomized: the same ones run every time.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import tempfile
from pathlib import Path

import pytest
from conftest import SPECS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_planner.cli.flags import PLACEMENT_FLAGS, SERVING_FLAGS
from llm_planner.cli.main import main

WORKSTATION = str(SPECS / "rtx4090-workstation.yaml")
EXAMPLES = 60
# the tests that plan and verify each value they accept draw half as many in the default suite (at 30,
# the same plans of valid targets as at 60, half the refusals); their `slow` twins below draw EXAMPLES and more
PLANNING_EXAMPLES = 30

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# the plans the mutations start from: small, each planned in about a second
BASE = {
    "latency": {"--cluster": WORKSTATION, "--model": "gpt2", "--solver": "heft"},
    "throughput": {"--objective": "throughput", "--cluster": WORKSTATION, "--model": "gpt2", "--solver": "heft"},
    "serving": {
        "--objective": "serving",
        "--cluster": WORKSTATION,
        "--model": "gpt2",
        "--prompt-len": "128",
        "--output-len": "64",
        "--tpot-slo": "50 ms",
    },
}
NUMBERS = {
    "latency": ("--batch", "--max-shards", "--max-tp", "--seq-len", "--seed", "--time-limit", "--gap", "--threads"),
    "serving": (
        "--prompt-len",
        "--output-len",
        "--max-classes-per-replica",
        "--max-stages",
        "--max-micro-batches",
        "--max-batched-tokens",
        "--max-tp",
        "--time-limit",
    ),
}
NUMBERS["throughput"] = NUMBERS["latency"]
TARGETS = ("--tpot-slo", "--ttft-slo")
SWITCHES = {"--allow-cpu", "--allow-backend-fallback", "--contiguous", "--no-dp-attention", "--deepep"}
# a value each flag of one objective takes, given under the other
VALID = {
    "--graph": "g.json",
    "--phase": "prefill",
    "--seq-len": "256",
    "--granularity": "sublayer",
    "--seed": "3",
    "--batch": "2",
    "--max-shards": "1",
    "--solver": "milp",
    "--solver-backend": "highs",
    "--gap": "0.01",
    "--threads": "1",
    "--symmetry": "none",
    "--workers": "1",
    "--export": "vllm",
    "--export-file": "x.json",
    "--prompt-len": "64",
    "--output-len": "32",
    "--workload": "w.yaml",
    "--tpot-slo": "50 ms",
    "--ttft-slo": "2 s",
    "--exportable": "vllm",
    "--max-classes-per-replica": "2",
    "--max-stages": "8",
    "--max-micro-batches": "2",
    "--max-batched-tokens": "4096",
    "--expert-imbalance": "1.5",
    "--expert-load": "load.yaml",
    "--eplb": "4",
    "--serving-solver": "megatron",
    "--weights": "fp8",
    "--kv-cache-dtype": "fp8",
    "--allow-weights": "fp8",
    "--allow-kv-cache-dtype": "fp8",
}

odd_numbers = st.sampled_from(
    ["0", "-0", "-1", "1e308", "-1e308", "1e309", "inf", "-inf", "nan", "NaN", "1e-320", "", " ", "0x10", "2.5"]
    + ["9" * 40, str(2**63), str(2**64 + 1), "1_000", "1e3", "+7"]
)
numbers = st.one_of(
    odd_numbers, odd_numbers, st.integers(-(2**70), 2**70).map(str), st.floats().map(repr), st.integers(0, 9).map(str)
)
units = st.sampled_from(["s", "ms", "us", "ns", " s", " ms", "h", "min", "sec", "MS"])
times = st.one_of(numbers, st.tuples(numbers, units).map(" ".join))


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    text = out.getvalue() + err.getvalue()
    assert "Traceback" not in text, f"{argv}: {text}"
    return code, " ".join(err.getvalue().split())


def _plan(objective: str, flag: str, value: str | None, **base: str) -> tuple[int, str]:
    """`plan` of the objective's base (with the flags in `base` changed: {"cluster": path}) with `flag`
    set to `value` (None: a switch); a plan that is written must verify."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["plan", "--no-baselines", "-o", str(Path(tmp) / "plan.yaml")]
        flags = BASE[objective] | {f"--{k.replace('_', '-')}": v for k, v in base.items()}
        argv += [x for k, v in flags.items() if k != flag for x in (k, v)]
        argv += [flag] if value is None else [f"{flag}={value}"]  # '=': '-1e308' stays the flag's value
        code, err = _run(argv)
        if code == 0:
            assert _run(["verify", str(Path(tmp) / "plan.yaml")])[0] == 0, f"{argv}: the plan does not verify"
        return code, err


def _names(flag: str, err: str) -> bool:
    """The message names the flag (or, from a layer below the CLI, its field: seq_len)."""
    return flag in err or re.search(rf"\b{flag.lstrip('-').replace('-', '_')}\b", err) is not None


def _refused(what: str, code: int, err: str, flag: str) -> None:
    assert code == 2, f"{what}: exit {code}: {err}"
    assert err.count("error:") == 1, f"{what}: {err}"
    assert _names(flag, err), f"{what}: the message does not name {flag}: {err}"


@settings(FUZZ, max_examples=PLANNING_EXAMPLES)
@given(st.sampled_from(sorted(BASE)).flatmap(lambda o: st.tuples(st.just(o), st.sampled_from(NUMBERS[o]), numbers)))
@pytest.mark.heavy
def test_numbers_in_numeric_flags(case):
    objective, flag, value = case
    code, err = _plan(objective, flag, value)
    if code == 1:  # a valid value the solver finds no plan for (a batch no device holds): said so
        assert "found no feasible plan" in err and err.count("error:") == 1, f"{flag}={value!r}: {err}"
    elif code != 0:
        _refused(f"{objective} {flag}={value!r}", code, err, flag)


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory) -> str:
    """The workstation with one RTX 4090: the serving bounds of a long target (1 s, 7 s) take a
    fraction of the two-GPU workstation's (seconds instead of 15-20 s each)."""
    path = tmp_path_factory.mktemp("one-gpu") / "one-gpu.yaml"
    text = Path(WORKSTATION).read_text()
    assert "rtx4090: 2}" in text
    path.write_text(text.replace("rtx4090: 2}", "rtx4090: 1}"))
    return str(path)


@settings(FUZZ, max_examples=PLANNING_EXAMPLES)
@given(flag=st.sampled_from(TARGETS), value=times)
def test_times_in_the_serving_targets(one_gpu, flag, value):
    code, err = _plan("serving", flag, value, cluster=one_gpu)
    bare = re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", value)
    if bare and math.isfinite(float(value)):  # a bare number: which unit? (1e309 is refused as not finite)
        assert code == 2 and "has no unit: write" in err, f"{flag}={value!r}: exit {code}: {err}"
    if code != 0:
        _refused(f"{flag}={value!r}", code, err, flag)


def _other_objective_flag(objective: str):
    flags = SERVING_FLAGS if objective != "serving" else PLACEMENT_FLAGS
    flags += ("--contiguous",) if objective != "throughput" else ()
    return st.tuples(st.just(objective), st.sampled_from([f for f in flags if f != "--graph"]))


@FUZZ
@given(st.sampled_from(sorted(BASE)).flatmap(_other_objective_flag))
def test_flags_of_another_objective(case):
    objective, flag = case
    code, err = _plan(objective, flag, None if flag in SWITCHES else VALID[flag])
    _refused(f"{objective} {flag}", code, err, flag)
    assert f"does not apply to --objective {objective}" in err, err


@pytest.mark.slow
@settings(FUZZ, max_examples=300)
@given(st.sampled_from(sorted(BASE)).flatmap(lambda o: st.tuples(st.just(o), st.sampled_from(NUMBERS[o]), numbers)))
def test_many_numbers(case):
    test_numbers_in_numeric_flags.hypothesis.inner_test(case)


@pytest.mark.slow
@FUZZ
@given(flag=st.sampled_from(TARGETS), value=times)
def test_many_times(one_gpu, flag, value):
    """test_times_in_the_serving_targets at EXAMPLES."""
    test_times_in_the_serving_targets.hypothesis.inner_test(one_gpu, flag, value)
