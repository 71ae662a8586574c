"""What `llm-planner export --to vllm|sglang` writes cannot be turned against the operator who runs it.

- Hosts: a node without `hostname:` would be exported under its name; a name that is not a host name
  or an address (core/names.py) is refused, exit 2, naming the spec file and the node. And every value
  of a script is quoted where it is written: a script rendered with hostile hosts (past the check) still
  parses and runs nothing but its own commands. Scripts are run for real with `bash SCRIPT HOST` in a
  scratch folder, PATH holding only stubs of vllm, ray and python3 (and a real `touch`, so that an
  injected `touch PWNED` would leave its file).
- Verify: export writes only what `llm-planner verify` accepts (exit 2 with verify's violations).
- Copies: a template with count > 1 cannot give its copies one fixed hostname (refused at spec load).

Plans with hostile node names are the plan of a benign two-node cluster with one node renamed in the
spec and in the plan (its hash updated): what planning on the renamed spec gives, without planning again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_planner.cli.main import main
from llm_planner.core.fmt import quote
from llm_planner.core.spec import SpecError, load_cluster
from llm_planner.export.serving import build_engines
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.launch.launch_types import LaunchError
from llm_planner.launch.mpiexec_run import hostfile_of
from llm_planner.serving.plan_file import load_serving_plan

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="needs bash")

# Two servers of three 6 GB GPUs, no hostnames: llama2-7b (13.5 GB in fp16) is a pipeline over both.
TOKEN = "boxa"  # the node the tests rename
SPEC = {
    "name": "two-boxes",
    "device_kinds": [
        {
            "name": "g6",
            "type": "gpu",
            "peak_flops": {"fp16": "120 TFLOP/s"},
            "mem_bytes": "6 GB",
            "mem_bw_bytes_per_s": "300 GB/s",
            "compute_efficiency": 0.6,
            "mem_efficiency": 0.8,
            "usable_mem_fraction": 0.88,
        }
    ],
    "nodes": [{"name": TOKEN, "devices": {"g6": 3}}, {"name": "boxb", "devices": {"g6": 3}}],
    "links": {
        "intra_node_default": {"bw_bytes_per_s": "32 GB/s", "latency_s": "5 us"},
        "inter_node": {"bw_bytes_per_s": "25 GB/s", "latency_s": "5 us"},
    },
}
NOT_A_HOST = "box_a"  # a valid node name (the spec's name rule), not a valid host name
HOSTILE = ["$(touch PWNED)", 'a"b', "`touch PWNED`", "x;touch PWNED", "x\ntouch PWNED", "'$(touch PWNED)'"]


def _run(argv: list[str]) -> tuple[int, str, str]:
    """The CLI in-process: (exit code, stdout, stderr with whitespace runs made one space)."""
    from llm_planner.cli import main as cli

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        cli.console.file, cli.err_console.file = out, err
        try:
            code = main(argv)
        finally:
            cli.console.file = cli.err_console.file = None
    return code, out.getvalue(), " ".join(err.getvalue().split())


@pytest.fixture(scope="module")
def benign(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("benign")
    (folder / "c.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    plan = folder / "p.yaml"
    flags = ["--objective", "serving", "--prompt-len", "256", "--output-len", "64", "--no-baselines"]
    argv = ["plan", "--cluster", str(folder / "c.yaml"), "--model", "llama2-7b", *flags, "--tpot-slo", "100 ms"]
    assert _run([*argv, "--max-tp", "1", "--exportable", "vllm", "-o", str(plan)])[0] == 0
    assert TOKEN in plan.read_text()
    return plan


def _renamed(value, name: str):
    if isinstance(value, str):
        return value.replace(TOKEN, name)
    if isinstance(value, list):
        return [_renamed(v, name) for v in value]
    if isinstance(value, dict):
        return {_renamed(k, name): _renamed(v, name) for k, v in value.items()}
    return value


def renamed_plan(benign: Path, folder: Path, name: str) -> Path:
    """The benign plan with node `boxa` called `name` in its spec and in the plan, the spec's hash updated."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "c.yaml"
    text = yaml.safe_dump(_renamed(SPEC, name), sort_keys=False)
    spec.write_text(text)
    data = _renamed(yaml.safe_load(benign.read_text()), name)
    data["inputs"].update(cluster=str(spec), cluster_sha256=hashlib.sha256(text.encode()).hexdigest())
    plan = folder / "p.yaml"
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    return plan


