"""Fuzzing the input files: mutated cluster specs, graph files, workload files and model configs.

For every mutation (tests/input_mutations.py: wrong types, bad numbers (tiny, huge, beyond float
range), unknown names, stray braces, rich markup, escape sequences, hostfile and option injection,
long text, repeated keys, encodings, cut syntax, deep nesting, alias bombs and huge values) of a
cluster spec, a graph file, a workload file or a model's config.json, the CLI, called in-process,
either plans and the plan passes `verify`, or exits 2 with one message that names the file (and,
for a field mutation, a field) and no traceback, in seconds; no control character from a file
reaches the output. An exception other than the input errors escapes main() and fails the test.
Examples are derandomized: the same ones run every time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_planner.cli.main import main
from llm_planner.graph.transformer import DecoderConfig

sys.path.insert(0, str(Path(__file__).parent))
from input_mutations import (  # noqa: E402
    CLUSTER,
    CONFIG_GPT2,
    CONFIG_LLAMA,
    FILE_WIDE,
    GRAPH,
    WORKLOAD,
    cluster_hostile_mutation,
    emit,
    field_mutation,
    file_mutation,
    number_mutation,
)
from test_helix_plan import write_tables  # noqa: E402

EXAMPLES = 60

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _fields(doc) -> set[str]:
    """Every key of a document, nested ones included."""
    if isinstance(doc, dict):
        return set(map(str, doc)) | {k for v in doc.values() for k in _fields(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in _fields(v)}
    return set()


# Messages about how two valid-looking files fit together name both files and the thing
# that does not fit, not one field.
_ACROSS_FILES = ("memory cannot hold the model", "placement pairs")


def _check(argv: list[str], mutated: Path, base: dict, kind: str, what: str, workdir: Path) -> None:
    code, out, err = _run(argv)
    assert "Traceback" not in out + err, what
    assert "\x1b" not in out + err and "\x07" not in out + err, f"{what}: a control character reached the output"
    if code == 0:
        plan = argv[argv.index("-o") + 1]
        vcode, vout, verr = _run(["verify", plan])
        assert vcode == 0, f"{what}: the plan does not verify: {vout}{verr}"
        return
    assert code == 2, f"{what}: exit {code}: {out}{err}"
    message = " ".join(err.split())
    assert message.count("error:") == 1, f"{what}: {message}"
    assert str(mutated) in message, f"{what}: the message does not name {mutated}: {message}"
    if kind in FILE_WIDE or any(s in message for s in _ACROSS_FILES):
        return
    keys = _fields(base) | {f + "x" for f in _fields(base)} | {"unknown_field"}  # the names a mutation may write
    if base in (CONFIG_LLAMA, CONFIG_GPT2):  # a config's values are named as the decoder's fields
        keys |= {f.name for f in dataclasses.fields(DecoderConfig)} | {"name"}
    named = {f for f in keys if re.search(rf"\b{re.escape(f)}\b", message)}
    assert named or "[" in message, f"{what}: the message names no field: {message}"


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _fuzz_cluster(kind: str, what: str, content) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cluster = _write(tmp / "cluster.yaml", content)
        graph = _write(tmp / "graph.json", emit(GRAPH))
        argv = [
            "plan",
            "--graph",
            str(graph),
            "--cluster",
            str(cluster),
            "--no-baselines",
            "-o",
            str(tmp / "plan.yaml"),
        ]
        _check(argv, cluster, CLUSTER, kind, what, tmp)
        code, out, err = _run(["show-cluster", str(cluster)])
        assert code in (0, 2) and "Traceback" not in out + err, f"{what}: show-cluster exit {code}"


def _fuzz_graph(kind: str, what: str, content) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cluster = _write(tmp / "cluster.yaml", emit(CLUSTER))
        graph = _write(tmp / "graph.json", content)
        argv = [
            "plan",
            "--graph",
            str(graph),
            "--cluster",
            str(cluster),
            "--no-baselines",
            "-o",
            str(tmp / "plan.json"),
        ]
        _check(argv, graph, GRAPH, kind, what, tmp)


def _fuzz_workload(kind: str, what: str, content, objective: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        workload = _write(tmp / "workload.json", content)
        argv = [
            "plan",
            "--graph",
            str(workload),
            "--objective",
            objective,
            "--no-baselines",
            "-o",
            str(tmp / "plan.yaml"),
        ]
        _check(argv, workload, WORKLOAD, kind, what, tmp)


def _fuzz_config(kind: str, what: str, content) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "model").mkdir()
        config = _write(tmp / "model" / "config.json", content)
        cluster = _write(tmp / "cluster.yaml", emit(CLUSTER))
        argv = ["plan", "--model", str(tmp / "model"), "--cluster", str(cluster), "--no-baselines"]
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
        base = CONFIG_GPT2 if "n_embd" in text else CONFIG_LLAMA
        _check([*argv, "-o", str(tmp / "plan.yaml")], config, base, kind, what, tmp)


def _mutations(base: dict, yaml: bool):
    """Three field mutations to one of the whole file."""
    field = field_mutation(base, yaml=yaml)
    return st.one_of(field, field, field, file_mutation(base, yaml=yaml))


def test_the_unmutated_files_plan_and_verify():
    _fuzz_cluster("none", "unmutated cluster", emit(CLUSTER))
    _fuzz_graph("none", "unmutated graph", emit(GRAPH))
    _fuzz_workload("none", "unmutated workload", emit(WORKLOAD), "latency")
    _fuzz_config("none", "unmutated llama config", emit(CONFIG_LLAMA))
    _fuzz_config("none", "unmutated gpt2 config", emit(CONFIG_GPT2))


@pytest.mark.slow  # plans every mutated spec: over a minute on 2 cores
@FUZZ
@given(_mutations(CLUSTER, yaml=True))
def test_mutated_cluster_specs(mutation):
    _fuzz_cluster(*mutation)


@FUZZ
@given(_mutations(GRAPH, yaml=False))
def test_mutated_graph_files(mutation):
    _fuzz_graph(*mutation)


@FUZZ
@given(_mutations(WORKLOAD, yaml=False), st.sampled_from(["latency", "throughput"]))
@pytest.mark.heavy
def test_mutated_workload_files(mutation, objective):
    _fuzz_workload(*mutation, objective)


@settings(FUZZ, max_examples=EXAMPLES // 2)
@given(st.one_of(_mutations(CONFIG_LLAMA, yaml=False), _mutations(CONFIG_GPT2, yaml=False)))
def test_mutated_model_configs(mutation):
    _fuzz_config(*mutation)


@settings(FUZZ, max_examples=EXAMPLES // 2)
@given(cluster_hostile_mutation())
def test_hostile_cluster_specs(mutation):
    """Huge counts, implausible or unlimited memory, lone surrogates and separators in names."""
    _fuzz_cluster(*mutation)


def _helix_files(tmp: Path) -> list[Path]:
    cluster = write_tables(tmp)
    t4 = tmp / "llama2_70b" / "t4"
    return [cluster, cluster.with_name("machine_profiles.ini"), t4 / "llama2_70b_t4.py", t4 / "decode_bs2time.csv"]


@settings(FUZZ, max_examples=EXAMPLES // 2)
@given(st.data())
def test_mutated_helix_files(data):
    """One number of a Helix file replaced (tests/input_mutations.py: deep expressions, huge integers,
    other spellings): plan-helix writes a layout or exits 2 naming the file, no traceback."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = _helix_files(tmp)
        target = data.draw(st.sampled_from(files))
        what, text = data.draw(number_mutation(target.read_text()))
        target.write_bytes(text.encode("utf-8", "surrogatepass"))
        out = tmp / "layout.ini"
        argv = ["plan-helix", "--cluster", str(files[0]), "--profiles", str(tmp / "llama2_70b"), "--model", "gpt2"]
        code, stdout, err = _run([*argv, "-o", str(out)])
        what = f"{target.name}: {what}"
        assert "Traceback" not in stdout + err, what
        assert code in (0, 2), f"{what}: exit {code}: {stdout}{err}"
        if code == 0:
            assert out.exists(), what
            return
        message = " ".join(err.split())
        assert message.count("error:") == 1, f"{what}: {message}"
        assert any(str(f) in message for f in files), f"{what}: the message names no Helix file: {message}"


@pytest.mark.slow
@settings(FUZZ, max_examples=600)
@given(st.one_of(_mutations(CLUSTER, yaml=True), _mutations(GRAPH, yaml=False).map(lambda m: ("graph", m))))
def test_many_mutations(mutation):
    if mutation[0] == "graph":
        _fuzz_graph(*mutation[1])
    else:
        _fuzz_cluster(*mutation)
