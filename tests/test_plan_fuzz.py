"""Fuzzing plan files: one mutation of a valid plan file (a number changed or made infinite, a value of
another type, a field removed or renamed, a device swapped in `assignment`, a shard or a schedule
entry), then `verify`. It accepts the file only when the mutation leaves a plan that is genuinely
the same (or changed a field that only records how the plan was made); otherwise it rejects it,
with violations (exit 1) or one message that starts with the file and names the field (exit 2).
Never an exception other than those the CLI turns into exit 2."""

from __future__ import annotations

import copy
import math
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_files import DEVICES, verify_outcome, written_plan

# fields that record how the plan was made and cannot be re-derived: any valid value is accepted
RECORDS = (
    ("solver", "name"),
    ("solver", "backend"),
    ("solver", "time_s"),
    ("solver", "details"),
    ("solver", "status"),
    ("inputs", "options"),
    ("inputs", "max_shards"),
    ("inputs", "max_tp"),
    ("inputs", "profile_sha256"),
    ("inputs", "profile"),
)
NUMBERS = (math.inf, -math.inf, math.nan, 0, -1, 1e300)
OTHER_TYPES = ("soon", None, [], {}, True, "1e-3", [1, 2], {"a": 1})
FIELD = re.compile(r"^[A-Za-z_][\w\-]*(\[\d+\])?(\.[^ ]+?)*: ")  # `schedule[3].start_s: `, `inputs: `


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, tuple]:
    """objective -> (plan path, its document)."""
    out = {}
    for objective in ("latency", "throughput"):
        path = written_plan(tmp_path_factory.mktemp(objective), objective)
        out[objective] = (path, yaml.safe_load(path.read_text()))
    return out


def leaves(doc, prefix=()):
    """Every path into the document (mappings and lists included)."""
    yield prefix
    children = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, child in children:
        yield from leaves(child, (*prefix, key))


def at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutations(draw, doc):
    """(path, operation, new value or None); the operations of the module docstring."""
    path = draw(st.sampled_from([p for p in leaves(doc) if p]))
    value = at(doc, path)
    ops = ["type", "remove"] + (["rename"] if isinstance(path[-1], str) else [])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ops.append("number")
    if isinstance(value, str) and len(path) >= 2 and path[-2] == "assignment" or path[-1] == "device":
        ops.append("device")
    op = draw(st.sampled_from(ops))
    if op == "number":
        scaled = [value * f for f in (0.5, 1.5, 2)] + [value + 1, value - 1]
        new = draw(st.sampled_from([*NUMBERS, *scaled, value + 0.5]))
    elif op == "type":
        new = draw(st.sampled_from(OTHER_TYPES))
    elif op == "device":
        new = draw(st.sampled_from([*DEVICES, "node0/gone:0", ["node0/fast:0", "node0/small:0"]]))
    else:
        new = None
    return path, op, new


def mutate(doc, path, op, new):
    doc = copy.deepcopy(doc)
    parent, key = at(doc, path[:-1]), path[-1]
    if op == "remove":
        del parent[key]
    elif op == "rename":
        parent[f"{key}_x"] = parent.pop(key)
    else:
        parent[key] = new
    return doc


def same(a, b) -> bool:
    """Equal documents, NaN included (a NaN written over a NaN is no change)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return (
        type(a) is type(b) and a == b
        if not isinstance(a, (dict, list))
        else (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same(x, y) for x, y in (zip(a.values(), b.values()) if isinstance(a, dict) else zip(a, b)))
            and (not isinstance(a, dict) or list(a) == list(b))
        )
    )


# the default suite draws 200 mutations; test_many_mutated_plan_files (slow) draws MANY
MANY = 400
MUTATION = settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@MUTATION
@given(data=st.data())
@pytest.mark.heavy
def test_a_mutated_plan_file_is_accepted_only_when_it_is_the_same_plan(originals, tmp_path_factory, data):
    objective = data.draw(st.sampled_from(sorted(originals)))
    source, doc = originals[objective]
    path, op, new = data.draw(mutations(doc))
    mutated = mutate(doc, path, op, new)
    target = source.with_name("mutated.yaml")
    target.write_text(yaml.safe_dump(mutated, sort_keys=False))
    code, messages = verify_outcome(target)
    record = any(path[: len(r)] == r for r in RECORDS)
    if same(mutated, doc):
        assert code == 0, (path, op, new, messages)
    elif not record:
        assert code in (1, 2), f"accepted: {op} {path} -> {new!r}"
    if code == 2:
        assert len(messages) == 1 and messages[0].startswith(f"{target}: "), messages
        assert FIELD.match(messages[0][len(f"{target}: ") :]), messages[0]
    elif code == 1:
        assert messages and all(isinstance(m, str) and m for m in messages)


@pytest.mark.slow
@settings(MUTATION, max_examples=MANY)
@given(data=st.data())
def test_many_mutated_plan_files(originals, tmp_path_factory, data):
    """test_a_mutated_plan_file_is_accepted_only_when_it_is_the_same_plan at MANY mutations."""
    test_a_mutated_plan_file_is_accepted_only_when_it_is_the_same_plan.hypothesis.inner_test(
        originals=originals, tmp_path_factory=tmp_path_factory, data=data
    )
