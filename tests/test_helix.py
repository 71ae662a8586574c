"""Helix interop (docs/helix.md): importing a Helix cluster and its layer profiles, the serving
profile reader, writing Helix layouts. Hand-written files in Helix's structure; no checkout needed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llm_planner.cli.main import main
from llm_planner.core.spec import load_cluster
from llm_planner.cost.serving_profile import ServingProfileError, load_serving_profile, parse_serving_profile
from llm_planner.helix.inputs import (
    HelixError,
    device_helix_names,
    load_helix_cluster,
    parse_helix_value,
    read_profile_csv,
)
from llm_planner.helix.layout_file import LayoutError, helix_layout, layout_ranges, read_helix_layout

# three machines: ComputeNode-0 a T4, -1 an A100, -2 a T4; the pair 0-2 is slower than the others
CLUSTER_INI = """\
# a small cluster in the structure of Helix's cluster files
[NodeNames]
total_compute_nodes=3

[SourceNode]
connected_nodes=[0, 1, 2]

[SinkNode]
connected_nodes=[0, 1, 2]

[ComputeNode-0]
type=T4
connected_nodes=['source', 1, 2, 'sink']

[ComputeNode-1]
type=A100
connected_nodes=['source', 0, 2, 'sink']

[ComputeNode-2]
type=T4
connected_nodes=['source', 0, 1, 'sink']

[Link-source-0]
bandwidth=2000 * mbps
latency=1 * MilliSec

[Link-source-1]
bandwidth=2000 * mbps
latency=1 * MilliSec

[Link-source-2]
bandwidth=2000 * mbps
latency=1 * MilliSec

[Link-0-sink]
bandwidth=2000 * mbps
latency=1 * MilliSec

[Link-1-sink]
bandwidth=2000 * mbps
latency=1 * MilliSec

[Link-2-sink]
bandwidth=2000 * mbps
latency=1 * MilliSec

[Link-0-1]
bandwidth=2000 * mbps
latency=1 * MilliSec

[Link-0-2]
bandwidth=500 * mbps
latency=3 * MilliSec

[Link-1-2]
bandwidth=2 * gbps
latency=2 * MilliSec
"""

PROFILES_INI = """\
[SourceNode]
inbound_nic_speed = -1
outbound_nic_speed = 10 * gbps
disk_speed = -1
vram_size = -1

[T4]
inbound_nic_speed = 10 * gbps
outbound_nic_speed = 10 * gbps
disk_speed = 1 * gbps
vram_size = 16 * GB

[T4x2]
inbound_nic_speed = 10 * gbps
outbound_nic_speed = 10 * gbps
disk_speed = 1 * gbps
vram_size = 32 * GB

