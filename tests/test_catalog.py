"""The GPU catalog: a device kind may name an entry (`catalog: NAME`) and get its figures, its own
fields win, an unknown name is refused naming the field and the known names, and a kind with
neither a catalog entry nor efficiencies gets its type's documented default, which show-cluster
says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import SPECS

from llm_planner.cli import main as cli_main
from llm_planner.cli.main import main
from llm_planner.core.catalog import (
    DEFAULT_EFFICIENCY,
    ENTRY_FIELDS,
    catalog_entry,
    catalog_names,
    engine_entries,
    engine_fields,
    engine_names,
)
from llm_planner.core.constants import DEVICE_TYPES
from llm_planner.core.spec import (
    COLLECTIVE_OVERHEAD_DEFAULT,
    STEP_OVERHEAD_DEFAULT,
    DeviceKindSpec,
    SpecError,
    load_cluster,
    parse_cluster,
)
from llm_planner.core.spec_kinds import KIND_FIELDS, REQUIRED_KIND_FIELDS
from llm_planner.placement.views import efficiencies, fixed_times

REQUIRED_ENTRIES = (
    "a100-sxm-40g",
    "a100-sxm-80g",
    "h100-sxm-80g",
    "h200-sxm-141g",
    "l40s",
    "l4",
    "a10g",
    "rtx-4090",
    "v100-sxm-16g",
    "v100-sxm-32g",
    "t4",
    "mi300x",
)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Table cells on one line each."""
    monkeypatch.setattr(cli_main, "console", cli_main.LiteralConsole(width=600))


def _cluster(*kinds: dict) -> dict:
    return {
        "name": "t",
        "device_kinds": list(kinds),
        "nodes": [{"name": "n", "devices": {k["name"]: 1 for k in kinds}}],
        "links": {"intra_node_default": {"bw_bytes_per_s": "25 GB/s"}},
    }


def _plain_gpu(**extra) -> dict:
    return {
        "name": "g",
        "type": "gpu",
        "peak_flops": {"fp16": "100 TFLOP/s"},
        "mem_bytes": "16 GB",
        "mem_bw_bytes_per_s": "1 TB/s",
        **extra,
    }


def test_every_entry_loads_with_every_field():
    names = catalog_names()
    assert set(REQUIRED_ENTRIES) <= set(names)
    for name in names:
        entry = catalog_entry(name)
        assert set(ENTRY_FIELDS) <= set(entry), name
        assert entry["type"] == "gpu"
        assert 0 < entry["compute_efficiency"] <= 1 and 0 < entry["mem_efficiency"] <= 1
        assert dict(entry["peak_flops"])["fp16"] > dict(entry["peak_flops"])["fp32"] > 0
        kind = parse_cluster(_cluster({"name": "k", "catalog": name})).kind("k")
        assert kind.catalog == name and kind.defaulted == ()


def test_a_kind_naming_an_entry_gets_its_numbers():
    kind = parse_cluster(_cluster({"name": "h", "catalog": "h100-sxm-80g"})).kind("h")
    assert kind.type == "gpu" and kind.name == "h"
    assert kind.mem_bytes == 81559 * 2**20 and kind.mem_bw_bytes_per_s == pytest.approx(3.35e12)
    assert kind.flops_for("fp16") == pytest.approx(989.5e12) and kind.flops_for("fp8") == pytest.approx(1979e12)
    assert (kind.compute_efficiency, kind.mem_efficiency) == (0.67, 0.76)
    assert kind.overhead_s == pytest.approx(10e-6) and kind.collective_call_s == pytest.approx(8e-6)
    assert kind.serving_step_s == pytest.approx(1.2e-3) and kind.serving_sequence_s == pytest.approx(50e-6)
    # the same numbers as a spec that states them: the entry is what a spec would have written
    entry = catalog_entry("h100-sxm-80g")
    stated = parse_cluster(_cluster({"name": "h", **_as_written("h100-sxm-80g")})).kind("h")
    assert stated == kind and stated.catalog is None
    assert entry["peak_flops"] == kind.peak_flops


def _as_written(name: str) -> dict:
    """The entry's fields as the catalog file writes them."""
    path = Path(__file__).resolve().parents[1] / "llm_planner" / "core" / "data" / "gpu_catalog.yaml"
    return yaml.safe_load(path.read_text())[name]


