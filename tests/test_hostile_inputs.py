"""Hostile and huge inputs to the cluster spec loader, the Helix readers and the plan reader: each
first example a fuzzing review found (a hang, a traceback, a name the launcher cannot use) exits 2
with one message naming the file and the field, called in-process. Hangs are guarded by a pytest
timeout, never by a clock in the test."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

from llm_planner.cli.main import main
from llm_planner.core.spec import MAX_DEVICES, load_cluster
from llm_planner.serving.api import MAX_SEARCH_CLASSES

sys.path.insert(0, str(Path(__file__).parent))
from input_mutations import CLUSTER, emit  # noqa: E402
from test_helix_plan import write_tables  # noqa: E402


def _refused(capsys, argv: list[str], *names: str) -> str:
    """Run the CLI; assert exit 2 with one `error:` line naming each of `names` and no traceback."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "Traceback" not in out + err and err.count("error:") == 1, err
    for name in names:
        assert name in err, f"{name!r} not in {err}"
    return err


def _spec(tmp_path: Path, mutate) -> Path:
    doc = copy.deepcopy(CLUSTER)
    mutate(doc)
    path = tmp_path / "cluster.yaml"
    path.write_text(emit(doc), encoding="utf-8")
    return path


@pytest.mark.timeout(60)
def test_a_billion_copies_of_a_server_are_refused_from_the_counts(tmp_path, capsys):
    spec = _spec(tmp_path, lambda d: d["nodes"][0].update(count=1_000_000_000))
    err = _refused(capsys, ["show-cluster", str(spec)], str(spec), "nodes:", f"the limit is {MAX_DEVICES:,}")
    assert "3,000,000,000 devices" in err


def test_huge_mpi_slots_are_refused(tmp_path, capsys):
    spec = _spec(tmp_path, lambda d: d["nodes"][0].update(slots=10**18))
    _refused(capsys, ["show-cluster", str(spec)], str(spec), "nodes[0].slots", f"1..{MAX_DEVICES:,}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "field, value, says",
    [
        ("mem_bytes", "1e300 B", "must be at most 16 PiB"),
        ("mem_bytes", "0.5", "must be at least 1 byte"),
        ("mem_bw_bytes_per_s", "1e30 B/s", "must be at most 10 PB/s"),
        ("kv_dequant_factor", "0.5", "must be from 1 to 100 (a slowdown"),
        ("dequant_factor", "1e300", "must be from 1 to 100 (a slowdown"),
        ("mem_efficiency", "1e-300", "must be in [0.001, 1]"),
        ("collective_efficiency", "1e-9", "must be in [0.001, 1]"),
        ("usable_mem_fraction", "1e-300", "must be in [0.001, 1]"),
    ],
)
def test_implausible_memory_and_bandwidth_are_refused_naming_the_field(tmp_path, capsys, field, value, says):
    spec = _spec(tmp_path, lambda d: d["device_kinds"][1].update({field: value}))
    _refused(capsys, ["show-cluster", str(spec)], str(spec), f"device_kinds[1].{field}", says)


@pytest.mark.timeout(60)
def test_implausible_flops_and_link_bandwidth_are_refused_naming_the_field(tmp_path, capsys):
    spec = _spec(tmp_path, lambda d: d["device_kinds"][0]["peak_flops"].update(fp32="1e25 FLOP/s"))
    _refused(capsys, ["show-cluster", str(spec)], "device_kinds[0].peak_flops.fp32", "at most 10 EFLOP/s")
    spec = _spec(tmp_path, lambda d: d["links"]["inter_node"].update(bw_bytes_per_s=1e-3))
    _refused(capsys, ["show-cluster", str(spec)], "links.inter_node.bw_bytes_per_s", "at least 1 byte/s")


@pytest.mark.timeout(120)
def test_unlimited_memory_is_refused_by_the_serving_planner_naming_the_field(tmp_path, capsys):
    spec = _spec(tmp_path, lambda d: d["device_kinds"][1].update(mem_bytes="unlimited"))
    assert _loads_unlimited(spec)  # placement plans may still use it (a CPU sharing host memory)
    argv = ["plan", "--model", "gpt2", "--cluster", str(spec), "--objective", "serving", "--tpot-slo", "50 ms"]
    argv += ["--prompt-len", "100", "--output-len", "100", "--no-baselines", "-o", str(tmp_path / "p.yaml")]
    _refused(capsys, argv, str(spec), "device_kinds[1].mem_bytes", "`unlimited` cannot be used for serving")


