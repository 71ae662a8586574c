"""Small valid input files and the mutations the input-hardening tests apply to them.

Documents are written by `emit`, a JSON writer that also takes `Dup` (a mapping that repeats
a key) and `Raw` (text written as is: `.inf`, `1e999`, YAML anchors); YAML files are written
in flow style, which YAML reads as it reads JSON. A mutation is (kind, what it did, new text
or bytes); `FILE_WIDE` kinds change the file as a whole, the others one field.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st


@dataclass(frozen=True)
class Raw:
    text: str


@dataclass(frozen=True)
class Dup:
    pairs: tuple[tuple[str, Any], ...]


def emit(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Dup):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {emit(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {emit(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(emit(v) for v in value) + "]"
    return json.dumps(value)


CLUSTER = {
    "name": "fuzz",
    "description": "two servers, a CPU and two GPUs each",
    "device_kinds": [
        {
            "name": "cpu0",
            "type": "cpu",
            "peak_flops": {"fp32": "1 TFLOP/s", "fp16": "1 TFLOP/s"},
            "mem_bytes": "64 GiB",
            "mem_bw_bytes_per_s": "100 GB/s",
            "overhead_s": "10 us",
        },
        {
            "name": "gpu0",
            "type": "gpu",
            "peak_flops": {"fp16": "100 TFLOP/s", "fp32": 2e13},
            "mem_bytes": "16 GB",
            "mem_bw_bytes_per_s": "900 GB/s",
            "compute_efficiency": 0.6,
            "usable_mem_fraction": 0.9,
        },
    ],
    "nodes": [{"name": "box", "count": 2, "hostname": "host-{i}", "devices": {"cpu0": 1, "gpu0": 2}}],
    "links": {
        "intra_node_default": {"bw_bytes_per_s": "25 GB/s", "latency_s": "10 us"},
        "intra_node": [{"between": ["gpu0", "gpu0"], "bw_bytes_per_s": "300 GB/s", "latency_s": "2 us"}],
        "inter_node": {"bw_bytes_per_s": "12.5 GB/s", "latency_s": "5 us"},
    },
}

GRAPH = {
    "format": "llm_planner.graph",
    "version": 1,
    "name": "fuzz-graph",
    "meta": {"source": "tests"},
    "tasks": [
        {
            "name": "embed",
            "kind": "embed",
            "flops_per_sample": 1e9,
            "bytes_per_sample": 1e6,
            "weight_bytes": 1e8,
            "mem_device_types": ["gpu"],
            "colocate_group": "ends",
        },
        {
            "name": "a",
            "flops_per_sample": 4e10,
            "bytes_per_sample": 2e6,
            "weight_bytes": 2e9,
            "mem_bytes_per_sample": 1e6,
            "workspace_bytes_per_sample": 1e5,
            "labels": {"layer": 0},
        },
        {"name": "b", "flops_per_sample": 4e10, "bytes_per_sample": 2e6, "weight_bytes": 2e9, "device_types": ["gpu"]},
        {"name": "c", "time_s_by_kind": {"cpu0": 0.002, "gpu0": 0.0005}},
        {
            "name": "head",
            "flops_per_sample": 1e9,
            "bytes_per_sample": 1e6,
            "weight_bytes": 1e8,
            "colocate_group": "ends",
        },
    ],
    "edges": [
        {"src": "embed", "dst": "a", "bytes_per_sample": 1e5},
        {"src": "embed", "dst": "b", "bytes_per_sample": 1e5},
        {"src": "a", "dst": "c", "bytes_per_sample": 1e5},
        {"src": "b", "dst": "c", "bytes_per_sample": 1e5, "hop_s_per_sample": 1e-5},
        {"src": "c", "dst": "head", "bytes_per_sample": 1e5},
    ],
}

WORKLOAD = {
    "maxFPGAs": 2,
    "maxCPUs": 1,
    "maxSizePerFPGA": 1000,
    "nodes": [
        {
            "id": 1,
            "name": "in",
            "cpuLatency": 5,
            "fpgaLatency": 1,
            "supportedOnFpga": 1,
            "size": 100,
            "colorClass": 7,
            "isBackwardNode": 0,
        },
        {"id": 2, "name": "x", "cpuLatency": 9, "fpgaLatency": 2, "supportedOnFpga": True, "size": 300, "layerId": 0},
        {"id": 3, "name": "y", "cpuLatency": 3, "fpgaLatency": 0, "supportedOnFpga": 0, "size": 0},
        {
            "id": 4,
            "name": "out",
            "cpuLatency": 4,
            "fpgaLatency": 1.5,
            "supportedOnFpga": 1,
            "size": 200,
            "colorClass": 7,
        },
    ],
    "edges": [
        {"sourceId": 1, "destId": 2, "cost": 0.5, "size": 10},
        {"sourceId": 1, "destId": 3, "cost": 0.5, "size": 10},
        {"sourceId": 2, "destId": 4, "cost": 0.25},
        {"sourceId": 3, "destId": 4, "cost": 1.0, "size": 4},
    ],
}

FILE_WIDE = ("encoding", "syntax", "nesting", "size")

# Values a field may be replaced with: wrong types, bad numbers (written as JSON or YAML would
# spell them), unknown names, templates with stray braces.
BAD_VALUES = [
    None,
    True,
    0,
    -1,
    7,
    1.5,
    -0.0,
    10**6,
    1e308,
    "",
    "x",
    "f16",
    "gpus",
    "1e999 GB/s",
    "NaN",
    "80 GiB",
    "2 us",
    "host-{j}",
    "host-{0}",
    "host-{i",
    "host-{i:03d}",
    "{}",
    "{i}{i}",
    [],
    [1],
    ["gpu", "cpux"],
    ["cpu"],
    {},
    {"a": 1},
    {"f16": 1},
    Raw("1e999"),
    Raw("-1e999"),
    Raw("NaN"),
    Raw("Infinity"),
    Raw("1" * 400),
    Raw("1" * 5000),
    # issue 26's families: tiny, huge and negative numbers; rich markup, escape sequences and
    # hostfile or option injection in text; long text
    5e-324,
    -1e-6,
    2**63,
    1_000_000,
    "[/]",
    "a[red]b[/red]",
    "a\x1b[2Jb\x07",
    "host\nevil:64",
    "-oProxyCommand=x",
    "x" * 2000,
]
# The cluster spec's own hostile families (a fuzzing review's hangs and tracebacks at load): huge
# counts, memory beyond any device, unitless and unlimited memory, compute and bandwidth out of range,
# lone surrogates (written as JSON escapes, which YAML decodes) and separators in names.
CLUSTER_VALUES = [
    10**9,
    10**18,
    2**63,
    "1e300 B",
    1e300,
    1e20,
    "1e20",
    "unlimited",
    "16 PiB",
    "17 PiB",
    "1e30 B/s",
    "1e25 FLOP/s",
    "1e-3 B/s",
    "box\udc80",
    "\udc80",
    "g:pu",
    "a/b",
    "a b",
    "host-{i}\udc80",
]
# The fields those values matter most in, drawn as often as any other field
CLUSTER_TARGETS = [
    ("nodes", 0, "count"),
    ("nodes", 0, "slots"),
    ("nodes", 0, "name"),
    ("nodes", 0, "hostname"),
    ("device_kinds", 0, "mem_bytes"),
    ("device_kinds", 1, "mem_bytes"),
    ("device_kinds", 1, "name"),
    ("device_kinds", 1, "peak_flops", "fp16"),
    ("links", "inter_node", "bw_bytes_per_s"),
    ("name",),
    ("description",),
]


@st.composite
def cluster_hostile_mutation(draw) -> tuple[str, str, str]:
    """(kind, description, text): one field of CLUSTER, a targeted one half the time, set to a CLUSTER_VALUES value."""
    doc = copy.deepcopy(CLUSTER)
    path = draw(st.one_of(st.sampled_from(CLUSTER_TARGETS), st.sampled_from(paths(doc))))
    value = draw(st.sampled_from(CLUSTER_VALUES))
    _set(doc, path, value)
    return "replace", f"{'.'.join(map(str, path))} = {value!r:.40}", emit(doc)


# Helix's files (cluster and machine profile INI files, a type's Python tables, its csv profiles) are
# numbers in text: each hostile value replaces one number. Expressions deep enough to exhaust Python's
# parser, integers past its 4,300-digit limit and just inside it, non-decimal spellings, a lone
# surrogate (written as the invalid UTF-8 bytes surrogatepass gives).
HELIX_VALUES = [
    "+".join(["1"] * 100_000),
    "-" * 100_000 + "1",
    "(" * 3000 + "1" + ")" * 3000,
    "9" * 5000,
    "9" * 4000,
    "1" + "0" * 30,
    "2000",
    "-1",
    "0",
    "1e999",
    "2**64",
    "0x10",
    "1_0",
    "1 + 1",
    "\udc80",
]


@st.composite
def number_mutation(draw, text: str) -> tuple[str, str]:
    """(description, text): one run of digits in `text` replaced by a HELIX_VALUES value."""
    spans = [m.span() for m in re.finditer(r"[0-9]+", text)]
    start, end = draw(st.sampled_from(spans))
    value = draw(st.sampled_from(HELIX_VALUES))
    return f"{value!r:.30} at {start}", text[:start] + value + text[end:]


# A transformers config.json of each family the planner reads; mutated like the other files.
CONFIG_LLAMA = {
    "model_type": "llama",
    "_name_or_path": "fuzz-llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
    "intermediate_size": 128,
    "vocab_size": 100,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}
CONFIG_GPT2 = {
    "model_type": "gpt2",
    "n_embd": 64,
    "n_head": 4,
    "n_layer": 2,
    "n_positions": 128,
    "vocab_size": 100,
    "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new",
}
YAML_VALUES = [Raw(".inf"), Raw("-.inf"), Raw(".nan"), Raw("~"), Raw("!!binary aGk="), Raw("2021-02-30")]


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (a tuple of keys and indices) in a document, the root excluded."""
    out = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return out
    for key, item in items:
        out.append((*prefix, key))
        out.extend(paths(item, (*prefix, key)))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def alias_bomb(levels: int = 9, width: int = 10) -> Raw:
    parts = ["&a0 [" + ", ".join(["1"] * width) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return Raw("[" + ", ".join(parts) + "]")


@st.composite
def field_mutation(draw, base: dict, yaml: bool) -> tuple[str, str, str]:
    """(kind, description, text): one field replaced, removed, renamed, repeated, or one key added."""
    doc = copy.deepcopy(base)
    path = draw(st.sampled_from(paths(doc)))
    parent, key = _parent(doc, path), path[-1]
    kind = draw(st.sampled_from(["replace", "replace", "replace", "remove", "rename", "add", "duplicate"]))
    if kind == "replace":
        value = draw(st.sampled_from(BAD_VALUES + (YAML_VALUES if yaml else [])))
        parent[key] = value
    elif kind == "remove":
        del parent[key]
    elif kind == "rename" and isinstance(key, str):
        parent[key + "x"] = parent.pop(key)
    elif kind == "add" and isinstance(parent, dict):
        parent["unknown_field"] = 1
    elif kind == "duplicate" and isinstance(parent, dict):
        repeated = Dup((*parent.items(), (key, parent[key])))
        if len(path) == 1:
            doc = repeated
        else:
            _set(doc, path[:-1], repeated)
    else:
        parent[key] = draw(st.sampled_from(BAD_VALUES))
        kind = "replace"
    return kind, f"{kind} {'.'.join(map(str, path))}", emit(doc)


def _set(doc: Any, path: tuple, value: Any) -> None:
    if not path:
        raise ValueError("the root cannot be replaced")
    _parent(doc, path)[path[-1]] = value


@st.composite
def file_mutation(draw, base: dict, yaml: bool) -> tuple[str, str, str | bytes]:
    """(kind, description, text or bytes): the file's encoding, syntax, nesting or size changed."""
    text = emit(base)
    kind = draw(st.sampled_from(FILE_WIDE))
    if kind == "encoding":
        how = draw(st.sampled_from(["latin-1", "utf-16", "byte"]))
        if how == "utf-16":
            return kind, "UTF-16 file", text.encode("utf-16")
        at = draw(st.integers(0, len(text)))
        raw = text.encode()
        if how == "latin-1":  # a Latin-1 name: é as one byte inside the first string
            at = raw.index(b'"', raw.index(b'"name"') + 6) + 1
        return kind, f"byte 0xe9 at {at}", raw[:at] + b"\xe9" + raw[at:]
    if kind == "syntax":
        at = draw(st.integers(1, len(text) - 1))
        return kind, f"cut at {at}", text[:at]
    doc = copy.deepcopy(base)
    path = draw(st.sampled_from(paths(doc)))
    if kind == "nesting":
        depth = draw(st.sampled_from([40, 3000]))
        _set(doc, path, Raw("[" * depth + "]" * depth))
        return kind, f"{depth} deep at {path}", emit(doc)
    _set(doc, path, alias_bomb() if yaml else Raw("[" + ", ".join(["{}"] * 60_000) + "]"))  # more tasks than MAX_TASKS
    return kind, f"a huge value at {path}", emit(doc)
