"""Planning needs none of the runtime's packages: README command 1 installs requirements-plan.txt only
(no torch, transformers, MPI or Gurobi), so `plan`, `verify`, `show` and `export` must run without them.

Each check runs the command line in a fresh interpreter in which importing torch, transformers,
safetensors, mpi4py, mpich or gurobipy raises ImportError and is recorded: a command that tries one
fails here even where it would have caught the error.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SPECS

BLOCKED = ("torch", "transformers", "safetensors", "mpi4py", "mpich", "gurobipy")

# Run in a child: block the packages, run each command line (a JSON list of argv lists), then
# print which blocked packages were asked for and which ended up imported.
_CHILD = """
import importlib.abc, json, sys
blocked, tried = set(sys.argv[1].split(",")), []

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            tried.append(name)
            raise ImportError(f"{name} is not installed (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, Block())
from llm_planner.cli import main as cli
for argv in json.loads(sys.argv[2]):
    code = cli.main(argv)
    if code != 0:
        sys.exit(f"exit {code}: llm-planner {' '.join(argv)}")
loaded = sorted({m.split(".")[0] for m in sys.modules} & blocked)
print("BLOCKED-IMPORTS", json.dumps({"tried": sorted(set(tried)), "loaded": loaded}))
"""


def _run_blocked(commands: list[list[str]], cwd: Path, timeout_s: float) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, ",".join(BLOCKED), json.dumps(commands)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(s for s in proc.stdout.splitlines() if s.startswith("BLOCKED-IMPORTS "))
    return json.loads(line.split(" ", 1)[1])


def test_serving_plan_verify_show_export_need_no_torch(tmp_path):
    cluster = str(SPECS / "rtx4090-workstation.yaml")
    plan = str(tmp_path / "serving.yaml")
    # at 10 ms: the bounds that plan, verify and export derive take a third of their time at 100 ms
    serving = ["--objective", "serving", "--prompt-len", "512", "--output-len", "128", "--tpot-slo", "10 ms"]
    commands = [
        ["plan", "--cluster", cluster, "--model", "gpt2", *serving, "--exportable", "vllm", "-o", plan],
        ["verify", plan],
        ["show", plan],
        ["export", plan, "--to", "vllm", "-o", str(tmp_path / "vllm")],
    ]
    assert _run_blocked(commands, tmp_path, timeout_s=120) == {"tried": [], "loaded": []}


@pytest.mark.heavy  # 6-7 s: CI's test command runs it after the default suite
def test_latency_and_throughput_plans_of_a_decoder_verify_show_models_need_no_torch(tmp_path):
    plan = str(tmp_path / "latency.yaml")
    commands = [
        ["plan", "--cluster", str(SPECS / "rtx4090-workstation.yaml"), "--model", "gpt2", "-o", plan],
        ["verify", plan],
        ["show", plan],
        ["models"],
        ["show-cluster", str(SPECS / "four-gpus.yaml")],
        ["plan", "--cluster", str(SPECS / "four-gpus.yaml"), "--model", "gpt2", "--objective", "throughput",
         "--batch", "4", "--export", "megatron", "-o", str(tmp_path / "throughput.yaml")],
    ]  # fmt: skip
    assert _run_blocked(commands, tmp_path, timeout_s=120) == {"tried": [], "loaded": []}


def test_a_cnn_without_torch_is_a_clear_error_and_the_check_sees_it(tmp_path):
    """The blocker itself, and the one model family that needs torch: ResNet-18 is traced with torch.fx, so
    planning it asks for torch (or transformers) and, without them, ends with exit 2 and a message naming
    what to install, not a traceback."""
    resnet = ["plan", "--cluster", str(SPECS / "four-gpus.yaml"), "--model", "resnet18", "-o", str(tmp_path / "r.yaml")]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, ",".join(BLOCKED), json.dumps([resnet])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "exit 2: llm-planner plan" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "needs torch and transformers" in proc.stderr and "is not installed" in proc.stderr
    assert "requirements.txt" in proc.stderr


def _readme_command_1() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"^# 1\. .*\n(.+)$", text, flags=re.MULTILINE)
    assert match, "README.md: no '# 1.' command"
    return match.group(1)


def test_readme_command_1_installs_the_planning_set_only():
    command = _readme_command_1()
    install = re.search(r"pip install (.+?) &&", command)
    assert install and install.group(1).split() == ["-r", "requirements-plan.txt", "-e", "."], command
    plan_pins = _pins(REPO / "requirements-plan.txt")
    assert not set(plan_pins) & {*BLOCKED, "pytest", "hypothesis"}
    # requirements.txt is the planning set plus the rest, each pinned once
    full = (REPO / "requirements.txt").read_text().splitlines()
    assert "-r requirements-plan.txt" in full
    assert not set(_pins(REPO / "requirements.txt")) & set(plan_pins)
    # `-e .` pulls in pyproject's dependencies: each must be pinned in the planning set
    pyproject = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", pyproject, flags=re.MULTILINE | re.DOTALL).group(1)
    names = {re.match(r'\s*"([A-Za-z0-9_.-]+)', d).group(1).lower() for d in deps.splitlines() if '"' in d}
    assert names <= set(plan_pins), names - set(plan_pins)


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not pinned with =="
            pins[name.lower()] = version
    return pins


@pytest.mark.slow
def test_readme_command_1_plans_without_torch(tmp_path):
    """README command 1's own `llm-planner plan` (GPT-3 175B on the six-server cluster, about 40 s)."""
    words = shlex.split(_readme_command_1())
    start = next(i for i, w in enumerate(words) if w.endswith("/llm-planner")) + 1
    argv = words[start : words.index("&&", start) if "&&" in words[start:] else len(words)]
    argv[argv.index("-o") + 1] = str(tmp_path / "gpt3-plan.yaml")
    commands = [argv, ["verify", str(tmp_path / "gpt3-plan.yaml")], ["show", str(tmp_path / "gpt3-plan.yaml")]]
    assert _run_blocked(commands, REPO, timeout_s=280) == {"tried": [], "loaded": []}