def _loads_unlimited(spec: Path) -> bool:
    return load_cluster(spec).device_kinds[1].mem_bytes == float("inf")


def test_a_lone_surrogate_in_a_node_name_is_refused(tmp_path, capsys):
    spec = _spec(tmp_path, lambda d: d["nodes"][0].update(name="box\udc80"))
    _refused(capsys, ["show-cluster", str(spec)], str(spec), "nodes[0].name", "lone surrogate")
    spec = _spec(tmp_path, lambda d: d.update(description="two\udc80servers"))
    _refused(capsys, ["show-cluster", str(spec)], str(spec), "description", "lone surrogate")


def _rename_kind(doc: dict, old: str, new: str) -> None:
    doc["device_kinds"][1]["name"] = new
    doc["nodes"][0]["devices"] = {new if k == old else k: n for k, n in doc["nodes"][0]["devices"].items()}
    doc["links"]["intra_node"][0]["between"] = [new, new]


@pytest.mark.parametrize("name", ["g:pu", "g/pu", "g pu", "g;rm"])
def test_a_kind_name_outside_the_safe_characters_is_refused(tmp_path, capsys, name):
    spec = _spec(tmp_path, lambda d: _rename_kind(d, "gpu0", name))
    _refused(capsys, ["show-cluster", str(spec)], str(spec), "device_kinds[1].name", "letters, digits")
    spec = _spec(tmp_path, lambda d: d["nodes"][0].update(name=name))
    _refused(capsys, ["show-cluster", str(spec)], str(spec), "nodes[0].name", "letters, digits")


def test_safe_kind_and_node_names_load(tmp_path, capsys):
    spec = _spec(tmp_path, lambda d: (_rename_kind(d, "gpu0", "A100_80g.v2"), d["nodes"][0].update(name="dgx.A-1_x")))
    assert main(["show-cluster", str(spec)]) == 0
    assert "dgx.A-1_x-1/A100_80g.v2:1" in {d.name for d in load_cluster(spec).devices()}


# ----------------------------------------------------------------------------
# Helix's files


def _helix(tmp_path: Path) -> tuple[Path, list[str]]:
    cluster = write_tables(tmp_path)
    argv = ["plan-helix", "--cluster", str(cluster), "--profiles", str(tmp_path / "llama2_70b"), "--model", "gpt2"]
    return cluster, argv


def _machines(cluster: Path, n: int) -> None:
    lines = ["[NodeNames]", f"total_compute_nodes={n}"]
    for i in range(n):
        lines += [f"[ComputeNode-{i}]", f"type={'A100' if i % 3 == 1 else 'T4'}"]
    cluster.write_text("\n".join([*lines, "[Link-0-1]", "bandwidth=2 * gbps", "latency=1 * MilliSec"]) + "\n")


@pytest.mark.timeout(60)
def test_a_helix_cluster_of_2000_machines_is_refused_at_load(tmp_path, capsys):
    cluster, argv = _helix(tmp_path)
    _machines(cluster, 2000)
    _refused(capsys, [*argv, "-o", str(tmp_path / "l.ini")], str(cluster), "total_compute_nodes", "[1, 1,024]")


@pytest.mark.timeout(60)
def test_a_helix_search_past_its_stage_shapes_is_refused_before_it_starts(tmp_path, capsys):
    cluster, argv = _helix(tmp_path)
    _machines(cluster, 300)  # 100 A100s x 8 layers + 200 T4s x 4 layers
    err = _refused(capsys, [*argv, "-o", str(tmp_path / "l.ini")], str(cluster), "1,600 stage shapes")
    assert "the limit is 1,536" in err and not (tmp_path / "l.ini").exists()


