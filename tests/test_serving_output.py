"""What `plan --objective serving` and `show` print: the layout notation (one function writes the
plan file's `pattern` and what is printed), and where the command's time went (labels and
non-negative numbers, never how long anything took)."""

from __future__ import annotations

import contextlib
import copy
import io
import re
from pathlib import Path

import pytest
import yaml
from serving_fixtures import context, write_fleet

from llm_planner.cli import main as cli_main
from llm_planner.cli.main import main
from llm_planner.serving.layout import Segment, describe

TIMING = re.compile(r"([a-z][a-z ]*?) (\d[\d,.]*) (s|ms|us|ns)\b")
PARTS = ("reading inputs", "baselines", "layout search", "bounds", "assigning devices")


def _wide_console(monkeypatch) -> None:
    """Table cells on one line each, so a layout's text is found whole."""
    monkeypatch.setattr(cli_main, "console", cli_main.LiteralConsole(width=400))


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    _wide_console(monkeypatch)


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[str, dict, Path]:
    """One plan on the small fleet for the whole module: what `plan` printed, the file's data, and
    its folder (edited copies go beside it, where its relative cluster path still resolves)."""
    folder = tmp_path_factory.mktemp("planned")
    spec, out = write_fleet(folder), folder / "serving.yaml"
    argv = ["plan", "--cluster", str(spec), "--model", "llama2-7b", "--objective", "serving"]
    argv += ["--prompt-len", "256", "--output-len", "128", "--tpot-slo", "50 ms", "-o", str(out)]
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(io.StringIO()) as printed:
        _wide_console(monkeypatch)
        assert main(argv) == 0
    return printed.getvalue(), yaml.safe_load(out.read_text()), folder


def _plan(planned, name: str = "serving.yaml") -> tuple[str, dict, Path]:
    """The module's plan: its output, a copy of its data, and the path of a copy named `name`."""
    text, data, folder = planned
    data = copy.deepcopy(data)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return text, data, path


def _timing_line(text: str, start: str) -> dict[str, float]:
    """The parts of the line starting with `start`: {label: seconds}, the total as "took"."""
    (line,) = [line for line in text.splitlines() if line.startswith(start)]
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    return {label.strip(): float(value.replace(",", "")) * scale[unit] for label, value, unit in TIMING.findall(line)}


def test_notation_says_stages_and_servers(tmp_path):
    ctx = context(tmp_path)
    layout = (Segment("bigbox/big", 1, 4), Segment("smallbox/small", 4, 1))
    assert describe(layout, ctx.by_name) == (
        "bigbox/big: 4 stages x 1 GPU on 2 servers -> smallbox/small: 1 stage x tp4 in 1 server"
    )
    assert describe((Segment("bigbox/big", 2, 1),), ctx.by_name) == "bigbox/big: 1 stage x tp2 in 1 server"


def test_plan_file_and_output_name_layouts_with_one_function(tmp_path, planned):
    text, data, _ = _plan(planned)
    ctx = context(tmp_path)
    for rep in data["serving"]["replicas"]:
        layout = tuple(Segment(s["class"], s["degree"], s["stages"]) for s in rep["segments"])
        assert rep["pattern"] == describe(layout, ctx.by_name)
        assert f"({rep['pattern']})" in text  # the comparison table prints the stored text
    for baseline in data["baselines"].values():
        for rep in baseline["replicas"]:
            assert re.fullmatch(
                r"([\w./-]+: \d+ stages? x (tp\d+|1 GPU) (in 1 server|on \d+ servers)( -> )?)+", rep["pattern"]
            )
    assert not re.search(r"\d+x[a-z]", text) and "[tp" not in text  # nothing of the old "4xclass[tp4]"


def test_plan_prints_the_whole_command_time_with_its_parts(planned):
    text, data, _ = _plan(planned)
    assert "solved in" not in text
    shown = _timing_line(text, "the command took")
    assert set(shown) == {"the command took", *PARTS, "writing"}
    assert all(s >= 0 for s in shown.values())
    stored = data["serving"]["timings_s"]
    assert list(stored) == [p.replace(" ", "_") for p in PARTS] + ["total"]
    assert all(isinstance(s, float) and s >= 0 for s in stored.values())
    assert data["serving"]["solve_time_s"] == stored["layout_search"]


def test_show_prints_the_recorded_parts_and_reads_plans_without_them(planned, capsys):
    _, data, path = _plan(planned, "show.yaml")
    assert main(["show", str(path)]) == 0
    shown = _timing_line(capsys.readouterr().out, "planning")
    assert set(shown) == {"planning took", *PARTS}
    del data["serving"]["timings_s"]  # a plan written before the record
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["show", str(path)]) == 0
    assert "planning: the layout search took" in capsys.readouterr().out


@pytest.mark.parametrize("timings", [[1.0], {"bounds": -1.0}, {"bounds": "fast"}, {"bounds": True}])
def test_malformed_timings_exit_2_naming_the_field(planned, capsys, timings):
    _, data, path = _plan(planned, "timings.yaml")
    data["serving"]["timings_s"] = timings
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "serving.timings_s" in err


@pytest.mark.heavy
def test_verify_refuses_a_pattern_text_its_segments_do_not_read(planned, capsys):
    _, data, path = _plan(planned, "pattern.yaml")
    assert main(["verify", str(path)]) == 0
    data["serving"]["replicas"][0]["pattern"] = "4xbigbox/big[tp2]"  # the old text, read as four servers
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    assert "serving.replicas[0].pattern: '4xbigbox/big[tp2]', but the segments are" in capsys.readouterr().out
