"""Serving plans: the steady-state memory rule by hand, TPOT within the target, engineer-best
against a brute force, the bound above every plan, verify's refusals, and bad input."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving_fixtures import SMALL_FLEET, context, small_deepseek, small_glm, workload, write_fleet

from llm_planner.cli.main import main
from llm_planner.core.precision import build_precision
from llm_planner.core.spec import load_cluster
from llm_planner.graph.decoder_presets import preset_config
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.serving import verify_replica
from llm_planner.serving.baselines import class_patterns, engineer_best, even_split, megatron
from llm_planner.serving.bound import concurrency_level_bound, device_rate_bound, tokens_upper_bound
from llm_planner.serving.bound_batches import batch_level_bound
from llm_planner.serving.bound_cells import cell_bound
from llm_planner.serving.bound_prices import price_bound
from llm_planner.serving.bound_space import stage_kinds
from llm_planner.serving.context import ServingContext, ServingOptions, build_context
from llm_planner.serving.expert_load import ExpertLoad
from llm_planner.serving.layout import Segment
from llm_planner.serving.optimistic import OptimisticTokens
from llm_planner.serving.replica import micro_batch_sizes
from llm_planner.serving.search import solve_serving
from llm_planner.serving.workload import RequestShape, ServingWorkload

BIG, SMALL = "bigbox/big", "smallbox/small"


def test_kv_memory_of_two_stages_by_hand(tmp_path):
    """Every one of C sequences in flight holds its KV cache at full context on every stage, whichever
    micro-batch it is in."""
    ctx = context(tmp_path, "llama2-7b", prompt=256, output=128)
    cfg = ctx.config
    kv_per_seq_layer = 2 * cfg.num_kv_heads * cfg.head_dim * 2 * (256 + 128)  # K and V, fp16, full context
    model = ctx.replica((Segment(BIG, 1, 2),))
    ev = model.evaluate((16, 16), 10, 2)
    costs = model.slots[0].costs
    no_kv = costs.mem_bytes(layers=16, first=True, last=False, concurrency=0, micro_batch=5)
    assert ev.mem_bytes[0] - no_kv == pytest.approx(16 * 10 * kv_per_seq_layer)
    # a tensor-parallel pair splits the KV heads: half per member
    pair = ctx.cache.get(BIG, 2)
    assert pair.kv_bytes_per_seq == pytest.approx(kv_per_seq_layer / 2)


def test_cycle_is_round_trip_or_busiest_stage(tmp_path):
    ctx = context(tmp_path, "llama2-7b")
    model = ctx.replica((Segment(BIG, 1, 2),))
    ev = model.evaluate((20, 12), 9, 3)
    sizes = micro_batch_sizes(9, 3)
    busy = [sum(model.slots[s].costs.stage_s(b, n, s == 0, s == 1) for b in sizes) for s, n in enumerate((20, 12))]
    assert ev.tpot_s == pytest.approx(max(ev.round_trip_s, max(busy)))
    assert ev.round_trip_s > sum(ev.stage_s)  # the hand-off and the token's return are charged
    assert ev.tokens_per_s == pytest.approx(9 / ev.tpot_s)


# at 20 ms the cell bound's MILPs alone take 30 to 80 s on 2 cores (8 rounds of HiGHS on this fleet), at 50 ms
# about a minute in all: `slow`
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "tpot_s, stated",
    [
        pytest.param(0.02, False, marks=SLOW),
        pytest.param(0.05, False, marks=SLOW),
        # the bound with no plan known at 200 ms: its cell bound takes 15-20 s on 2 cores
        pytest.param(0.2, False, marks=SLOW),
        (0.2, True),
    ],
    ids=["20ms", "50ms", "200ms", "200ms-stated"],
)
def test_plans_meet_the_target_fit_and_order(tmp_path, tpot_s, stated):
    """`stated`: the bound the plan states (its tokens/s and device prices given, as plan and verify
    compute it: the cell bound only where the others leave a gap); else the bound with no plan."""
    ctx = context(tmp_path, "llama2-7b", tpot_s=tpot_s)
    fleet, _ = solve_serving(ctx)
    plan = (fleet.tokens_per_s, fleet.prices) if stated else ()
    bound = tokens_upper_bound(ctx.cache, ctx.classes, tpot_s, ctx.cluster.inter_node, *plan)  # three servers
    engineer = engineer_best(ctx)
    assert fleet.chosen
    for pattern, _ in fleet.chosen:
        assert pattern.ev.tpot_s <= tpot_s * (1 + 1e-9)
        usable = [ctx.by_name[s.class_name].kind.usable_mem_bytes for s in pattern.layout for _ in range(s.stages)]
        assert all(m <= u for m, u in zip(pattern.ev.mem_bytes, usable))
    assert megatron(ctx).tokens_per_s <= engineer.tokens_per_s * (1 + 1e-9)
    assert engineer.tokens_per_s <= fleet.tokens_per_s * (1 + 1e-9) <= bound * (1 + 1e-9)


def _brute_force_class(ctx, class_name, splits):
    """Best (tokens/s of the class) over degrees, stage counts, the given splits and every concurrency, by scanning."""
    sc, L = ctx.by_name[class_name], ctx.tasks.num_layers
    best = 0.0
    for k in sc.degrees:
        for n in range(1, sc.num_devices // k + 1):
            if not sc.block_ok(n * k):
                continue
            model = ctx.replica((Segment(class_name, k, n),))
            usable = sc.kind.usable_mem_bytes
            for split in splits(L, n):
                for c in itertools.count(n):
                    ev = model.evaluate(split, c, n)
                    if max(ev.mem_bytes) > usable or ev.tpot_s > ctx.workload.tpot_slo_s:
                        break  # both only grow with c
                    best = max(best, ev.tokens_per_s * (sc.num_devices // (n * k)))
    return best


def test_engineer_best_against_brute_force(tmp_path):
    """engineer-best finds what scanning every concurrency finds for the even split, and no more
    than scanning every split: per class, over every degree and stage count."""
    ctx = context(tmp_path, "gpt2", tpot_s=0.003, prompt=128, output=64)
    for name in (BIG, SMALL):
        even = _brute_force_class(ctx, name, lambda L, n: [even_split(L, n)])
        every = _brute_force_class(ctx, name, lambda L, n: [c for c in _compositions(L, n)])
        found = max(p.ev.tokens_per_s * count for p, count in class_patterns(ctx, name))
        assert 0 < even * (1 - 1e-9) <= found <= every * (1 + 1e-9)


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


def _serve(tmp_path, *extra, model="llama2-7b", prompt="256", output="128", out="p.yaml") -> int:
    """`plan --objective serving` on the small fleet, written to tmp_path / out."""
    spec = write_fleet(tmp_path)
    argv = ["plan", "--cluster", str(spec), "--model", model, "--objective", "serving"]
    return main([*argv, "--prompt-len", prompt, "--output-len", output, "-o", str(tmp_path / out), *extra])


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> Path:
    """`plan --objective serving` at 50 ms on the small fleet, once per module: the tests below read
    or edit its file (each edit written beside it, so its inputs resolve as the plan's do)."""
    folder = tmp_path_factory.mktemp("serving")
    assert _serve(folder, "--tpot-slo", "50 ms", out="serving.yaml") == 0
    return folder / "serving.yaml"


def test_plan_file_verifies_and_shows(planned, capsys):
    assert main(["verify", str(planned)]) == 0
    assert main(["show", str(planned)]) == 0
    text = capsys.readouterr().out
    assert "engineer-best" in text and "tokens/s" in text


def _verify_edited(planned: Path, capsys, edit) -> str:
    """Edit the plan file's data into a file of its own beside it, and return what verify prints (it must exit 1)."""
    data = yaml.safe_load(planned.read_text())
    edit(data)
    out = planned.with_name(f"{edit.__name__}.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    return capsys.readouterr().out


def test_verify_refuses_a_steady_state_that_does_not_fit(planned, capsys):
    def more_sequences(data):
        data["serving"]["replicas"][0]["concurrency"] *= 50  # the derived figures no longer match either

    text = _verify_edited(planned, capsys, more_sequences)
    assert "bytes per device" in text and "usable" in text


def test_verify_refuses_a_forged_bound(planned, capsys):
    def forge(data):
        data["serving"]["upper_bound_tokens_per_s"] = data["serving"]["tokens_per_s"]
        data["serving"]["gap"], data["serving"]["status"] = 0.0, "optimal"

    text = _verify_edited(planned, capsys, forge)
    assert "upper_bound_tokens_per_s" in text and "status: optimal" in text


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ({"nowhere/gpu": 1.0}, "serving.device_prices: nowhere/gpu not a class of the cluster"),
    ],
)
@pytest.mark.slow  # plans before it forges: about a minute on 2 cores
def test_verify_refuses_device_prices_it_cannot_use(planned, capsys, prices, message):
    def forge(data):
        data["serving"]["device_prices"] = prices

    assert message in _verify_edited(planned, capsys, forge)