def stub_path(folder: Path) -> str:
    """A PATH of stubs that exit at once (vllm, ray, python3) and a real touch."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for stub in ("vllm", "ray", "python3"):
        (bin_dir / stub).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / stub).chmod(0o755)
    touch = bin_dir / "touch"
    if not touch.exists():
        touch.symlink_to(shutil.which("touch"))
    return str(bin_dir)


def run_script(script: Path, host: str, folder: Path) -> subprocess.CompletedProcess:
    """`bash SCRIPT HOST` in a scratch folder under `folder`, PATH the stubs only."""
    scratch = folder / "run"
    scratch.mkdir(exist_ok=True)
    env = {"PATH": stub_path(folder), "HOME": str(scratch)}
    return subprocess.run([BASH, str(script), host], cwd=scratch, env=env, capture_output=True, text=True, timeout=60)


def assert_harmless(script: Path, hosts: list[str], folder: Path) -> None:
    """The script parses, and run as any of its hosts or as another one leaves no PWNED file anywhere."""
    parsed = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    for host in [*hosts, "somehost"]:
        done = run_script(script, host, folder)
        assert done.returncode == (0 if host in hosts else 2), (host, done.stderr)
        assert "command not found" not in done.stderr, (host, done.stderr)
    assert not [p for p in folder.rglob("*PWNED*")], sorted(map(str, folder.rglob("*")))


@needs_bash
def test_the_harness_sees_an_injection(tmp_path):
    """A line that does not quote its value runs it: the harness finds the file it leaves."""
    script = tmp_path / "bad.sh"
    script.write_text('echo "host $1 (hosts: $(touch PWNED))"\n')
    run_script(script, "x", tmp_path)
    assert list(tmp_path.rglob("PWNED"))


@pytest.mark.heavy
def test_benign_names_export_and_the_renaming_keeps_the_plan_valid(benign, tmp_path):
    plan = renamed_plan(benign, tmp_path / "ok", "gpu-a.example")
    assert _run(["verify", str(plan)])[0] == 0
    code, text, err = _run(["export", str(plan), "--to", "vllm", "-o", str(tmp_path / "serve.sh")])
    assert code == 0, err
    assert "gpu-a.example)" in (tmp_path / "serve.sh").read_text()


@needs_bash
@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("to", ["vllm", "sglang"])
def test_hostile_node_names_are_refused_naming_file_and_node(benign, tmp_path, name, to):
    plan = renamed_plan(benign, tmp_path / "spec", name)
    out = tmp_path / "serve.sh"
    code, _, err = _run(["export", str(plan), "--to", to, "-o", str(out)])
    assert code == 2, err
    assert str(tmp_path / "spec" / "c.yaml") in err and "nodes[0]" in err  # refused where the spec is read
    assert " ".join(quote(name).split()) in err
    assert "Traceback" not in err and not out.exists()
    assert not list(tmp_path.rglob("*PWNED*"))


@pytest.mark.parametrize("to", ["vllm", "sglang"])
def test_a_node_name_that_is_no_host_is_refused_where_it_would_reach_a_script(benign, tmp_path, to):
    """A safe name (letters, digits, - _ .) is not always a host: `box_a` passes the spec's name rule and is
    refused by the export's host check, which says how to give the node a host."""
    plan = renamed_plan(benign, tmp_path / "spec", NOT_A_HOST)
    out = tmp_path / "serve.sh"
    code, _, err = _run(["export", str(plan), "--to", to, "-o", str(out)])
    assert code == 2, err
    assert str(tmp_path / "spec" / "c.yaml") in err and "nodes[0]" in err and "set `hostname:`" in err
    assert quote(NOT_A_HOST) in err and not out.exists()


def test_megatron_sizes_name_no_host_and_export_with_any_node_name(benign, tmp_path):
    plan = renamed_plan(benign, tmp_path / "spec", NOT_A_HOST)
    code, text, err = _run(["export", str(plan), "--to", "megatron"])
    assert code == 0, err
    devices = [d for p in json.loads(text)["patterns"] for copy in p["devices"] for stage in copy for d in stage]
    assert f"{NOT_A_HOST}/g6:0" in devices


@needs_bash
@pytest.mark.parametrize("render", [vllm_script, sglang_script])
def test_scripts_quote_every_host_they_write(benign, tmp_path, render):
    """Past the host check (the engines' hosts replaced by hostile ones), every line still quotes them."""
    served = load_serving_plan(benign)
    export = build_engines(served, load_cluster(served.input_path("cluster")), "vllm")
    hosts = {"boxa": HOSTILE[0], "boxb": HOSTILE[4]}  # the pipeline spans both: Ray / dist-init lines too
    engines = tuple(
        dataclasses.replace(e, stages=tuple(dataclasses.replace(s, host=hosts[s.node]) for s in e.stages))
        for e in export.engines
    )
    hostile = dataclasses.replace(export, engines=engines, model="$(touch PWNED)", dtype="`touch PWNED`")
    script = tmp_path / "serve.sh"
    script.write_text(render(hostile))
    assert_harmless(script, list(hosts.values()), tmp_path)


VALID = r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?(\.[a-z0-9]{1,4}){0,2}"
SHELL = "$`\"';&|<>(){}*?! \\\n"


