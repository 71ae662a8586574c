"""`plan --exportable vllm|sglang` and `export --to vllm|sglang` share one rule
(llm_planner.serving.engines): every layout the search may take, placed on devices as the plan
places them, is one the export takes, for every copy. Fleets are built here from catalog GPUs
with little memory, so that pipelines over servers and mixed classes come up.

The deterministic test walks every candidate layout of a few fixed fleets (no search: fast); a
property test runs the search on random small fleets and exports what it chose (a few examples,
short searches); another plans random fleets end to end with the CLI and exports them (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import SPECS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serving_export import _export

from llm_planner.cli.main import main
from llm_planner.core.precision import uniform
from llm_planner.core.spec import load_cluster
from llm_planner.export.serving import ServingExportError, build_engines
from llm_planner.serving.assign import assign_devices
from llm_planner.serving.context import ServingContext, ServingOptions
from llm_planner.serving.engines import ENGINES, StageForm, engine_refusal, layout_forms, layout_refusal
from llm_planner.serving.fleet import FleetChoice
from llm_planner.serving.inputs import decoder_config
from llm_planner.serving.layout import Pattern, Segment, layout_usage
from llm_planner.serving.plan_file import ServingPlanFile
from llm_planner.serving.search import candidate_layouts, solve_serving, with_ends
from llm_planner.serving.workload import RequestShape, ServingWorkload

KINDS = ("t4", "l4", "a10g", "v100-sxm-16g")
MODEL = "opt-1.3b"  # 2.6 GB of fp16 weights: two or more 1.5 GB GPUs hold it
FP16 = uniform("fp16").to_dict()  # the precision of every plan here
LINKS = """links:
  intra_node_default: {bw_bytes_per_s: 32 GB/s, latency_s: 5 us}
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
"""


def fleet_spec(servers: list[tuple[dict[str, int], int]], mem_gb: float = 1.5) -> str:
    """A cluster of server types, each {kind: GPUs per server} with a count, kinds from the catalog
    with `mem_gb` of memory."""
    kinds = sorted({k for devices, _ in servers for k in devices})
    lines = ["name: fleet", "device_kinds:"]
    lines += [f"  - {{name: {k}, catalog: {k}, mem_bytes: {mem_gb} GB}}" for k in kinds]
    lines.append("nodes:")
    for i, (devices, count) in enumerate(servers):
        inner = ", ".join(f"{k}: {n}" for k, n in devices.items())
        lines.append(f'  - {{name: s{i}, count: {count}, hostname: "s{i}-{{i}}", devices: {{{inner}}}}}')
    return "\n".join(lines) + "\n" + LINKS


FLEETS = {
    # two templates, runs of unequal length across hosts unless the search keeps them even
    "two-templates": [({"t4": 2}, 2), ({"l4": 4}, 1)],
    # one template with two kinds and several servers: segments of both may share a server or not
    "two-kinds": [({"t4": 2, "l4": 2}, 2)],
    # one server of two kinds, and a second template
    "workstation": [({"a10g": 2, "v100-sxm-16g": 1}, 1), ({"t4": 1}, 3)],
}


def _context(tmp_path: Path, spec: str, engine: str) -> ServingContext:
    path = tmp_path / "fleet.yaml"
    path.write_text(spec)
    workload = ServingWorkload(requests=(RequestShape(prompt_len=64, output_len=16),), tpot_slo_s=0.1)
    options = ServingOptions(exportable=engine, max_segments=3)
    return ServingContext(load_cluster(path), decoder_config(MODEL), workload, "fp16", options)


def _hand_plan(ctx: ServingContext, path: Path, layout, devices) -> ServingPlanFile:
    """A plan file's data for one pattern with these devices per copy (what build_engines reads)."""
    stages, layers = len(devices[0]), ctx.tasks.num_layers
    split = [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
    rep = {
        "pattern": "p",
        "count": len(devices),
        "segments": [{"class": s.class_name, "degree": s.degree, "stages": s.stages} for s in layout],
        "layers": split,
        "concurrency": 4,
        "micro_batches": stages,
        "tokens_per_s": 1.0,
        "devices": [[list(stage) for stage in copy] for copy in devices],
        "precision": FP16,
    }
    data = {
        "inputs": {"cluster": str(path)},
        "model": {"name": MODEL, "dtype": "fp16", "num_layers": layers, "precision": FP16},
        "workload": {"requests": [{"prompt_len": 64, "output_len": 16, "weight": 1.0}], "tpot_slo_s": 0.1},
        "options": {"max_batched_tokens": 2048},
        "serving": {"tokens_per_s": 1.0, "replicas": [rep]},
    }
    return ServingPlanFile(data=data, path=path.parent / "hand.yaml")


def _copies(ctx: ServingContext, layout) -> int:
    usage = layout_usage(layout)
    return min(ctx.by_name[c].num_devices // n for c, n in usage.items())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_every_layout_the_search_may_take_exports(tmp_path, fleet, engine):
    ctx = _context(tmp_path, fleet_spec(FLEETS[fleet]), engine)
    layouts = candidate_layouts(ctx)
    layouts += [v for layout in layouts for v in with_ends(ctx, layout)]
    assert layouts, fleet
    spanning = 0
    for layout in layouts:
        assert layout_refusal(engine, layout, ctx.by_name) is None
        copies = _copies(ctx, layout)
        for count in sorted({1, copies}):  # later copies land at other offsets and on other servers
            fleet_choice = FleetChoice(chosen=((Pattern(layout=layout, ev=None), count),))
            devices = assign_devices(ctx.cluster, ctx.by_name, fleet_choice)[0]
            export = build_engines(_hand_plan(ctx, tmp_path / "fleet.yaml", layout, devices), ctx.cluster, engine)
            spanning += any(len(e.hosts) > 1 for e in export.engines)
    assert spanning > 0, "no layout spans hosts: the fleet tests nothing of the hosts' rule"


def test_the_search_leaves_out_what_the_export_refuses(tmp_path):
    """Without --exportable the search may take layouts the rule refuses: each is refused by the
    export too, with the option that avoids it."""
    ctx = _context(tmp_path, fleet_spec(FLEETS["two-templates"]), None)
    refused = 0
    for layout in candidate_layouts(ctx):
        reason = layout_refusal("sglang", layout, ctx.by_name)
        if reason is None:
            continue
        refused += 1
        devices = assign_devices(ctx.cluster, ctx.by_name, FleetChoice(chosen=((Pattern(layout=layout, ev=None), 1),)))
        with pytest.raises(ServingExportError, match="plan with --exportable sglang"):
            build_engines(_hand_plan(ctx, tmp_path / "fleet.yaml", layout, devices[0]), ctx.cluster, "sglang")
    assert refused > 0


def _form(degree: int, host: str, cpu: bool = False) -> StageForm:
    return StageForm(degree=degree, kind="cpu" if cpu else "g", cpu=cpu, host=host)


def test_the_rule_names_the_stage_and_the_option():
    even = [_form(2, "a"), _form(2, "a"), _form(2, "b"), _form(2, "b")]
    assert engine_refusal("vllm", even, 4) is None and engine_refusal("sglang", even, 4) is None
    assert "stage 2 has tensor-parallel degree 1" in engine_refusal("vllm", [*even[:2], _form(1, "b")], 3)
    assert "plan with --exportable sglang)" in engine_refusal("sglang", even, 2)
    cpu = engine_refusal("megatron", [_form(1, "a"), _form(1, "a", cpu=True)], None)
    assert "stage 1 runs on CPU device kind 'cpu'" in cpu and "--exportable vllm or --exportable sglang" in cpu
    uneven = [_form(1, "a"), _form(1, "b"), _form(1, "b")]
    assert "--vllm-multinode ray" in engine_refusal("vllm", uneven, 3)
    assert "--vllm-multinode" not in engine_refusal("sglang", uneven, 3)
    assert engine_refusal("vllm", uneven, 3, even_hosts=False) is None
    assert engine_refusal("megatron", uneven, 1) is None  # Megatron's sizes: one degree, no CPU


def test_layout_forms_give_no_hosts_where_the_placement_decides(tmp_path):
    ctx = _context(tmp_path, fleet_spec(FLEETS["two-kinds"]), "vllm")
    t4, l4 = (c.name for c in ctx.classes)
    assert layout_forms((Segment(t4, 1, 2), Segment(l4, 1, 1)), ctx.by_name) is None
    whole = layout_forms((Segment(t4, 1, 4),), ctx.by_name)  # whole servers: two stages on each
    assert [f.host for f in whole] == ["s0#0", "s0#0", "s0#1", "s0#1"]


# Random small fleets: the search's fleet, placed as the plan places it, exported.
SERVER = st.tuples(
    st.dictionaries(st.sampled_from(KINDS), st.sampled_from((1, 2, 4)), min_size=1, max_size=2),
    st.integers(1, 3),
)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    servers=st.lists(SERVER, min_size=1, max_size=3),
    engine=st.sampled_from(ENGINES),
    slo=st.sampled_from((0.06, 0.15)),
    mem_gb=st.sampled_from((1.5, 3.0)),
)
def test_exportable_fleets_of_random_clusters_always_export(tmp_path_factory, servers, engine, slo, mem_gb):
    """The search itself (its time limit short; the bounds and baselines, which choose nothing,
    left out), then every copy of every pattern it chose, on the devices the plan gives them."""
    tmp = tmp_path_factory.mktemp("fleet")
    path = tmp / "fleet.yaml"
    path.write_text(fleet_spec(servers, mem_gb=mem_gb))
    workload = ServingWorkload(requests=(RequestShape(prompt_len=64, output_len=16),), tpot_slo_s=slo)
    options = ServingOptions(exportable=engine, time_limit_s=2.0)
    ctx = ServingContext(load_cluster(path), decoder_config(MODEL), workload, "fp16", options)
    fleet, _ = solve_serving(ctx)
    for (pattern, count), devices in zip(fleet.chosen, assign_devices(ctx.cluster, ctx.by_name, fleet)):
        assert pattern.ev.micro_batches == sum(seg.stages for seg in pattern.layout)
        plan = _hand_plan(ctx, path, pattern.layout, devices)
        plan.data["serving"]["replicas"][0]["micro_batches"] = pattern.ev.micro_batches
        assert len(build_engines(plan, ctx.cluster, engine).engines) == count


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(servers=st.lists(SERVER, min_size=1, max_size=2), engine=st.sampled_from(ENGINES))
@pytest.mark.timeout(3000)
def test_exportable_plans_of_random_fleets_always_export(tmp_path_factory, servers, engine):
    """End to end: `plan --exportable E` (bounds, baselines, verify) and `export --to E`."""
    tmp = tmp_path_factory.mktemp("fleet")
    cluster = tmp / "fleet.yaml"
    cluster.write_text(fleet_spec(servers, mem_gb=3))
    plan = tmp / "plan.yaml"
    argv = ["plan", "--cluster", str(cluster), "--model", MODEL, "--objective", "serving", "--no-baselines"]
    argv += ["--prompt-len", "64", "--output-len", "16", "--tpot-slo", "150 ms", "--time-limit", "5"]
    if main([*argv, "--exportable", engine, "-o", str(plan)]) != 0:
        return  # nothing serves this fleet at this target (the CLI said so)
    rc, _, err = _export(plan, "--to", engine, "--format", "json")
    assert rc == 0, err
    data = yaml.safe_load(plan.read_text())
    assert data["options"]["exportable"] == engine and data["serving"]["unrestricted"] is not None


def test_exportable_on_a_cluster_the_engine_runs_nothing_of_says_so(tmp_path, capsys):
    """--exportable vllm on CPU devices alone: the message names the engine's rule, not the token
    budget, and says to plan without --exportable."""
    argv = ["plan", "--cluster", "cluster_specs/localhost-2cpu.yaml", "--model", "cluster_specs/localhost-serve-gpt2"]
    argv += ["--dtype", "fp32", "--allow-cpu", "--objective", "serving", "--prompt-len", "32", "--output-len", "32"]
    argv += ["--tpot-slo", "20 ms", "--exportable", "vllm", "-o", str(tmp_path / "p.yaml")]
    assert main(argv) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "--exportable vllm rules out every class: stage 0 runs on CPU device kind 'cpu-core'" in said
    assert "plan without --exportable" in said and "token budget" not in said


def test_a_vllm_plan_keeps_each_replicas_sequences_within_the_token_budget(tmp_path):
    """vLLM takes no more sequences than its per-iteration token budget (--max-num-seqs at most
    --max-num-batched-tokens), so `--exportable vllm` caps a pipeline's whole concurrency at the
    budget, not only a micro-batch's share, and the export writes a command vLLM starts."""
    plan, script = tmp_path / "plan.yaml", tmp_path / "serve.sh"
    argv = ["plan", "--cluster", str(SPECS / "h100-4x8.yaml"), "--model", "llama3-70b", "--objective", "serving"]
    argv += ["--prompt-len", "32", "--output-len", "512", "--tpot-slo", "100 ms", "--max-tp", "1"]
    argv += ["--max-batched-tokens", "16", "--exportable", "vllm", "-o", str(plan)]
    assert main(argv) == 0
    replicas = yaml.safe_load(plan.read_text())["serving"]["replicas"]
    assert replicas and all(r["concurrency"] <= 16 for r in replicas)
    assert any(r["micro_batches"] > 1 for r in replicas)  # a pipeline, whose micro-batches alone would allow more
    assert main(["export", str(plan), "--to", "vllm", "-o", str(script)]) == 0
    assert "--max-num-batched-tokens 16 " in " ".join(script.read_text().split())
