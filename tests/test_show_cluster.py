"""`show-cluster` in the terms of someone deploying a model: servers, devices, kinds, memory, links,
and the classes of identical servers with their counts, with no solver vocabulary."""

from __future__ import annotations

import re

import pytest
from conftest import SPECS

from llm_planner.cli import main as cli_main
from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.placement.milp.symmetry import symmetry_classes


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Table cells and captions on one line each."""
    monkeypatch.setattr(cli_main, "console", cli_main.LiteralConsole(width=600))


def _show(capsys, name: str) -> str:
    assert main(["show-cluster", str(SPECS / name)]) == 0
    return capsys.readouterr().out


def test_six_servers_in_plain_words(capsys):
    text = _show(capsys, "gpt3-six-servers.yaml")
    for words in ("ordering rows", "shard x task", "symmetry classes", " item"):
        assert words not in text
    assert "classes of identical servers" in text
    for template in ("h100-server", "a100-server", "v100-server"):
        row = re.search(rf"│ {template} +│ {template}-0, {template}-1 +│ 2 +│ 8 \w+-\d+g +│", text)
        assert row, f"{template}: no class row with its two servers"
    assert re.search(r"│ h100-server-1 +│ h100-server +│ h100-1 +│ .*8 h100-80g \(h100-80g:0 \.\. h100-80g:7\)", text)
    assert re.search(r"│ two h100-80g in one h100-server +│ 450 GB/s +│ 2 us", text)
    assert re.search(r"│ two servers \(the network\) +│ 25 GB/s +│ 5 us", text)
    assert re.search(r"│ h100-80g .*│ 79\.6 GiB \(71\.7 GiB\) +│ 3350 GB/s", text)  # memory and what plans may fill
    rows = symmetry_classes(load_cluster(SPECS / "gpt3-six-servers.yaml")).num_rows
    assert f"batch, task or time add {rows} constraints here" in text


def test_a_single_server_has_no_identical_devices_to_swap(capsys):
    text = _show(capsys, "cpu-two-gpus.yaml")
    assert re.search(r"│ workstation +│ workstation +│ 1 +│ - +│", text)
    assert "two devices in one server" in text and "add 0 constraints here" in text
