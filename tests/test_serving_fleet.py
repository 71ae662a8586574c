"""Fleets as counts: the serving solve over classes of identical servers loses nothing against a
brute force over the expanded cluster (every server its own), verify refuses pattern counts a
class cannot hold, and a fleet past the device limit is refused in seconds naming the field."""

from __future__ import annotations

import dataclasses
import functools
import types
from pathlib import Path

import highspy
import numpy as np
import pytest
import yaml
from serving_fixtures import workload

from llm_planner.cli.main import main
from llm_planner.core.spec import MAX_DEVICES, load_cluster
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.serving import aside as aside_module
from llm_planner.serving import bound_prices
from llm_planner.serving.aside import Aside
from llm_planner.serving.baselines import even_split
from llm_planner.serving.bound import first_two_bounds
from llm_planner.serving.context import ServingContext, ServingOptions, build_context
from llm_planner.serving.replica import ReplicaModel, StageSlot
from llm_planner.serving.search import SPREAD, balanced_prices, candidate_layouts, micro_batch_options, solve_serving

# Two kinds of small servers, two identical servers of each (made-up numbers, memory scaled down
# so that GPT-2's KV cache limits the concurrency of a device: at a 5 ms TPOT target the plan runs
# both kinds, at 3 ms the small kind meets the target in no pipeline that pays).
TINY_FLEET = """
name: tiny-fleet
device_kinds:
  - {name: big, type: gpu, peak_flops: {fp16: 300 TFLOP/s}, mem_bytes: 0.5 GB, mem_bw_bytes_per_s: 2000 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us, step_overhead_s: 0.2 ms}
  - {name: small, type: gpu, peak_flops: {fp16: 120 TFLOP/s}, mem_bytes: 0.4 GB, mem_bw_bytes_per_s: 40 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us, step_overhead_s: 0.2 ms}
nodes:
  - {name: bigbox, count: 2, devices: {big: 1}}
  - {name: smallbox, count: 2, devices: {small: 2},
     links: [{between: [small, small], bw_bytes_per_s: 32 GB/s, latency_s: 5 us}]}
links:
  inter_node: {bw_bytes_per_s: 25 GB/s, latency_s: 5 us}
"""


def _tiny_context(tmp_path: Path, tpot_s: float) -> ServingContext:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_FLEET)
    cluster = load_cluster(path)
    return ServingContext(
        cluster, preset_config("gpt2"), workload(256, 128, tpot_s), "fp16", ServingOptions(time_limit_s=600)
    )


def _servers(ctx: ServingContext) -> list[tuple[str, int]]:
    """(class name, devices) of every server of the expanded cluster, each server on its own."""
    return [(sc.name, sc.per_server) for sc in ctx.classes for _ in range(sc.num_servers)]


def _pipelines(ctx: ServingContext, servers: list[tuple[str, int]]):
    """Every pipeline over the expanded cluster: a sequence of stages (server, degree), each server
    giving at most its devices, at most one stage per layer; yields (stages, devices used per server)."""
    options = [(j, k) for j, (name, _) in enumerate(servers) for k in ctx.by_name[name].degrees]
    limit = min(ctx.tasks.num_layers, ctx.options.max_stages)

    def extend(stages, used):
        if stages:
            yield tuple(stages), tuple(used)
        if len(stages) == limit:
            return
        for j, k in options:
            if used[j] + k <= servers[j][1]:
                used[j] += k
                yield from extend([*stages, (j, k)], used)
                used[j] -= k

    yield from extend([], [0] * len(servers))


def _slots(ctx: ServingContext, servers, stages) -> tuple[tuple[str, int, str | None], ...]:
    """Each stage's (class, degree, link to the next stage): the server's own link between two stages
    on one server, the network otherwise; the last stage's link carries the token back to the first."""
    out = []
    one_server = len({j for j, _ in stages}) == 1
    for s, (j, k) in enumerate(stages):
        if s + 1 < len(stages):
            link = "intra" if stages[s + 1][0] == j else "inter"
        else:
            link = None if len(stages) == 1 else ("intra" if one_server else "inter")
        out.append((servers[j][0], k, link))
    return tuple(out)