def test_a_field_the_kind_states_overrides_the_entry():
    kind = parse_cluster(
        _cluster({"name": "h", "catalog": "h100-sxm-80g", "mem_bytes": "64 GB", "compute_efficiency": 0.5})
    ).kind("h")
    assert kind.mem_bytes == 64e9 and kind.compute_efficiency == 0.5
    assert kind.mem_efficiency == 0.76 and kind.mem_bw_bytes_per_s == pytest.approx(3.35e12)
    assert kind.defaulted == ()


def test_an_override_is_checked_like_any_field():
    with pytest.raises(SpecError, match=r"device_kinds\[0\]\.mem_efficiency: must be in \[0.001, 1\]"):
        parse_cluster(_cluster({"name": "h", "catalog": "l4", "mem_efficiency": 1.5}))
    with pytest.raises(SpecError, match=r"device_kinds\[0\]: unknown key\(s\) 'mem_byte'"):
        parse_cluster(_cluster({"name": "h", "catalog": "l4", "mem_byte": "20 GB"}))


def test_an_unknown_entry_names_the_field_and_the_known_names():
    data = _cluster(_plain_gpu(), {"name": "h", "catalog": "h100"})
    with pytest.raises(SpecError) as err:
        parse_cluster(data, source="spec.yaml")
    message = str(err.value)
    assert message.startswith("spec.yaml: device_kinds[1].catalog: unknown catalog entry 'h100' (known: ")
    assert all(name in message for name in REQUIRED_ENTRIES)


