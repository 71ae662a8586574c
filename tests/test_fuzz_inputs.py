"""Fuzzing the input files: mutated cluster specs, graph files and workload files.

For every mutation (tests/input_mutations.py: wrong types, bad numbers, unknown names, stray
braces, repeated keys, encodings, cut syntax, deep nesting, alias bombs and huge values) the
CLI, called in-process, either plans and the plan passes `verify`, or exits 2 with one
message that names the file (and, for a field mutation, a field) and no traceback, in
seconds. An exception other than the input errors escapes main() and fails the test.
Examples are derandomized: the same ones run every time.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_planner.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from input_mutations import CLUSTER, FILE_WIDE, GRAPH, WORKLOAD, emit, field_mutation, file_mutation  # noqa: E402

SECONDS_PER_RUN = 20.0  # far above what any example takes; a hang fails here or at the test timeout
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
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    elapsed = time.perf_counter() - started
    assert elapsed < SECONDS_PER_RUN, f"{argv[0]} took {elapsed:.1f} s"
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


def _mutations(base: dict, yaml: bool):
    """Three field mutations to one of the whole file."""
    field = field_mutation(base, yaml=yaml)
    return st.one_of(field, field, field, file_mutation(base, yaml=yaml))


def test_the_unmutated_files_plan_and_verify():
    _fuzz_cluster("none", "unmutated cluster", emit(CLUSTER))
    _fuzz_graph("none", "unmutated graph", emit(GRAPH))
    _fuzz_workload("none", "unmutated workload", emit(WORKLOAD), "latency")


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
def test_mutated_workload_files(mutation, objective):
    _fuzz_workload(*mutation, objective)


@pytest.mark.slow
@settings(FUZZ, max_examples=600)
@given(st.one_of(_mutations(CLUSTER, yaml=True), _mutations(GRAPH, yaml=False).map(lambda m: ("graph", m))))
def test_many_mutations(mutation):
    if mutation[0] == "graph":
        _fuzz_graph(*mutation[1])
    else:
        _fuzz_cluster(*mutation)