# the default suite exports 8 random names (each export verifies the plan first), the slow twin 16
NAMES = settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NODE_NAMES = (
    st.one_of(
        st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=20),
        st.tuples(st.text("ab-.", max_size=3), st.sampled_from(HOSTILE)).map("".join),
        st.tuples(st.from_regex(VALID, fullmatch=True), st.sampled_from(SHELL), st.text("ab", max_size=2)).map("".join),
        st.from_regex(VALID, fullmatch=True),  # host names: exported, and the script run as each of its hosts
    ),
    st.sampled_from(["vllm", "sglang"]),
)


@needs_bash
@NAMES
@given(*NODE_NAMES)
def test_random_node_names_are_refused_or_harmless(benign, tmp_path_factory, name, to):
    folder = tmp_path_factory.mktemp("fuzz")
    plan = renamed_plan(benign, folder / "spec", name)
    out = folder / "serve.sh"
    code, _, err = _run(["export", str(plan), "--to", to, "-o", str(out)])
    assert code in (0, 2) and "Traceback" not in err, err
    if code == 2:
        assert not out.exists() and err.startswith("error: ")
    else:
        assert_harmless(out, [name, "boxb"], folder)
    assert not list(folder.rglob("*PWNED*"))


@needs_bash
@pytest.mark.slow
@settings(NAMES, max_examples=16)
@given(*NODE_NAMES)
def test_many_random_node_names(benign, tmp_path_factory, name, to):
    """test_random_node_names_are_refused_or_harmless at 16 names."""
    test_random_node_names_are_refused_or_harmless.hypothesis.inner_test(benign, tmp_path_factory, name, to)


def test_export_refuses_a_plan_verify_rejects(benign, tmp_path):
    """More sequences in flight than the GPUs' memory holds (the fuzzing review's --max-num-seqs 13584)."""
    data = yaml.safe_load(benign.read_text())
    data["inputs"]["cluster"] = str(benign.parent / "c.yaml")
    data["serving"]["replicas"][0]["concurrency"] = 13584
    plan = tmp_path / "edited.yaml"
    plan.write_text(yaml.safe_dump(data, sort_keys=False))
    code, _, verify_err = _run(["verify", str(plan)])
    assert code == 1
    for to in ("vllm", "sglang", "megatron"):
        out = tmp_path / f"out.{to}"
        code, _, err = _run(["export", str(plan), "--to", to, "-o", str(out)])
        assert code == 2 and not out.exists(), err
        assert f"{plan}: `llm-planner verify` rejects this plan" in err and "replicas[0]" in err, err
    assert _run(["export", str(benign), "--to", "vllm", "-o", str(tmp_path / "ok.sh")])[0] == 0


def test_plan_export_refuses_a_plan_verify_rejects(tmp_path, monkeypatch):
    """`plan --export` writes the plan, then exports it only if verify accepts the file."""
    from llm_planner.cli import commands

    rejected = SimpleNamespace(ok=False, violations=["objective_s: 1 s, the simulation gives 2 s"])
    monkeypatch.setattr(commands, "verify_plan_file", lambda path: rejected)
    cluster = Path(__file__).resolve().parents[1] / "cluster_specs" / "four-gpus.yaml"
    out = tmp_path / "p.yaml"
    argv = ["plan", "--cluster", str(cluster), "--model", "gpt2", "--objective", "throughput", "--batch", "4"]
    argv += ["--no-baselines", "-o", str(out)]
    code, _, err = _run([*argv, "--export", "megatron"])
    assert code == 2 and out.exists() and not out.with_suffix(".megatron.json").exists(), err
    assert "`llm-planner verify` rejects this plan (1 violation(s)); no megatron configuration written" in err
    assert "objective_s: 1 s, the simulation gives 2 s" in err


def test_copies_of_a_template_with_one_fixed_hostname_are_refused(tmp_path):
    spec = dict(SPEC, nodes=[{"name": "box", "count": 2, "hostname": "gpu.example", "devices": {"g6": 3}}])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match=r"c\.yaml: nodes\[0\]\.hostname: 'gpu\.example' gives copies 0 and 1"):
        load_cluster(path)
    code, _, err = _run(["show-cluster", str(path)])
    assert code == 2 and "node 'box' (count: 2)" in err and "write {i}" in err
    spec["nodes"][0]["hostname"] = "gpu-{i}.example"  # one host per copy
    path.write_text(yaml.safe_dump(spec))
    assert [d.hostname for d in load_cluster(path).devices()][::3] == ["gpu-0.example", "gpu-1.example"]


def test_hostfiles_refuse_what_is_not_a_host(tmp_path):
    assert hostfile_of([("a.example", "r0"), ("a.example", "r1"), ("10.0.0.2", "r2")]) == "a.example:2\n10.0.0.2:1\n"
    with pytest.raises(LaunchError, match=r"^plan\.yaml: rank 1 \(x/g:0\): 'x\\nevil:9' is not a host name"):
        hostfile_of([("a.example", "r0"), ("x\nevil:9", "plan.yaml: rank 1 (x/g:0)")], LaunchError)