def test_an_unknown_entry_exits_2_through_show_cluster(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_cluster(_plain_gpu(), {"name": "h", "catalog": "h100"})))
    assert main(["show-cluster", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml: device_kinds[1].catalog: unknown catalog entry 'h100'" in err
    assert "h100-sxm-80g" in err and "mi300x" in err and "Traceback" not in err


def test_a_kind_without_catalog_or_efficiencies_gets_the_documented_default(tmp_path, capsys):
    cpu = {**_plain_gpu(name="c", type="cpu"), "mem_efficiency": 0.5}
    cluster = parse_cluster(_cluster(_plain_gpu(), cpu))
    gpu, cpu = cluster.kind("g"), cluster.kind("c")
    assert (gpu.compute_efficiency, gpu.mem_efficiency) == DEFAULT_EFFICIENCY["gpu"] == (0.67, 0.76)
    assert gpu.defaulted == ("compute_efficiency", "mem_efficiency") and gpu.catalog is None
    assert (cpu.compute_efficiency, cpu.mem_efficiency) == (DEFAULT_EFFICIENCY["cpu"][0], 0.5)
    assert cpu.defaulted == ("compute_efficiency",)
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(_cluster(_plain_gpu(), {"name": "h", "catalog": "l40s"})))
    assert main(["show-cluster", str(path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"│ g .*│ the spec; efficiencies: default 0\.67/0\.76 \(no catalog entry, none given\) +│", out)
    assert re.search(r"│ h .*│ catalog l40s +│", out)


def test_defaults_cover_every_type():
    assert set(DEFAULT_EFFICIENCY) == set(DEVICE_TYPES) == set(COLLECTIVE_OVERHEAD_DEFAULT)
    assert set(STEP_OVERHEAD_DEFAULT) == set(DEVICE_TYPES)


def test_collective_overhead_is_a_duration_with_a_type_default():
    cluster = parse_cluster(_cluster(_plain_gpu(collective_overhead_s="40 us"), {**_plain_gpu(name="c", type="cpu")}))
    assert cluster.kind("g").collective_call_s == pytest.approx(40e-6)
    assert cluster.kind("c").collective_overhead_s is None
    assert cluster.kind("c").collective_call_s == COLLECTIVE_OVERHEAD_DEFAULT["cpu"]
    with pytest.raises(SpecError, match=r"device_kinds\[0\]\.collective_overhead_s: must be >= 0"):
        parse_cluster(_cluster(_plain_gpu(collective_overhead_s="-1 us")))


def test_provenance_does_not_change_what_a_kind_is():
    """Kinds compare by their figures: where they came from (catalog, defaults) is a record."""
    a = DeviceKindSpec(name="k", type="gpu", peak_flops=(("fp16", 1.0),), mem_bytes=1.0, mem_bw_bytes_per_s=1.0)
    b = DeviceKindSpec(
        name="k",
        type="gpu",
        peak_flops=(("fp16", 1.0),),
        mem_bytes=1.0,
        mem_bw_bytes_per_s=1.0,
        catalog="t4",
        defaulted=("mem_efficiency",),
    )
    assert a == b


def test_a_kind_missing_a_figure_without_a_catalog_is_refused():
    data = _plain_gpu()
    del data["mem_bw_bytes_per_s"]
    with pytest.raises(SpecError, match=r"device_kinds\[0\]\.mem_bw_bytes_per_s: missing required field"):
        parse_cluster(_cluster(data))


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_spec_loads_and_defaults_nothing(path):
    cluster = load_cluster(path)
    for kind in cluster.device_kinds:
        assert kind.defaulted == (), f"{path.name}: {kind.name} leaves its efficiencies to the default"
        if kind.type == "gpu":
            assert kind.catalog in catalog_names(), f"{path.name}: {kind.name} names no catalog entry"


def test_show_cluster_states_the_fixed_times_the_costs_charge():
    """A catalog kind's serving times come from its entry; a kind with none stated gets the type's
    step default and no time per sequence, and show-cluster prints both as the costs charge them (and
    a W8A8 layer's fixed time where the kind sets one)."""
    cluster = parse_cluster(_cluster(_plain_gpu(), {"name": "h", "catalog": "h100-sxm-80g"}))
    assert fixed_times(cluster.kind("h")) == "10 us a task, 1.2 ms a step, 50 us a sequence, 8 us a collective"
    assert fixed_times(cluster.kind("g")) == "0 s a task, 1 ms a step, 0 s a sequence, 8 us a collective"
    w8a8 = parse_cluster(_cluster({"name": "t", "catalog": "h100-sxm-80g", "w8a8_overhead_s": "27 us"})).kind("t")
    assert fixed_times(w8a8).endswith("8 us a collective, 27 us a W8A8 layer")


def test_show_cluster_states_the_dequantizing_factors_a_kind_sets():
    """The factors on weight-only compute and on an fp8 KV cache's read time are printed where they
    are not 1 (a kind with neither prints the shares alone)."""
    kinds = ({"name": "h", "catalog": "h100-sxm-80g"}, {"name": "slow", "catalog": "h100-sxm-80g"})
    kinds[1].update(dequant_factor=1.5, kv_dequant_factor=2)
    cluster = parse_cluster(_cluster(*kinds))
    assert efficiencies(cluster.kind("h")).endswith("of links in collectives")
    assert efficiencies(cluster.kind("slow")).endswith("; weight-only compute x1.5; fp8 KV cache read time x2")


def test_an_engine_set_stands_over_its_entries_fields_and_a_stated_field_wins(tmp_path, capsys):
    """`engine: tensorrt-llm` gives a kind that engine's fitted factors over its catalog entry's; the
    entry's other figures stay, and a field the kind states itself still wins."""
    assert "tensorrt-llm" in engine_names()
    trt = engine_fields("tensorrt-llm", "h100-sxm-80g")
    assert set(trt) == {
        "mem_efficiency",
        "step_overhead_s",
        "collective_overhead_s",
        "sequence_overhead_s",
        "w8a8_overhead_s",
    }
    kinds = (
        {"name": "plain", "catalog": "h100-sxm-80g"},
        {"name": "trt", "catalog": "h100-sxm-80g", "engine": "tensorrt-llm"},
        {"name": "mine", "catalog": "h100-sxm-80g", "engine": "tensorrt-llm", "step_overhead_s": "3 ms"},
    )
    cluster = parse_cluster(_cluster(*kinds))
    plain, mine = cluster.kind("plain"), cluster.kind("mine")
    kind = cluster.kind("trt")
    entry = catalog_entry("h100-sxm-80g")
    assert kind.engine == "tensorrt-llm" and plain.engine is None
    for name, value in trt.items():
        stock = entry.get(name, 0.0)  # the catalog states no W8A8 fixed time: the kind's default, 0
        assert getattr(kind, name) == pytest.approx(value) and getattr(plain, name) == pytest.approx(stock)
        assert value != pytest.approx(stock), f"{name}: the set should differ from the catalog's compromise"
    assert kind.mem_bw_bytes_per_s == plain.mem_bw_bytes_per_s and kind.peak_flops == plain.peak_flops
    assert mine.step_overhead_s == pytest.approx(3e-3) and mine.sequence_overhead_s == kind.sequence_overhead_s
    path = tmp_path / "trt.yaml"
    path.write_text(yaml.safe_dump(_cluster(*kinds)))
    assert main(["show-cluster", str(path)]) == 0
    assert re.search(r"│ trt .*│ catalog h100-sxm-80g, tensorrt-llm's factors +│", capsys.readouterr().out)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (
            {"name": "k", "catalog": "h100-sxm-80g", "engine": "trt"},
            r"engine: unknown engine 'trt' \(known: tensorrt-llm",
        ),
        (
            {"name": "k", "catalog": "mi300x", "engine": "tensorrt-llm"},
            r"engine: engine 'tensorrt-llm' has no factors fitted for catalog entry 'mi300x' \(it has for: a100",
        ),
        ({**_plain_gpu(name="k"), "engine": "tensorrt-llm"}, r"engine: an engine's factors stand over a catalog entry"),
    ],
)
def test_an_engine_the_catalog_cannot_give_is_refused_naming_the_field(kind, message):
    with pytest.raises(SpecError, match=r"device_kinds\[0\]\." + message):
        parse_cluster(_cluster(kind))


def test_an_engine_set_fitted_per_gpu_gives_each_entry_its_own_values():
    """tensorrt-llm's H100 values are fitted on H100 runs (`by_entry`): an H100 kind gets them, an A100
    kind the set's own; the engine's time per sequence is shorter on the H100, and only the H100's
    (fitted on fp8 runs) has a W8A8 fixed time."""
    h100, a100 = engine_fields("tensorrt-llm", "h100-sxm-80g"), engine_fields("tensorrt-llm", "a100-sxm-80g")
    assert set(h100) == set(a100) | {"w8a8_overhead_s"} and h100["w8a8_overhead_s"] > 0
    assert h100["sequence_overhead_s"] < a100["sequence_overhead_s"]
    assert engine_fields("tensorrt-llm", "l40s") == a100


@pytest.mark.parametrize(
    ("by_entry", "message"),
    [
        ({"mi300x": {"mem_efficiency": 0.5}}, r"tensorrt-llm\.by_entry\.mi300x: not one of the set's entries"),
        (
            {"h100-sxm-80g": {"mem_efficiency": 0.5, "warp": 1}},
            r"tensorrt-llm\.by_entry\.h100-sxm-80g: unknown key\(s\) 'warp'",
        ),
        ({"h100-sxm-80g": {"mem_efficiency": 2}}, r"tensorrt-llm\.by_entry\.h100-sxm-80g\.mem_efficiency"),
    ],
)
def test_a_set_by_entry_that_is_not_one_of_its_entries_fields_is_refused(tmp_path, monkeypatch, by_entry, message):
    import llm_planner.core.catalog as catalog

    path = tmp_path / "engines.yaml"
    entries = ["a100-sxm-80g", "h100-sxm-80g"]
    path.write_text(yaml.safe_dump({"tensorrt-llm": {"entries": entries, "mem_efficiency": 0.7, "by_entry": by_entry}}))
    monkeypatch.setattr(catalog, "ENGINES_PATH", path)
    catalog._engines.cache_clear()
    try:
        with pytest.raises(SpecError, match=re.escape(str(path)) + ": " + message):
            catalog.engine_names()
    finally:
        catalog._engines.cache_clear()


def test_every_engine_set_names_catalog_entries_and_sets_kind_fields_only():
    for engine in engine_names():
        assert set(engine_entries(engine)) <= set(catalog_names())
        for entry in engine_entries(engine):
            assert set(engine_fields(engine, entry)) <= set(KIND_FIELDS) - set(REQUIRED_KIND_FIELDS)


def test_a_plan_made_for_another_engine_than_its_kinds_factors_says_so(tmp_path, caplog):
    from llm_planner.serving.context import ServingOptions, build_context
    from llm_planner.serving.workload import RequestShape, ServingWorkload

    spec = _cluster({"name": "h100", "catalog": "h100-sxm-80g", "engine": "tensorrt-llm"})
    path = tmp_path / "trt.yaml"
    path.write_text(yaml.safe_dump(spec))
    workload = ServingWorkload(requests=(RequestShape(prompt_len=128, output_len=128),), tpot_slo_s=0.05)
    with caplog.at_level("WARNING"):
        build_context(str(path), "llama3-8b", workload, "bf16", ServingOptions())
    assert "another engine's factors" not in caplog.text
    with caplog.at_level("WARNING"):
        build_context(str(path), "llama3-8b", workload, "bf16", ServingOptions(exportable="vllm"))
    assert "trt.yaml: kinds h100 (tensorrt-llm) take another engine's factors than vllm's" in caplog.text
