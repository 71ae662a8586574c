"""`plan --objective latency|throughput` ends with the whole command's time and its parts, and
what the baselines and the lower bound took (labels and non-negative numbers; never how long)."""

from __future__ import annotations

import re

from conftest import SPECS

from llm_planner.cli import main as cli_main
from llm_planner.cli.main import main
from llm_planner.core.timing import Stopwatch, timing_text

PART = re.compile(r"([a-z][a-z ]*?) (\d[\d,.]*) (s|ms|us|ns)\b")


def test_placement_plan_prints_the_command_time_and_its_parts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_main, "console", cli_main.LiteralConsole(width=600))
    out = tmp_path / "p.yaml"
    argv = ["plan", "--cluster", str(SPECS / "four-gpus.yaml"), "--model", "gpt2", "--objective", "throughput"]
    assert main([*argv, "--batch", "4", "-o", str(out)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("the command took")]
    parts = {label.strip(): float(value.replace(",", "")) for label, value, _ in PART.findall(line)}
    assert set(parts) == {
        "the command took",
        "reading inputs",
        "solving",
        "writing",
        "baselines for the table",
        "the baselines took",
        "in all and the lower bound",
    }
    assert all(v >= 0 for v in parts.values())


def test_stopwatch_adds_a_part_run_twice_and_text_keeps_their_order():
    watch = Stopwatch()
    for name in ("b", "a", "b"):
        with watch.part(name):
            pass
    assert list(watch.parts) == ["b", "a"] and all(s >= 0 for s in watch.parts.values())
    assert watch.total() >= sum(watch.parts.values())
    assert timing_text(2.0, {"layout_search": 1.5, "bounds": 0.0005}) == "took 2 s: layout search 1.5 s, bounds 500 us"