def _evaluate(ctx: ServingContext, signature) -> float:
    """Best tokens/s of one pipeline by the solver's replica model, at every operating point the
    search and the baselines try (fitted split at 1, p/2, p micro-batches refined; p micro-batches
    with the fitted and with the even split)."""
    slots = []
    for name, k, link in signature:
        sc = ctx.by_name[name]
        spec = {"intra": sc.intra_link, "inter": ctx.cluster.inter_node, None: None}[link]
        slots.append(StageSlot(costs=ctx.cache.get(name, k), link_next=spec))
    wl = ctx.workload
    model = ReplicaModel(ctx.tasks, slots, wl.tpot_slo_s, wl.ttft_slo_s, wl.mean_output_len)
    p = len(slots)
    found = [
        model.best(micro_batch_options(ctx, p), refine=True),
        model.best([p]),
        model.best([p], fixed=even_split(ctx.tasks.num_layers, p)),
    ]
    return max((e.tokens_per_s for e in found if e is not None), default=0.0)


def _brute_force(ctx: ServingContext) -> float:
    """The most tokens/s of any set of disjoint pipelines over the expanded cluster."""
    servers = _servers(ctx)
    values: dict[tuple, float] = {}
    by_usage: dict[tuple[int, ...], float] = {}
    for stages, used in _pipelines(ctx, servers):
        signature = _slots(ctx, servers, stages)
        if signature not in values:
            values[signature] = _evaluate(ctx, signature)
        by_usage[used] = max(by_usage.get(used, 0.0), values[signature])
    choices = [(u, v) for u, v in by_usage.items() if v > 0]

    @functools.cache
    def best(free: tuple[int, ...]) -> float:
        out = 0.0
        for used, value in choices:
            if all(u <= f for u, f in zip(used, free)):
                out = max(out, value + best(tuple(f - u for f, u in zip(free, used))))
        return out

    return best(tuple(n for _, n in servers))


def test_aggregated_serving_equals_brute_force_over_the_expanded_cluster(tmp_path):
    """Two identical servers of each of two kinds: the solve over classes (patterns and copy
    counts) serves exactly what the best set of pipelines over the four concrete servers serves,
    pipelines that visit servers in any order included (a class twice, interleaved, ...)."""
    for tpot_s in (0.005, 0.003):
        ctx = _tiny_context(tmp_path, tpot_s)
        fleet, stats = solve_serving(ctx)
        assert stats.left == 0  # the search finished: no layout left unpriced
        brute = _brute_force(ctx)
        assert brute > 0
        assert abs(fleet.tokens_per_s - brute) <= 1e-9 * brute, (tpot_s, fleet.tokens_per_s, brute)


