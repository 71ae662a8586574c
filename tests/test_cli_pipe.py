"""A reader of the command's output that leaves early (`llm-planner score ... --json | head -c 40`):
the command stops quietly, no traceback: 141 where it prints JSON, as Unix tools stopped by SIGPIPE
do, and 1 where it prints tables (rich's own handling of a closed pipe)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from serving_fixtures import write_fleet


def _closed_early(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm_planner.cli.main", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    return proc.wait(timeout=300), err


@pytest.mark.parametrize("json_out", [True, False])
def test_a_closed_pipe_stops_the_command_without_a_traceback(tmp_path, json_out):
    argv = [
        "score",
        "--cluster",
        str(write_fleet(tmp_path)),
        "--model",
        "llama2-7b",
        "--replica",
        "1 x bigbox/big[tp2]",
    ]
    argv += ["--concurrency", "8", "--prompt-len", "512", "--output-len", "128"] + ["--json"] * json_out
    rc, err = _closed_early(argv)
    assert rc == (141 if json_out else 1) and "Traceback" not in err, err