@pytest.mark.timeout(60)
def test_a_deep_expression_in_helix_files_is_refused_never_evaluated(tmp_path, capsys):
    cluster, argv = _helix(tmp_path)
    deep = "+".join(["1"] * 100_000)
    table = tmp_path / "llama2_70b" / "t4" / "llama2_70b_t4.py"
    table.write_text(f"x = {deep}\n" + table.read_text())
    _refused(capsys, [*argv, "-o", str(tmp_path / "l.ini")], str(table), "nested too deeply")
    table.write_text("vllm_num_blocks_dict = {1: 1 + 1}\ndecode_max_tokens_dict = {1: 8}\n")
    _refused(capsys, [*argv, "-o", str(tmp_path / "l.ini")], str(table), "vllm_num_blocks_dict", "integer literals")
    cluster.write_text(cluster.read_text().replace("total_compute_nodes=3", f"total_compute_nodes={deep}"))
    _refused(capsys, [*argv, "-o", str(tmp_path / "l.ini")], str(cluster), "total_compute_nodes", "expected an integer")


@pytest.mark.timeout(60)
def test_huge_numbers_in_helix_files_are_refused_naming_file_and_entry(tmp_path, capsys):
    _, argv = _helix(tmp_path)
    out = ["-o", str(tmp_path / "l.ini")]
    table = tmp_path / "llama2_70b" / "t4" / "llama2_70b_t4.py"
    good = table.read_text()
    for digits, says in ((5000, "more than 4,300 digits"), (4000, "outside layers 1..1,024")):
        table.write_text(good.replace("{1: 900", "{" + "9" * digits + ": 1, 1: 900"))
        _refused(capsys, [*argv, *out], str(table), says)
    table.write_text(good)
    csv = tmp_path / "llama2_70b" / "t4" / "decode_bs2time.csv"
    csv.write_text("0,0\n" + "9" * 5000 + ",1\n")
    _refused(capsys, [*argv, *out], str(csv), "line 2", "outside [0, 100,000,000]")
    write_tables(tmp_path)
    assert main([*argv, *out]) == 0
    capsys.readouterr()
    layout = tmp_path / "bad.ini"
    for text, says in (
        ("compute_node_2=[" + "9" * 5000 + "]", "a layer index"),
        ("compute_node_" + "9" * 5000 + "=[0]", "its machine index"),
    ):
        layout.write_text(f"[Solution]\n{text}\n")
        _refused(capsys, [*argv, "--score", str(layout)], str(layout), "line 2", "[Solution]", says)


# ----------------------------------------------------------------------------
# Plans


@pytest.mark.parametrize("seed, says", [("x", "expected an integer"), (None, "null"), (-1, ">= 0"), (2**64, "2**63")])
def test_a_seed_that_is_not_an_integer_is_refused_by_launch(tmp_path, capsys, monkeypatch, seed, says):
    from runtime_fixtures import decoder_plan, save_config, tiny_gpt2

    monkeypatch.chdir(tmp_path)
    plan = decoder_plan(tmp_path / "plan.yaml", save_config(tiny_gpt2(), tmp_path / "gpt2"), [{"embed": 0}])
    data = yaml.safe_load(plan.read_text())
    data["inputs"]["model"]["seed"] = seed
    plan.write_text(yaml.safe_dump(data))
    _refused(capsys, ["launch", str(plan), "--dry-run"], str(plan), "inputs.model.seed", says)


@pytest.mark.timeout(60)
def test_servers_written_one_template_each_past_the_search_limit_are_refused_quickly(tmp_path, capsys):
    """33 one-GPU templates, each its own server class: refused before the search (which grows faster
    than the classes), with the fix: identical servers as one template with `count`."""
    nodes = [{"name": f"n{i}", "devices": {"gpu": 1}} for i in range(MAX_SEARCH_CLASSES + 1)]
    doc = {
        "name": "listed",
        "device_kinds": [{"name": "gpu", "catalog": "a100-sxm-80g"}],
        "nodes": nodes,
        "links": {"inter_node": {"bw_bytes_per_s": "25 GB/s", "latency_s": "5 us"}},
    }
    spec = tmp_path / "listed.yaml"
    spec.write_text(emit(doc), encoding="utf-8")
    argv = ["plan", "--objective", "serving", "--cluster", str(spec), "--model", "gpt2", "--prompt-len", "128"]
    argv += ["--output-len", "64", "--tpot-slo", "50 ms", "-o", str(tmp_path / "p.yaml")]
    _refused(capsys, argv, "listed.yaml: nodes:", f"at most {MAX_SEARCH_CLASSES} server classes", "`count`")