def _plan_tiny(tmp_path: Path, capsys, cluster: str, *extra: str) -> tuple[int, str, Path]:
    spec, out = tmp_path / "fleet.yaml", tmp_path / "plan.yaml"
    spec.write_text(cluster)
    code = main(
        ["plan", "--cluster", str(spec), "--model", "gpt2", "--objective", "serving", "--prompt-len", "256"]
        + ["--output-len", "128", "--tpot-slo", "5 ms", "-o", str(out), *extra]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    return code, err, out


@pytest.mark.slow  # plans and verifies twice at a 5 ms target: minutes on 2 cores
def test_verify_refuses_pattern_counts_above_their_class(tmp_path, capsys):
    """A plan whose copies of a pattern take more devices of a class than the cluster has is refused,
    naming the count field, the class and its devices (the extra copy's devices written in too, so that
    the list of copies matches the count)."""
    code, err, out = _plan_tiny(tmp_path, capsys, TINY_FLEET)
    assert code == 0, err
    assert main(["verify", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    replicas = data["serving"]["replicas"]
    i = next(j for j, rep in enumerate(replicas) if rep["segments"][0]["class"] == "bigbox/big")
    rep = data["serving"]["replicas"][i]
    rep["count"] += 1
    rep["devices"].append(rep["devices"][0])
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert f"serving.replicas[{i}].count: the copies take" in text, text
    assert "devices of class bigbox/big, which has 2 (2 server(s) of 1)" in text, text


def _fleet_of(servers: int) -> str:
    return TINY_FLEET.replace("{name: smallbox, count: 2,", f"{{name: smallbox, count: {servers},")


def test_a_fleet_past_the_device_limit_is_refused_in_seconds(tmp_path, capsys):
    """docs/inputs.md: at most spec.MAX_DEVICES devices; one server more is refused naming the field
    and the limit, before anything is planned."""
    servers = MAX_DEVICES // 2  # of 2 GPUs each: the limit exactly, and the 2 big servers' GPUs past it
    code, err, _ = _plan_tiny(tmp_path, capsys, _fleet_of(servers))
    assert code == 2
    assert f"fleet.yaml: nodes: the cluster has {MAX_DEVICES + 2:,} devices" in err, err
    assert f"the limit is {MAX_DEVICES:,}" in err


def test_a_bad_server_count_is_refused_naming_the_field(tmp_path, capsys):
    for count in ("0", "-3", "2.5", "many"):
        code, err, _ = _plan_tiny(
            tmp_path, capsys, TINY_FLEET.replace("count: 2, devices: {small", f"count: {count}, devices: {{small")
        )
        assert code == 2 and "fleet.yaml" in err and "nodes[1]" in err and "count" in err, (count, err)


def test_candidates_do_not_grow_with_the_fleet(tmp_path):
    """Llama-3 8B on the six-server example and on the same fleet four times larger: the candidate
    layouts are the same (a segment holds at most SPREAD times the devices that hold the weights),
    so a fleet's search does not grow with its servers; only the copies do."""
    base = yaml.safe_load((Path(__file__).resolve().parents[1] / "cluster_specs" / "gpt3-six-servers.yaml").read_text())
    layouts = []
    for scale in (1, 4):
        spec = dict(base, nodes=[dict(node, count=node["count"] * scale) for node in base["nodes"]])
        path = tmp_path / f"fleet-{scale}.yaml"
        path.write_text(yaml.safe_dump(spec))
        ctx = ServingContext(
            load_cluster(path), preset_config("llama3-8b"), workload(512, 256, 0.1), "fp16", ServingOptions()
        )
        layouts.append(candidate_layouts(ctx))
    assert layouts[0] == layouts[1]
    assert (
        max(seg.devices for layout in layouts[1] for seg in layout) <= SPREAD * 1
    )  # 16 GB: one device of every class holds it


def test_search_stopped_at_its_time_limit_says_what_it_left(tmp_path):
    """A search with no time at all evaluates nothing and states the layouts still worth pricing."""
    ctx = _tiny_context(tmp_path, 0.005)
    ctx.options = dataclasses.replace(ctx.options, time_limit_s=0.0)
    _, stats = solve_serving(ctx)
    assert stats.left > 0
    assert stats.evaluated + stats.left <= stats.candidates


def test_balanced_prices_share_a_degenerate_lp_value_by_rate():
    """One pattern on one device of each of two classes: the fleet LP's dual prices may split its
    worth in any way (the solver's vertex gives one class nothing); the balanced prices split it
    in proportion to the classes' rate bounds, and still price every pattern at its worth."""
    pattern = types.SimpleNamespace(usage={"a": 1, "b": 1}, ev=types.SimpleNamespace(tokens_per_s=10.0))
    prices = balanced_prices([pattern], {"a": 1, "b": 1}, {"a": 10.0, "b": 0.0}, {"a": 8.0, "b": 2.0})
    assert prices["a"] == pytest.approx(8.0) and prices["b"] == pytest.approx(2.0)


def test_price_bound_is_the_same_on_one_thread_and_on_two(tmp_path, monkeypatch):
    """The price bound takes cells from its search in fixed batches and solves their MILPs side by
    side; each result is its cell's alone, so one thread and two give the same value (verify
    recomputes it on whatever machine it runs)."""
    ctx = _tiny_context(tmp_path, 0.005)
    prices = dict.fromkeys(ctx.capacity, 1.0)  # every device alike: the search solves MILPs
    solved = []
    original = bound_prices._solve_cell
    monkeypatch.setattr(bound_prices, "_solve_cell", lambda *a: solved.append(1) or original(*a))
    values = []
    for threads in (1, 2):
        monkeypatch.setattr(bound_prices, "THREADS", threads)
        values.append(bound_prices.price_bound(ctx.cache, ctx.classes, 0.005, ctx.cluster.inter_node, prices))
    assert values[0] == values[1] and 0 < values[0] < float("inf")
    assert len(solved) >= 2 * bound_prices.BATCH  # several batches, each side by side


def test_a_cell_milp_reports_infeasible_and_its_optimum():
    """The cell MILP's solver (HiGHS without its heuristics): two options priced 3 and 5 with room
    for 2 and 3 layers a stage; 5 layers within a time of 2 stages: one stage of each (8, where
    two of the dearer one would cost 10); with time for 1 stage only, nothing fits."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    price = np.array([3.0, 5.0])
    # columns: stages n0 n1, layers l0 l1, end stages e0 e1
    rows = [
        [0, 0, 1, 1, 0, 0],  # layers >= 5
        [0, 0, 0, 0, 1, 1],  # one end stage
        [-2, 0, 1, 0, 0, 0],  # l0 <= 2 n0
        [0, -3, 0, 1, 0, 0],  # l1 <= 3 n1
        [-1, 0, 0, 0, 1, 0],  # e0 <= n0
        [0, -1, 0, 0, 0, 1],  # e1 <= n1
        [1, 1, 0, 0, 0, 0],  # stages within time
    ]
    lo, hi = [5, 1] + [-np.inf] * 5, [np.inf, np.inf, 0, 0, 0, 0]
    fits, value, x = bound_prices._solve_cell(h, price, [np.array(r, float) for r in rows], lo, hi + [2])
    assert fits and 8.0 / (1 + bound_prices.MIP_GAP) <= value <= 8.0 + 1e-9
    assert list(np.round(x[:2])) == [1, 1]
    fits, value, x = bound_prices._solve_cell(h, price, [np.array(r, float) for r in rows], lo, hi + [1])
    assert not fits


@pytest.mark.heavy
def test_the_first_two_bounds_computed_aside_are_the_ones_computed_here(tmp_path):
    """A large plan computes its first two bounds in a child process beside its search: the child
    rebuilds the context from the same inputs and gets the same value; its errors come back."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_FLEET)
    wl = workload(256, 128, 0.005)
    inputs = dict(cluster_path=str(path), model="gpt2", workload=wl, dtype="fp16", options=ServingOptions())
    inputs["profile_path"] = None
    ctx = build_context(**inputs)
    assert Aside(inputs)() == first_two_bounds(ctx.cache, ctx.classes, 0.005)
    inputs["cluster_path"] = str(tmp_path / "missing.yaml")
    with pytest.raises(Exception, match="missing.yaml"):
        Aside(inputs)()


def test_the_first_two_bounds_come_back_whatever_the_child_prints(tmp_path, monkeypatch):
    """The issue's 513-server fleet: HiGHS printed a line on the child's stdout, where the value then
    travelled (`UnpicklingError: invalid load key, 'H'`). The value has its own file: a child that
    writes on stdout and stderr before and after computing it still hands it back."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_FLEET)
    inputs = dict(cluster_path=str(path), model="gpt2", workload=workload(256, 128, 0.005), dtype="fp16")
    inputs |= dict(options=ServingOptions(), profile_path=None)
    noisy = (
        "import sys; from llm_planner.serving import aside; print('Running HiGHS 1.7.0'); "
        "sys.stderr.write('warning\\n'); code = aside._main(); print('HiGHS done'); sys.exit(code)"
    )
    monkeypatch.setattr(aside_module, "CHILD", ("-c", noisy))
    ctx = build_context(**inputs)
    assert Aside(inputs)() == first_two_bounds(ctx.cache, ctx.classes, 0.005)
    monkeypatch.setattr(aside_module, "CHILD", ("-c", "print('HiGHS'); raise SystemExit(3)"))
    with pytest.raises(RuntimeError, match="code 3 and no value: HiGHS"):
        Aside(inputs)()