def test_verify_refuses_a_device_used_twice(planned, capsys):
    def share(data):
        rep = next(r for r in data["serving"]["replicas"] if len(r["devices"][0]) > 1)
        rep["devices"][0][1] = rep["devices"][0][0]  # stage 1 on stage 0's devices

    assert "also used by" in _verify_edited(planned, capsys, share)


def test_plan_works_from_another_directory(planned, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["verify", str(planned)]) == 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--tpot-slo", "1 ms"], ["--tpot-slo", "cannot be met"]),
        (["--tpot-slo", "50 ms", "--ttft-slo", "1 ms"], ["--ttft-slo 1 ms cannot be met", "to the first token"]),
        (
            ["--tpot-slo", "10 s", "--max-batched-tokens", "1"],
            ["meets the targets with one sequence in flight", "(--max-batched-tokens 1)"],
        ),
        (["--tpot-slo", "50"], ["--tpot-slo", "'50' has no unit: write '50 ms' or '50 s'"]),
        (["--tpot-slo", "1e308 s"], ["--tpot-slo", "outside 1 ms to 10 s"]),
        (["--tpot-slo", "1e6 s"], ["--tpot-slo", "outside 1 ms to 10 s"]),
        (["--tpot-slo", "0.1 ms"], ["--tpot-slo", "outside 1 ms to 10 s"]),
        (["--tpot-slo", "nan s"], ["--tpot-slo"]),
        (["--tpot-slo", "50 ms", "--ttft-slo", "2"], ["--ttft-slo", "'2' has no unit"]),
        (["--tpot-slo", "-3"], ["--tpot-slo"]),
        (["--tpot-slo", "fast"], ["--tpot-slo"]),
        ([], ["--tpot-slo", "required"]),
    ],
)
def test_bad_targets_exit_2_naming_the_flag(tmp_path, capsys, args, words):
    rc = _serve(tmp_path, *args)
    assert rc == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_a_context_no_memory_holds_exits_2(tmp_path, capsys):
    rc = _serve(tmp_path, "--tpot-slo", "10 s", model="llama2-70b", prompt="4000", output="96")
    assert rc == 2
    assert "one sequence" in capsys.readouterr().err


