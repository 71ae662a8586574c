"""What `plan` and `show` print says what it is for and in which unit: the header names a decoder's
phase, context (or prompt) length and dtype; a column's head names the unit its values are in; sizes and
times never print in exponent form (`1e+03 MiB`)."""

from __future__ import annotations

import re

import pytest
from conftest import SPECS
from rich.console import Console

from llm_planner.cli.commands import plan_summary_table
from llm_planner.cli.main import main
from llm_planner.core.fmt import fmt_bytes, fmt_s, significant, time_unit
from llm_planner.core.plan import load_plan

WORKSTATION = str(SPECS / "rtx4090-workstation.yaml")


@pytest.mark.parametrize(
    "extra, header",
    [
        ([], "gpt2 (decode step, context 1,024 tokens, fp16): "),
        (["--phase", "prefill", "--seq-len", "512", "--dtype", "bf16"], "gpt2 (prefill, prompt 512 tokens, bf16): "),
        (["--seq-len", "300", "--dtype", "fp32"], "gpt2 (decode step, context 300 tokens, fp32): "),
    ],
)
def test_plan_and_show_headers_state_phase_context_and_dtype(extra, header, tmp_path, capsys):
    plan = str(tmp_path / "plan.yaml")
    assert main(["plan", "--cluster", WORKSTATION, "--model", "gpt2", *extra, "--no-baselines", "-o", plan]) == 0
    assert capsys.readouterr().out.startswith(header)
    assert main(["show", plan]) == 0
    assert capsys.readouterr().out.startswith(header)


def test_a_graph_file_header_has_no_decoder_note(tmp_path, capsys):
    """Only decoders have a phase, context and dtype of their own to state."""
    plan = str(tmp_path / "plan.yaml")
    argv = ["plan", "--cluster", WORKSTATION, "--model", "rwnn-ws-3x32", "--solver", "heft", "--no-baselines"]
    assert main([*argv, "-o", plan]) == 0
    assert re.match(r"rwnn-ws-3x32\S*: \d+ tasks", capsys.readouterr().out)


def _rendered(table) -> list[str]:
    console = Console(width=250, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text().splitlines()


@pytest.mark.parametrize("objective, per", [("latency", ""), ("throughput", "/sample")])
def test_the_objective_column_names_the_unit_of_its_values(objective, per, tmp_path, capsys):
    """The issue's case: "objective (s)" over values in ms. Each time column's head names a unit, and
    the value under it, read in that unit, is the plan's objective and bound."""
    path = tmp_path / "plan.yaml"
    argv = ["plan", "--cluster", WORKSTATION, "--model", "gpt2", "--objective", objective, "--batch", "2"]
    assert main([*argv, "-o", str(path)]) == 0
    capsys.readouterr()
    plan = load_plan(path)
    lines = _rendered(plan_summary_table(plan, {}))
    heads = [c.strip() for c in re.split(r"[┃│|]", next(s for s in lines if "planner" in s)) if c.strip()]
    cells = [c.strip() for c in re.split(r"[┃│|]", next(s for s in lines if plan.solver.name in s)) if c.strip()]
    unit, scale = time_unit(plan.objective_s)
    assert unit != "s"  # a GPT-2 step on an RTX 4090 takes under a second: the case the issue saw
    for name, value_s in (("objective", plan.objective_s), ("lower bound", plan.lower_bound_s)):
        col = heads.index(f"{name} ({unit}{per})")
        assert float(cells[col].replace(",", "")) == pytest.approx(value_s / scale, rel=1e-3)


def test_show_prints_no_exponents(tmp_path, capsys):
    plan = str(tmp_path / "plan.yaml")
    assert main(["plan", "--cluster", str(SPECS / "four-gpus.yaml"), "--model", "gpt2-xl", "-o", plan]) == 0
    assert main(["show", plan]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"\de[+-]\d", out), out


@pytest.mark.parametrize(
    "num_bytes, text",
    [
        (1000 * 2**20, "1,000 MiB"),  # the issue's `1e+03 MiB`
        (999.7 * 2**20, "1,000 MiB"),
        (1023.4 * 2**20, "1,023 MiB"),
        (347 * 2**20, "347 MiB"),
        (20.1 * 2**30, "20.1 GiB"),
        (0.5 * 2**20, "512 KiB"),
        (1000, "1,000 B"),
        (12, "12 B"),
        (float("inf"), "unlimited"),
    ],
)
def test_fmt_bytes(num_bytes, text):
    assert fmt_bytes(num_bytes) == text


@pytest.mark.parametrize(
    "seconds, text",
    [(12345.6, "12,346 s"), (999.99, "1,000 s"), (0.5045, "504.5 ms"), (1.5e-3, "1.5 ms"), (2e-7, "200 ns")],
)
def test_fmt_s(seconds, text):
    assert fmt_s(seconds) == text


def test_no_size_or_time_prints_in_exponent_form():
    for exponent in range(-9, 16):
        for mantissa in (1.0, 9.995, 9.9996, 99.95, 999.5, 999.95, 1023.9):
            value = mantissa * 10.0**exponent
            assert "e" not in fmt_s(value), value
            assert "e" not in significant(value, 3) or value < 1, value
            if value >= 1:
                assert "e" not in fmt_bytes(value), value