[A100]
inbound_nic_speed = 10 * gbps
outbound_nic_speed = 400 * mbps
disk_speed = 1 * gbps
vram_size = 40 * GB
"""

# batch (or prompt tokens), milliseconds per layer
CSV = {
    "a100": ("0,0\n2,1.0\n4,1.5\n10,3.0\n", "0,0\n100,2\n200,5\n"),
    "t4": ("0,0\n2,4.0\n8,6.0\n", "0,0\n100,10\n300,40\n"),
}


def write_helix(tmp_path: Path, cluster: str = CLUSTER_INI, profiles: str = PROFILES_INI) -> Path:
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "cluster.ini").write_text(cluster)
    (tmp_path / "config" / "machine_profiles.ini").write_text(profiles)
    for gpu, (decode, prompt) in CSV.items():
        folder = tmp_path / "llama2_70b" / gpu
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "decode_bs2time.csv").write_text(decode)
        (folder / "prompt_bs2time.csv").write_text(prompt)
    return tmp_path / "config" / "cluster.ini"


def run_import(tmp_path: Path, cluster: Path) -> tuple[int, Path, Path]:
    out, profile = tmp_path / "cluster.yaml", tmp_path / "profile.yaml"
    code = main(
        [
            "import",
            "helix",
            "--cluster",
            str(cluster),
            "--profiles",
            str(tmp_path / "llama2_70b"),
            "-o",
            str(out),
            "--profile-out",
            str(profile),
        ]
    )
    return code, out, profile


def test_parse_helix_value():
    assert parse_helix_value("10 * gbps") == 1e10
    assert parse_helix_value("1000.0 * mbps") == 1e9
    assert parse_helix_value("1 * MilliSec") == 1e-3
    assert parse_helix_value("-1") == -1.0
    for bad in ("ten * gbps", "1 * parsecs", "2 ** 3", "__import__('os')"):
        with pytest.raises(ValueError):
            parse_helix_value(bad)


def test_import_cluster_spec(tmp_path, capsys):
    code, out, profile = run_import(tmp_path, write_helix(tmp_path))
    assert code == 0, capsys.readouterr().err
    spec = load_cluster(out)
    assert [(n.name, n.count, n.devices) for n in spec.nodes] == [
        ("a100", 1, (("a100-40g", 1),)),
        ("t4", 2, (("t4", 1),)),
    ]
    assert sorted(d.name for d in spec.devices()) == ["a100/a100-40g:0", "t4-0/t4:0", "t4-1/t4:0"]
    assert spec.kind("a100-40g").mem_bytes == 40e9 and spec.kind("t4").mem_bytes == 16e9
    assert spec.kind("t4").flops_for("fp16") == 65e12  # the data sheet's
    # slowest pair: A100's 400 Mb... (Helix: 4e8 bytes/s) outbound NIC on 0-1 and 1-2; 0-2 is 5e8; largest latency 3 ms
    assert spec.inter_node.bw_bytes_per_s == 4e8 and spec.inter_node.latency_s == pytest.approx(3e-3)
    assert "slowest pair" in out.read_text()
    # reversible names: copy i of a type is its i-th machine in Helix's order
    names = device_helix_names(load_helix_cluster(tmp_path / "config" / "cluster.ini"))
    assert names == {"t4-0/t4:0": "compute_node_2", "a100/a100-40g:0": "compute_node_3", "t4-1/t4:0": "compute_node_4"}
    assert "#   t4-1/t4:0 -> compute_node_4" in out.read_text()


def test_import_multi_gpu_machine(tmp_path, capsys):
    cluster = write_helix(tmp_path, CLUSTER_INI.replace("[ComputeNode-2]\ntype=T4", "[ComputeNode-2]\ntype=T4x2"))
    code, out, profile = run_import(tmp_path, cluster)
    assert code == 0, capsys.readouterr().err
    spec = load_cluster(out)
    assert dict((n.name, n.devices) for n in spec.nodes)["t4x2"] == (("t4", 2),)
    assert spec.kind("t4").mem_bytes == 16e9  # 32 GB over two GPUs
    names = device_helix_names(load_helix_cluster(cluster))
    assert names["t4x2/t4:0"] == names["t4x2/t4:1"] == "compute_node_4"
    assert "T4x2: left out" in profile.read_text()


def test_import_profiles_in_seconds(tmp_path):
    code, _, profile_path = run_import(tmp_path, write_helix(tmp_path))
    assert code == 0
    profile = load_serving_profile(profile_path)
    assert profile.model == "llama2-70b" and profile.dtype == "fp16"
    assert profile.kind("t4").decode.sizes == (0, 2, 8)
    assert profile.layer_time_s("a100-40g", 2) == pytest.approx(1e-3)
    assert profile.layer_time_s("a100-40g", 0, 150) == pytest.approx(3.5e-3)


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda c, p: (c.replace("bandwidth=500 * mbps", "bandwidth=fast"), p), "[Link-0-2] bandwidth"),
        (lambda c, p: (c.replace("[NodeNames]\ntotal_compute_nodes=3\n", ""), p), "[NodeNames]"),
        (lambda c, p: (c.replace("type=A100", "type=H100"), p), "[ComputeNode-1] type"),
        (lambda c, p: (c.replace("latency=2 * MilliSec", "latency=-2 * MilliSec"), p), "[Link-1-2] latency"),
        # past a plausible link: import had named its own output spec, plan-helix had planned 0 tokens/s
        (lambda c, p: (c.replace("latency=2 * MilliSec", "latency=1e300 * MilliSec"), p), "[Link-1-2] latency"),
        (lambda c, p: (c.replace("bandwidth=500 * mbps", "bandwidth=1e-300 * mbps"), p), "[Link-0-2] bandwidth"),
        (lambda c, p: (c.replace("[Link-0-2]", "[Link-0-7]"), p), "[Link-0-7]"),
        (lambda c, p: (c, p.replace("vram_size = 40 * GB", "vram_size = 40 * GiB")), "[A100] vram_size"),
        (lambda c, p: (c + "[broken\n", p), "not a valid INI file"),
    ],
)
def test_bad_helix_files_exit_2_naming_file_and_field(tmp_path, capsys, mutate, where):
    cluster, profiles = mutate(CLUSTER_INI, PROFILES_INI)
    code, out, _ = run_import(tmp_path, write_helix(tmp_path, cluster, profiles))
    err = capsys.readouterr().err.replace("\n", "")
    assert code == 2
    assert ".ini" in err and where in err
    assert err.count(".ini: ") == 1, err  # the file named once, not once per layer of the reader
    assert not out.exists()


@pytest.mark.parametrize(
    "csv, problem",
    [
        ("0,0\n4,1\n2,3\n", "sizes must increase"),
        ("0,0\n2,-1\n", "time must be from 0 to 60,000 ms"),
        ("0,0\n2,nan\n", "time must be from 0 to 60,000 ms"),
        ("0,0\n2,1e300\n", "time must be from 0 to 60,000 ms"),  # had planned 0 tokens/s
        ("0,0\n2,1e-300\n", "time must be 0 or at least 1e-06 ms"),  # import helix had named its own output
        ("0;0\n2;1\n", "size,milliseconds"),
        ("2,1\n", "at least two rows"),
    ],
)
def test_bad_profile_csv(tmp_path, capsys, csv, problem):
    write_helix(tmp_path)
    bad = tmp_path / "llama2_70b" / "t4" / "decode_bs2time.csv"
    bad.write_text(csv)
    with pytest.raises(HelixError, match=problem):
        read_profile_csv(bad)
    code, _, _ = run_import(tmp_path, tmp_path / "config" / "cluster.ini")
    assert code == 2 and "decode_bs2time.csv" in capsys.readouterr().err.replace("\n", "")


def test_missing_profile_file_exit_2(tmp_path, capsys):
    write_helix(tmp_path)
    (tmp_path / "llama2_70b" / "a100" / "prompt_bs2time.csv").unlink()
    code, _, _ = run_import(tmp_path, tmp_path / "config" / "cluster.ini")
    assert code == 2 and "prompt_bs2time.csv: cannot read" in capsys.readouterr().err.replace("\n", "")


# ----------------------------------------------------------------------------
# serving profile reader

PROFILE = {
    "format": "serving-profile/1",
    "model": "m",
    "dtype": "fp16",
    "source": "hand-written",
    "kinds": {
        "g": {"decode_layer_s": [[1, 1.0], [3, 2.0], [5, 2.0]], "prefill_layer_s": [[100, 0.5], [200, 1.5]]},
        "d": {"decode_layer_s": [[0, 0.0], [10, 1.0]]},
    },
}


def test_interpolation_and_extrapolation():
    p = parse_serving_profile(PROFILE)
    t = lambda b, tok=0: p.layer_time_s("g", b, tok)  # noqa: E731
    assert t(1) == 1.0 and t(3) == 2.0 and t(2) == 1.5 and t(4) == 2.0  # points and between
    assert t(7) == 2.0  # past the last point: the last segment (flat) extended
    assert p.layer_time_s("d", 25) == pytest.approx(2.5)  # extended linearly
    assert t(0) == 0.0  # no decode work costs nothing
    assert p.layer_time_s("g", 0, 150) == pytest.approx(1.0)
    assert p.layer_time_s("g", 0, 50) == 0.0  # before the first point, floored at 0
    assert t(2, 300) == pytest.approx(1.5 + 2.5)  # a mixed iteration pays both
    with pytest.raises(ValueError, match="no prefill_layer_s"):
        p.layer_time_s("d", 1, 10)
    with pytest.raises(ValueError, match="no entry for device kind 'x'"):
        p.layer_time_s("x", 1)


def _with(kind_g: dict | None = None, **top) -> dict:
    data = {**PROFILE, **top}
    if kind_g is not None:
        data["kinds"] = {"g": kind_g}
    return data


@pytest.mark.parametrize(
    "data, message",
    [
        (_with({"decode_layer_s": [[1, 1.0], [1, 2.0]]}), "kinds.g.decode_layer_s[1]: sizes must increase"),
        (_with({"decode_layer_s": [[2, 1.0], [1, 2.0]]}), "kinds.g.decode_layer_s[1]: sizes must increase"),
        (
            _with({"decode_layer_s": [[1, 1.0], [2, -0.1]]}),
            "kinds.g.decode_layer_s[1]: seconds must be a finite number >= 0",
        ),
        (_with({"decode_layer_s": [[1, 1.0], [2, math.inf]]}), "seconds must be a finite number >= 0"),
        (_with({"decode_layer_s": [[1.5, 1.0], [2, 1.0]]}), "size must be an integer >= 0"),
        (_with({"decode_layer_s": [[1, 1.0]]}), "kinds.g.decode_layer_s: expected a list of at least two"),
        (_with({"prefill_layer_s": [[1, 1.0], [2, 1.0]]}), "kinds.g.decode_layer_s: missing required field"),
        (_with({"decode_layer_s": [[1, 1.0], [2, 1.0]], "decode_s": 1}), "kinds.g: unknown key(s) 'decode_s'"),
        (_with(format="serving-profile/3"), "format: unknown format 'serving-profile/3'"),
        (_with(kinds={}), "kinds: expected at least one device kind"),
    ],
)
def test_profile_errors_name_the_field(data, message):
    with pytest.raises(ServingProfileError) as info:
        parse_serving_profile(data, source="p.yaml")
    assert str(info.value).startswith("p.yaml: ") and message in str(info.value)


def test_profile_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "profile.yaml"
    bad.write_text(
        "format: serving-profile/1\nmodel: m\ndtype: fp16\nkinds:\n  g:\n    decode_layer_s: [[1, 1.0], [2, .inf]]\n"
    )
    with pytest.raises(ServingProfileError) as info:
        load_serving_profile(bad)
    assert str(info.value) == f"{bad}: kinds.g.decode_layer_s[1][1]: inf is not a finite number"
    assert issubclass(ServingProfileError, ValueError)


# ----------------------------------------------------------------------------
# layouts

NAMES = {
    "a100/a100-40g:0": "compute_node_3",
    "t4-0/t4:0": "compute_node_2",
    "t4-1/t4:0": "compute_node_4",
    "t4x2/t4:0": "compute_node_5",
    "t4x2/t4:1": "compute_node_5",
}


def test_layout_text_exact():
    text = helix_layout(
        [("a100/a100-40g:0", 0, 3), ("t4-1/t4:0", 3, 5), ("ComputeNode-0", 0, 2), ("compute_node_5", 2, 5)],
        NAMES,
        num_layers=5,
    )
    assert text == (
        "[Settings]\noffset=2\n\n[Solution]\ncompute_node_2=[0, 1]\ncompute_node_3=[0, 1, 2]\n"
        "compute_node_4=[3, 4]\ncompute_node_5=[2, 3, 4]\n"
    )
    assert read_helix_layout(text) == {
        "compute_node_2": (0, 2),
        "compute_node_3": (0, 3),
        "compute_node_4": (3, 5),
        "compute_node_5": (2, 5),
    }


def test_layout_group_devices_share_their_machine():
    assert layout_ranges([("t4x2/t4:0", 0, 4), ("t4x2/t4:1", 0, 4)], NAMES) == {"compute_node_5": (0, 4)}
    with pytest.raises(LayoutError, match="one contiguous range"):
        layout_ranges([("t4x2/t4:0", 0, 4), ("t4x2/t4:1", 4, 8)], NAMES)


@pytest.mark.parametrize(
    "stages, message",
    [
        ([("t4-0/t4:0", 0, 3), ("t4-1/t4:0", 4, 6)], "no chain of ranges covers layers 0..5"),
        ([("t4-0/t4:0", 0, 7)], "past the model's 6 layers"),
        ([("t4-0/t4:0", 3, 3)], "not a non-empty range"),
        ([("gpu-9/h100:0", 0, 6)], "'gpu-9/h100:0' is not a Helix node name"),
        ([("compute_node_1", 0, 6)], "is not a Helix node name"),
    ],
)
def test_layout_errors(stages, message):
    with pytest.raises(LayoutError, match=message):
        helix_layout(stages, NAMES, num_layers=6)


def test_read_layout_refuses_gaps():
    with pytest.raises(LayoutError, match="x.ini: line 5: .Solution. compute_node_2: layers"):
        read_helix_layout("[Settings]\noffset=2\n\n[Solution]\ncompute_node_2=[0, 1, 3]\n", "x.ini")


@pytest.mark.parametrize(
    "solution, says",
    [
        ('compute_node_2=[0, 1, "x2"]', r"line 5: \[Solution\] 'compute_node_2': .* is not a list of layer indices"),
        ("compute_node_2=[0, 1] junk 12", "is not a list of layer indices"),
        ("compute_node_2=[0, 1]\ncompute_node_2=[2, 3]", r"line 6: \[Solution\] 'compute_node_2' is given twice"),
        ("compute_node_2=[0, 1]\ngarbage line", "line 6: 'garbage line' is neither a .section. nor a key=value line"),
    ],
)
def test_read_layout_refuses_what_is_not_a_layout(solution, says):
    """An audit's garbage had been read: a quoted "x2" as 2, a stray line skipped, a key given twice kept once."""
    with pytest.raises(LayoutError, match=says):
        read_helix_layout(f"[Settings]\noffset=2\n\n[Solution]\n{solution}\n", "x.ini")
    with pytest.raises(LayoutError, match=r"line 2: \[Settings\] offset: '-7'; the layouts read here use 2"):
        read_helix_layout("[Settings]\noffset=-7\n\n[Solution]\ncompute_node_2=[0, 1]\n", "x.ini")