def test_a_malformed_workload_file_exits_2_naming_it(tmp_path, capsys):
    spec = write_fleet(tmp_path)
    bad = tmp_path / "shapes.yaml"
    bad.write_text("requests:\n  - {prompt_len: 100, output_len: -4}\n")
    rc = main(
        [
            "plan",
            "--cluster",
            str(spec),
            "--model",
            "llama2-7b",
            "--objective",
            "serving",
            "--workload",
            str(bad),
            "--tpot-slo",
            "50 ms",
            "-o",
            str(tmp_path / "p.yaml"),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "shapes.yaml" in err and "output_len" in err


def test_a_workload_distribution_weights_contexts_by_output(tmp_path):
    from llm_planner.serving.workload import RequestShape, ServingWorkload

    wl = ServingWorkload(
        requests=(RequestShape(prompt_len=100, output_len=100), RequestShape(prompt_len=1000, output_len=10)),
        tpot_slo_s=0.1,
    )
    assert wl.prefill_per_output == pytest.approx(550 / 55)
    assert wl.kv_context == pytest.approx((100 * 200 + 10 * 1010) / 110)  # in flight: weighted by how long each stays


def test_cpu_stages_only_when_allowed(tmp_path):
    ctx = context(tmp_path, "gpt2")
    assert all(c.kind.type != "cpu" for c in ctx.classes)
    ctx = context(tmp_path, "gpt2", allow_cpu=True)
    cpus = [c for c in ctx.classes if c.kind.type == "cpu"]
    assert cpus and all(c.degrees == (1,) for c in cpus)


@pytest.fixture(
    scope="module",
    params=["mixed", "four-gpus", "moe", "eplb", "deepseek", "glm", "per-sequence", "fp8-cache", "w8a8"],
)
def bound_ctx(request, tmp_path_factory):
    """Two fleets and the bound on each: classes mixed, and the example four-GPU server where the
    bound is within a few percent of the best plan (a bound cut too low fails there); the mixed
    fleet again with an engine time per sequence on every GPU kind (the head's pieces carry it),
    with an fp8 KV cache one kind reads at the 16-bit cache's time (kv_dequant_factor), and with
    fp8 weights (W8A8) on kinds with an fp8 peak, one of them paying a fixed time a layer for it and
    a floor on decode attention per key of a sequence (decode_key_s)."""
    if request.param == "per-sequence":
        text = SMALL_FLEET.replace("step_overhead_s: 0.5 ms}", "step_overhead_s: 0.5 ms, sequence_overhead_s: 40 us}")
        assert text.count("sequence_overhead_s") == 2
        cluster = load_cluster(write_fleet(tmp_path_factory.mktemp("bound"), text))
    elif request.param == "fp8-cache":
        text = SMALL_FLEET.replace("step_overhead_s: 0.5 ms}", "step_overhead_s: 0.5 ms, kv_dequant_factor: 2}", 1)
        cluster = load_cluster(write_fleet(tmp_path_factory.mktemp("bound"), text))
        assert sorted(k.kv_dequant_factor for k in cluster.device_kinds if k.type == "gpu") == [1.0, 2.0]
    elif request.param == "w8a8":
        text = SMALL_FLEET.replace("{fp16: 300 TFLOP/s}", "{fp16: 300 TFLOP/s, fp8: 600 TFLOP/s}")
        text = text.replace("{fp16: 120 TFLOP/s}", "{fp16: 120 TFLOP/s, fp8: 240 TFLOP/s}")
        fixed = "step_overhead_s: 0.5 ms, w8a8_overhead_s: 20 us, decode_key_s: 50 ns}"
        text = text.replace("step_overhead_s: 0.5 ms}", fixed, 1)
        cluster = load_cluster(write_fleet(tmp_path_factory.mktemp("bound"), text))
        assert sorted(k.w8a8_overhead_s for k in cluster.device_kinds if k.type == "gpu") == pytest.approx([0.0, 2e-5])
    elif request.param in ("mixed", "moe", "eplb", "deepseek", "glm"):
        cluster = load_cluster(write_fleet(tmp_path_factory.mktemp("bound")))
    else:
        cluster = load_cluster(str(Path(__file__).resolve().parents[1] / "cluster_specs" / "four-gpus.yaml"))
    # GPT-2 XL at 10 ms on the mixed fleet: the cell bound is the least of the bounds and the search's
    # plan within 6% of it; as with LLaMA-2 13B at 30 ms, the drawn fleets fail a cell bound scaled by
    # 0.82 (not one by 0.88), and the cell bound takes 6 s of one core instead of 40; a mixture of
    # experts: its layer time concave in the tokens' experts (the bounds read a lower bound); DeepSeek's
    # latent attention and dense first layers, which the first stage holds besides its share
    model, tpot_s = {
        "mixed": ("gpt2-xl", 0.01),
        "per-sequence": ("gpt2-xl", 0.01),
        "four-gpus": ("llama3-8b", 0.03),
        "moe": ("qwen1.5-moe-a2.7b", 0.03),
        "eplb": ("qwen1.5-moe-a2.7b", 0.03),  # a skewed router, its experts rebalanced with 4 redundant
        "deepseek": (small_deepseek(), 0.03),
        "glm": (small_glm(), 0.03),  # GLM-4.5's dense first layer beside grouped-query attention
        "fp8-cache": ("gpt2-xl", 0.01),
        "w8a8": ("gpt2-xl", 0.01),
    }[request.param]
    config = model if isinstance(model, DecoderConfig) else preset_config(model)
    # a mixture of experts' groups with data-parallel attention both ways: gathers and DeepEP
    options = ServingOptions(deepep=config.is_moe)
    if request.param == "eplb":
        load = ExpertLoad(source="skewed", layers=(tuple(float(120 - 2 * e) for e in range(60)),))
        skew = {"dp_imbalance": load.dp_imbalance(4), "expert_imbalance": load.expert_imbalance()}
        options = ServingOptions(deepep=True, eplb=4, expert_picks=load.picks(config.experts_per_token), **skew)
    precision = {"fp8-cache": build_precision("fp16", None, "fp8"), "w8a8": build_precision("fp16", "fp8", None)}.get(
        request.param, "fp16"
    )
    ctx = ServingContext(cluster, config, workload(256, 128, tpot_s), precision, options)
    # each of the three bounds on its own (tokens_upper_bound is their least, with a cell bound whose
    # refinement may stop early, so at least the full one here)
    bounds = (
        concurrency_level_bound(ctx.cache, ctx.classes, tpot_s),
        batch_level_bound(ctx.cache, ctx.classes, tpot_s),
        cell_bound(ctx.cache, ctx.classes, tpot_s, cluster.inter_node),
        # Farley's bound holds at any positive prices: every device alike, and each class at its
        # per-device rate bound (roughly what the fleet LP prices it)
        price_bound(ctx.cache, ctx.classes, tpot_s, cluster.inter_node, dict.fromkeys(ctx.capacity, 1.0)),
        price_bound(ctx.cache, ctx.classes, tpot_s, cluster.inter_node, _rate_prices(ctx)),
    )
    return ctx, bounds


def _rate_prices(ctx) -> dict[str, float]:
    return {sc.name: device_rate_bound(ctx.cache, sc, ctx.workload.tpot_slo_s) for sc in ctx.classes}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.heavy
def test_bound_holds_for_any_fleet(bound_ctx, data):
    """Any set of replicas the model can express on disjoint devices (classes mixed, degrees,
    micro-batches, each at its best concurrency and split) serves no more than the bound."""
    ctx, bounds = bound_ctx
    total = draw_fleet_tokens(data, ctx)
    assert all(total <= bound * (1 + 1e-9) for bound in bounds)


def draw_fleet_tokens(data, ctx) -> float:
    """The tokens/s of replicas drawn on disjoint devices until none is left or the draw stops, each
    at its best concurrency and split for a drawn number of micro-batches."""
    left, total = dict(ctx.capacity), 0.0
    while any(left.values()) and data.draw(st.booleans() if total else st.just(True)):
        model = ctx.replica(_draw_layout(data, ctx, left))
        ev = model.best_at(data.draw(st.integers(1, model.p))) if model.p <= ctx.tasks.num_layers else None
        total += ev.tokens_per_s if ev is not None else 0.0
    return total


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.heavy  # shares the fleets' bound contexts (about 95 s to build) with the test above
def test_no_replica_exceeds_its_layouts_optimistic_tokens(bound_ctx, data):
    """The search's price check skips a layout whose optimistic tokens/s its devices' prices reach:
    no operating point of any layout (classes mixed, degrees, micro-batches; the search's refined
    evaluation) serves more, and it is never above the devices' rate bound over L it replaced."""
    ctx, _ = bound_ctx
    optimistic = OptimisticTokens(ctx)
    layout = _draw_layout(data, ctx, dict(ctx.capacity))
    model = ctx.replica(layout)
    if model.p > ctx.tasks.num_layers:
        return
    ev = model.best(sorted({1, max(1, model.p // 2), model.p}), refine=True)
    rates = _rate_prices(ctx)
    assert optimistic(layout) <= sum(s.devices * rates[s.class_name] for s in layout) / ctx.tasks.num_layers * (
        1 + 1e-9
    )
    assert ev is None or ev.tokens_per_s <= optimistic(layout) * (1 + 1e-9)


def _draw_layout(data, ctx, left: dict) -> tuple:
    """Up to three segments on devices still free (`left` is updated), any group shape the class
    offers (tensor-parallel, or data-parallel attention for a mixture of experts)."""
    layout = []
    for _ in range(data.draw(st.integers(1, 3))):
        free = sorted(n for n, c in left.items() if c > 0)
        if not free:
            break
        name = data.draw(st.sampled_from(free))
        k, attention = data.draw(st.sampled_from([s for s in ctx.by_name[name].shapes if s[0] <= left[name]]))
        n = data.draw(st.integers(1, left[name] // k))
        layout.append(Segment(name, k, n, attention))
        left[name] -= k * n
    return tuple(layout)


def test_refined_micro_batches_find_counts_between_1_p2_and_p():
    """LLaMA-2 70B over four T4s feeding four A100s at 200 ms: the best count of micro-batches is 7,
    which neither 1, p/2 nor p is; the refined search finds it and is never below the coarse one."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.2)
    spec = Path(__file__).resolve().parents[1] / "cluster_specs" / "a100-l4-t4-cloud.yaml"
    ctx = build_context(str(spec), "llama2-70b", wl, "fp16", ServingOptions())
    model = ctx.replica((Segment("t4/t4", 1, 4), Segment("a100/a100-40g", 1, 4)))
    coarse, refined = model.best(), model.best(refine=True)
    by_m = {m: model.best_at(m) for m in range(1, model.p + 1)}
    best_m = max((m for m in by_m if by_m[m]), key=lambda m: by_m[m].tokens_per_s)
    assert best_m not in (1, model.p // 2, model.p)
    assert refined.tokens_per_s >= coarse.tokens_per_s
    assert refined.tokens_per_s == pytest.approx(by_m[best_m].tokens_per_s)
    assert refined.tpot_s <= 0.2


@pytest.mark.heavy
def test_price_bound_sees_what_the_search_may_have_missed():
    """LLaMA-3 70B on 8 H100 + 8 A10G at 50 ms: the first two bounds let the A10Gs add their rate
    (8,672 tokens/s), the cell bound's cells stay coarse (7,402); at the search's device prices
    no replica earns more than a few percent above what its devices are worth, so the price bound
    (5,987) is within 5% of the plan (two TP4 groups of H100s, 5,906 tokens/s)."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.05)
    spec = Path(__file__).resolve().parents[1] / "cluster_specs" / "h100-a10g.yaml"
    ctx = build_context(str(spec), "llama3-70b", wl, "fp16", ServingOptions())
    fleet, _ = solve_serving(ctx)
    first_two = tokens_upper_bound(ctx.cache, ctx.classes, 0.05, tokens_per_s=float("inf"))
    prices = price_bound(ctx.cache, ctx.classes, 0.05, ctx.cluster.inter_node, fleet.prices)
    assert fleet.tokens_per_s <= prices < 0.95 * first_two
    assert fleet.tokens_per_s >= 0.95 * prices


def test_the_price_bound_charges_the_head_stage_its_time_per_sequence():
    """LLaMA-3 8B on four A100s at 100 ms (the catalog's 51 us a sequence): the plan runs 302 in
    flight on each GPU, so 15 ms of its 100 ms TPOT is the engine's work per sequence on the stage
    that holds the head. The first two bounds leave the head out (14,683 tokens/s); the price bound
    gives the head stage's busy period the head's least time and lands within 1% of the plan
    (12,115; 14,298 before it did)."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.1)
    spec = Path(__file__).resolve().parents[1] / "cluster_specs" / "four-gpus.yaml"
    ctx = build_context(str(spec), "llama3-8b", wl, "fp16", ServingOptions())
    fleet, _ = solve_serving(ctx)
    prices = price_bound(ctx.cache, ctx.classes, 0.1, ctx.cluster.inter_node, fleet.prices)
    assert fleet.tokens_per_s <= prices <= 1.01 * fleet.tokens_per_s


@pytest.mark.parametrize("micro_batch", [1, 52, 300])
def test_cell_bounds_charge_the_hand_offs_a_pipeline_pays(micro_batch):
    """LLaMA-2 70B over single-GPU servers (10 Gb/s between them): the cell and price bounds charge
    each stage but one the least hand-off of its micro-batch (latency and bytes over its fastest
    link), and the replica model pays at least that on every pipeline (at 52 sequences the bytes
    take over 30 times the latency: with the latency alone, the serving benchmark's 1 s row of this
    cluster had a 14.4% gap to the price bound, with the bytes 9.0%)."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=1.0)
    spec = Path(__file__).resolve().parents[1] / "cluster_specs" / "a100-l4-t4-cloud.yaml"
    ctx = build_context(str(spec), "llama2-70b", wl, "fp16", ServingOptions())
    kinds = {kd.class_name: kd for kd in stage_kinds(ctx.cache, ctx.classes, ctx.cluster.inter_node)}
    layout = (Segment("l4/l4", 1, 4), Segment("a100/a100-40g", 1, 4), Segment("t4/t4", 1, 12))
    charged = [kinds[seg.class_name].hop_s(micro_batch) for seg in layout for _ in range(seg.stages)]
    paid = ctx.replica(layout).handoffs_s(micro_batch)
    assert sum(charged) - max(charged) <= paid <= sum(charged) * (1 + 1e-9)
    latency_only = sum(ctx.cluster.inter_node.latency_s for _ in charged)
    assert sum(charged) > {1: 1.0, 52: 30.0, 300: 100.0}[micro_batch] * latency_only


@pytest.mark.parametrize("micro_batch", [1, 64])
def test_one_server_bounds_charge_no_hand_off_between_classes(micro_batch):
    """The four-GPU server with its CPUs offered: one server, no link between servers, and the
    replica model hands on from an A100 stage to a CPU stage for nothing, so the bounds charge no
    hand-off there (charging the A100s' own link would put the bound below such a replica)."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.1)
    spec = Path(__file__).resolve().parents[1] / "cluster_specs" / "four-gpus.yaml"
    ctx = build_context(str(spec), "llama3-8b", wl, "fp16", ServingOptions(allow_cpu=True))
    assert ctx.cluster.inter_node is None
    kinds = {(kd.class_name, kd.k): kd for kd in stage_kinds(ctx.cache, ctx.classes, ctx.cluster.inter_node)}
    for layout in [(Segment("server/a100-80g", 1, 1), Segment("server/xeon-8380", 1, 1))] + [
        (Segment("server/a100-80g", 2, 1), Segment("server/xeon-8380", 1, 2))
    ]:
        charged = [kinds[(seg.class_name, seg.degree)].hop_s(micro_batch) for seg in layout for _ in range(seg.stages)]
        assert sum(charged) - max(charged) <= ctx.replica(layout).handoffs_s(micro_batch)


def test_one_server_hand_offs_between_kinds_take_the_server_link():
    """The workstation of an A100 and a T4 (one server, no network): the A100 stage hands its
    micro-batch to the T4 over the server's PCIe link, and the token goes back over it, each at
    latency plus bytes over bandwidth (not for nothing, as when only the network was charged)."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.05)
    spec = Path(__file__).resolve().parents[1] / "cluster_specs" / "cpu-two-gpus.yaml"
    ctx = build_context(str(spec), "llama3-8b", wl, "fp16", ServingOptions())
    gpu, t4 = "workstation/a100-40g-pcie", "workstation/t4"
    model = ctx.replica((Segment(gpu, 1, 1), Segment(t4, 1, 1)))
    link = ctx.between[(gpu, t4)]
    b = 118
    expected = (
        2 * link.latency_s
        + b * (ctx.tasks.handoff_bytes_per_seq + ctx.tasks.return_bytes_per_seq) / link.bw_bytes_per_s
    )
    assert model.handoffs_s(b) == pytest.approx(expected)


@pytest.mark.heavy
def test_cell_bound_prices_whole_replicas():
    """LLaMA-2 13B on two RTX 4090s at 50 ms: the per-device bounds let each GPU run at its own best
    rate; the cell bound, where the pair serves one tokens/s at one concurrency, is tighter, and
    still above the best plan (the pair in tensor parallelism, as the planner and engineer-best find)."""
    wl = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=256),), tpot_slo_s=0.05)
    spec = Path(__file__).resolve().parents[1] / "cluster_specs" / "rtx4090-workstation.yaml"
    ctx = build_context(str(spec), "llama2-13b", wl, "fp16", ServingOptions())
    per_device = tokens_upper_bound(ctx.cache, ctx.classes, 0.05, tokens_per_s=float("inf"))
    cells = cell_bound(ctx.cache, ctx.classes, 0.05, ctx.cluster.inter_node)
    fleet, _ = solve_serving(ctx)
    assert fleet.tokens_per_s <= cells < 0.98 * per_device
    assert tokens_upper_bound(ctx.cache, ctx.classes, 0.05, ctx.cluster.inter_node) == cells


ONE_BOX = """name: one-box
device_kinds:
  - {name: g, type: gpu, peak_flops: {fp16: 165 TFLOP/s}, mem_bytes: 24 GB, mem_bw_bytes_per_s: 1000 GB/s,
     compute_efficiency: 0.6, mem_efficiency: 0.8, overhead_s: 10 us}
nodes:
  - {name: box, devices: {g: 2}, links: [{between: [g, g], bw_bytes_per_s: 25 GB/s, latency_s: 10 us}]}
"""


@pytest.mark.parametrize(
    "decode, tpot_s",
    [
        ("[[1, 0.001], [64, 0.001], [128, 0.0005]]", 1.0),  # falls past its last point, to 0 from 192
        ("[[1, 0.0001], [2, 0.004], [4096, 0.005]]", 0.0025),  # steep first piece: best at one sequence
    ],
)
def test_measured_times_that_fall_or_jump_stay_under_the_optimistic_value_and_the_bounds(tmp_path, decode, tpot_s):
    """A measured table's times need not increase, and its end pieces are extended down to 0: the
    rate bound looks at both ends of every piece and at where an extended piece reaches 0, so one
    GPU's best replica (GPT-2 at its best concurrency) stays under the search's optimistic value
    and under the first two bounds."""
    (tmp_path / "c.yaml").write_text(ONE_BOX)
    (tmp_path / "p.yaml").write_text(
        "format: serving-profile/1\nmodel: gpt2\ndtype: fp16\nsource: constructed\nkinds:\n  g:\n"
        f"    decode_layer_s: {decode}\n    prefill_layer_s: [[0, 0], [10, 0.0]]\n"
    )
    wl = ServingWorkload(requests=(RequestShape(prompt_len=64, output_len=64),), tpot_slo_s=tpot_s)
    ctx = build_context(str(tmp_path / "c.yaml"), "gpt2", wl, "fp16", ServingOptions(), str(tmp_path / "p.yaml"))
    layout = (Segment("box/g", 1, 1),)
    ev = ctx.replica(layout).best([1], refine=True)
    assert ev is not None
    assert ev.tokens_per_s <= OptimisticTokens(ctx)(layout) * (1 + 1e-9)
    assert ev.tokens_per_s <= tokens_upper_bound(ctx.cache, ctx.classes, tpot_s, tokens_per_s=float("inf"))


def test_the_engines_time_per_sequence_is_paid_once_per_iteration_on_the_last_stage(tmp_path):
    """sequence_overhead_s adds s b to the head's part: the last stage's iteration grows by it, the
    others do not, the verifier's own head time agrees, and a group with data-parallel attention
    pays it on each rank's b / k sequences."""
    text = SMALL_FLEET.replace("step_overhead_s: 0.5 ms}", "step_overhead_s: 0.5 ms, sequence_overhead_s: 40 us}")
    (tmp_path / "slow").mkdir()
    clusters = {"base": load_cluster(write_fleet(tmp_path)), "slow": load_cluster(write_fleet(tmp_path / "slow", text))}
    times, heads, dp = {}, {}, {}
    for name, cluster in clusters.items():
        ctx = ServingContext(cluster, preset_config("gpt2-xl"), workload(256, 128, 0.05), "fp16", ServingOptions())
        costs = ctx.cache.get("bigbox/big", 1)
        times[name] = [costs.stage_s(16, 12, first, last) for first, last in ((True, False), (False, True))]
        heads[name] = (costs.part_s("lm_head", 16), verify_replica._Costs(ctx, "bigbox/big", 1).part_s("lm_head", 16))
        moe = ServingContext(cluster, small_deepseek(), workload(256, 128, 0.05), "fp16", ServingOptions())
        dp[name] = moe.cache.get("bigbox/big", 2, "dp").part_s("lm_head", 16)
    assert times["slow"][0] == pytest.approx(times["base"][0])
    assert times["slow"][1] - times["base"][1] == pytest.approx(16 * 40e-6)
    assert heads["slow"][0] == pytest.approx(heads["slow"][1]) and heads["base"][0] == pytest.approx(heads["base"][1])
    assert dp["slow"] - dp["base"] == pytest.approx(16 * 40e-6 / 2)
