"""`llm-planner score`: the layout notation read back (round trips and refusals), one replica scored at
one concurrency with the cost model's own figures, a plan's replicas reproduced, and every refusal an
exit 2 with its message."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
import yaml
from conftest import SPECS
from serving_fixtures import context, workload, write_fleet

from llm_planner.cli import main as cli_main
from llm_planner.cli.main import main
from llm_planner.core.spec import DeviceKindSpec
from llm_planner.export.engine_args import engine_token_budget
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.inputs import serving_precision
from llm_planner.serving.layout import Segment, describe
from llm_planner.serving.layout_text import LayoutError, parse_layout
from llm_planner.serving.search import candidate_layouts, with_ends

FOUR_GPUS = str(SPECS / "four-gpus.yaml")
SHAPE = ["--prompt-len", "256", "--output-len", "128"]
KEYS = {
    "replica": str,
    "layers": list,
    "concurrency": int,
    "admitted": int,
    "micro_batches": int,
    "tpot_s": float,
    "tokens_per_s": float,
    "ttft_s": float,
    "decode_step_s": float,
    "round_trip_s": float,
    "stage_s": list,
    "mem_bytes": list,
    "usable_bytes": list,
    "chunked_prefill": bool,
    "fits_memory": bool,
    "within_token_budget": bool,
    "max_batched_tokens": int,
}


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(cli_main, "console", cli_main.LiteralConsole(width=400))


def score_json(argv: list[str], capsys) -> tuple[dict, str]:
    """`score ... --json`: the one JSON object stdout holds, and stderr."""
    assert main(["score", *argv, "--json"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def refused(argv: list[str], capsys, *words: str) -> str:
    assert main(["score", *argv]) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "Traceback" not in captured.out + captured.err and captured.out == "", captured
    assert all(w in err for w in words), err
    return err


# -- the notation ------------------------------------------------------------------


def _compact(layout) -> str:
    return " -> ".join(f"{s.stages} x {s.class_name}" + (f"[tp{s.degree}]" if s.degree > 1 else "") for s in layout)


def test_every_layout_the_search_builds_reads_back_from_its_text(tmp_path):
    ctx = context(tmp_path, allow_cpu=True)  # CPU classes too: '1 CPU'
    layouts = candidate_layouts(ctx)
    layouts += [moved for layout in layouts for moved in with_ends(ctx, layout)]
    assert len(layouts) > 50 and any(len(layout) == 3 for layout in layouts)
    for layout in layouts:
        text = describe(layout, ctx.by_name)
        assert parse_layout(text, ctx.by_name) == layout, text
        bare = " -> ".join(part.rsplit(" in ", 1)[0].rsplit(" on ", 1)[0] for part in text.split(" -> "))
        assert "server" not in bare and parse_layout(bare, ctx.by_name) == layout, bare
        assert parse_layout(_compact(layout), ctx.by_name) == layout


def test_the_compact_form_and_spacing(tmp_path):
    ctx = context(tmp_path)
    want = (Segment("bigbox/big", 2, 2), Segment("smallbox/small", 1, 1))
    for text in ("2 x bigbox/big[tp2] -> 1 x smallbox/small", "2x bigbox/big[tp2]->1 x smallbox/small"):
        assert parse_layout(text, ctx.by_name) == want
    assert describe(want, ctx.by_name) == (
        "bigbox/big: 2 stages x tp2 on 2 servers -> smallbox/small: 1 stage x 1 GPU in 1 server"
    )


@pytest.mark.parametrize(
    "text, words",
    [
        ("bigbox/bog: 1 stage x 1 GPU", ["segment 1", "unknown class 'bigbox/bog'", "bigbox/big, smallbox/small"]),
        ("1 x smallbox/small -> bigbox/big: 1 stage x tp3", ["segment 2", "no tensor-parallel group of 3", "tp2"]),
        ("5 x bigbox/big", ["5 devices of bigbox/big", "more than the class has (4: 2 server(s) x 2)"]),
        ("2 x bigbox/big[tp2] -> 1 x bigbox/big", ["takes 5 devices of bigbox/big", "more than the class has"]),
        ("3 x smallbox/small", ["3 devices of smallbox/small is no block", "1, 2, 4 devices"]),
        ("bigbox/big: two stages", ["segment 1 'bigbox/big: two stages': expected", "stages x tp<k>"]),
        ("1 x bigbox/big ->", ["segment 2 is empty: expected"]),
        ("  ", ["no segment given"]),
        ("bigbox/big: 2 stages x tp2 in 1 server", ["span 2 server(s), not 1", "write 'on 2 servers'"]),
        ("bigbox/big: 1 stage x 1 CPU", ["written '1 GPU', not '1 CPU'"]),
        ("0 x bigbox/big", ["at least 1"]),
    ],
)
def test_a_layout_text_that_cannot_be_is_refused_saying_why(text, words, tmp_path):
    ctx = context(tmp_path)
    with pytest.raises(LayoutError) as info:
        parse_layout(text, ctx.by_name)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_an_unknown_class_names_allow_cpu_when_cpus_are_left_out(tmp_path):
    with pytest.raises(LayoutError, match=r"bigbox/host.*\(CPU classes only with --allow-cpu\)"):
        parse_layout("1 x bigbox/host", context(tmp_path).by_name)
    assert parse_layout("1 x bigbox/host", context(tmp_path, allow_cpu=True).by_name) == (Segment("bigbox/host", 1, 1),)


# -- scoring -----------------------------------------------------------------------


def test_one_gpu_replica_by_hand(capsys):
    """gpt2 on one A100 of four-gpus: one stage, one micro-batch, no hand-off, so TPOT is the stage's
    iteration and the round trip; tokens/s = C / TPOT; the figures are ReplicaModel.evaluate's."""
    argv = ["--cluster", FOUR_GPUS, "--model", "gpt2", *SHAPE, "--replica", "1 x server/a100-80g"]
    got, err = score_json([*argv, "--concurrency", "64"], capsys)
    assert err == "" and set(got) == set(KEYS)
    assert all(isinstance(got[k], t) for k, t in KEYS.items()), got
    assert got["replica"] == "server/a100-80g: 1 stage x 1 GPU in 1 server"
    assert (got["layers"], got["concurrency"], got["micro_batches"]) == ([12], 64, 1)
    assert got["fits_memory"] and got["within_token_budget"] and got["max_batched_tokens"] == 2048
    assert got["tpot_s"] == got["round_trip_s"] == got["stage_s"][0]
    assert got["tokens_per_s"] == pytest.approx(64 / got["tpot_s"], rel=1e-12)
    assert 0 < got["decode_step_s"] <= got["tpot_s"] < got["ttft_s"] * 10
    ctx = build_context(FOUR_GPUS, "gpt2", workload(256, 128), "fp16", ServingOptions())
    ev = ctx.replica((Segment("server/a100-80g", 1, 1),)).evaluate((12,), 64, 1)
    assert (got["tpot_s"], got["ttft_s"], got["mem_bytes"]) == (ev.tpot_s, ev.ttft_s, list(ev.mem_bytes))
    assert got["usable_bytes"] == [ctx.by_name["server/a100-80g"].kind.usable_mem_bytes]
    assert got["mem_bytes"][0] < got["usable_bytes"][0]


def test_the_table_names_the_layout_and_says_no_target_applies(capsys):
    argv = ["score", "--cluster", FOUR_GPUS, "--model", "gpt2", *SHAPE, "--replica", "1 x server/a100-80g[tp2]"]
    assert main([*argv, "--concurrency", "64", "--micro-batches", "2"]) == 0
    out = capsys.readouterr().out
    assert "server/a100-80g: 1 stage x tp2 in 1 server" in out and "no TPOT or TTFT target applies" in out
    assert "64 in flight, 2 micro-batches" in out and "warning" not in out
    (line,) = [line for line in out.splitlines() if "output tokens/s" in line]
    assert all(w in line for w in ("TPOT", "TTFT est.", "decode step"))


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[dict, str]:
    """A serving plan of llama2-7b on the small fleet (a two-stage tp2 replica with 2 micro-batches,
    and a one-stage tp4 one): its data and its cluster file."""
    folder = tmp_path_factory.mktemp("planned")
    spec, out = write_fleet(folder), folder / "serving.yaml"
    argv = ["plan", "--cluster", str(spec), "--model", "llama2-7b", "--objective", "serving", *SHAPE]
    argv += ["--tpot-slo", "50 ms", "--no-baselines", "--max-classes-per-replica", "1", "-o", str(out)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    return yaml.safe_load(out.read_text()), str(spec)


def test_score_of_a_plans_replica_gives_the_plans_figures(planned, capsys):
    data, spec = planned
    replicas = data["serving"]["replicas"]
    assert any(len(r["layers"]) > 1 and r["micro_batches"] > 1 for r in replicas)
    for rep in replicas:
        argv = ["--cluster", spec, "--model", "llama2-7b", *SHAPE, "--replica", rep["pattern"]]
        argv += ["--concurrency", str(rep["concurrency"]), "--micro-batches", str(rep["micro_batches"])]
        for layers in ([], ["--layers", ",".join(map(str, rep["layers"]))]):
            got, _ = score_json(argv + layers, capsys)
            assert got["replica"] == rep["pattern"] and got["layers"] == rep["layers"]
            for key in ("tpot_s", "tokens_per_s", "ttft_s", "round_trip_s"):
                assert math.isclose(got[key], rep[key], rel_tol=1e-9), (key, got[key], rep[key])
            assert got["fits_memory"] and got["within_token_budget"]


# -- what is scored anyway, and what is refused ----------------------------------------


def _fleet_argv(tmp_path, replica: str = "2 x bigbox/big[tp2]") -> list[str]:
    return ["--cluster", str(write_fleet(tmp_path)), "--model", "llama2-7b", *SHAPE, "--replica", replica]


def test_a_split_over_memory_is_scored_with_a_warning(tmp_path, capsys):
    got, err = score_json([*_fleet_argv(tmp_path), "--concurrency", "600", "--layers", "16,16"], capsys)
    assert got["fits_memory"] is False and got["layers"] == [16, 16]
    assert all(m > u for m, u in zip(got["mem_bytes"], got["usable_bytes"]))
    assert "warning: stage 0 holds 16 layers, over the" in " ".join(err.split())


def test_a_concurrency_over_the_token_budget_is_scored_with_a_warning(tmp_path, capsys):
    argv = [*_fleet_argv(tmp_path), "--concurrency", "64", "--max-batched-tokens", "64"]
    got, err = score_json(argv, capsys)
    assert got["within_token_budget"] is False and got["max_batched_tokens"] == 64 and got["fits_memory"]
    assert "overruns the token budget (--max-batched-tokens 64)" in " ".join(err.split())
    assert main(["score", *argv]) == 0
    assert "warning: --concurrency 64" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--concurrency", "2", "--micro-batches", "3"], ["--concurrency 2 is below --micro-batches 3"]),
        (["--concurrency", "8", "--layers", "16,15"], ["--layers 16,15 sums to 31, not the model's 32 layers"]),
        (["--concurrency", "8", "--layers", "32"], ["--layers gives 1 number(s)", "the replica has 2"]),
        (["--concurrency", "8", "--layers", "16,x"], ["--layers", "comma-separated whole numbers"]),
        (["--concurrency", "8", "--layers", "0,32"], ["--layers", "at least 1"]),
        (["--concurrency", "0"], ["--concurrency", "from 1"]),
        (
            ["--concurrency", "5000"],
            ["no split of the model's 32 layers fits memory at --concurrency 5000", "hold at most", "--layers"],
        ),
        (["--concurrency", "8", "--dtype", "fp8"], ["--dtype fp8"]),
        (["--concurrency", "8", "--model", "nosuch"], ["--model 'nosuch'", "`llm-planner models` lists them"]),
        (
            ["--concurrency", "1", "--prompt-len", "16777216"],
            ["the requests' lengths (--prompt-len", "16,777,216 tokens is past what the planner computes with"],
        ),
    ],
)
def test_each_refusal_exits_2_with_its_message(extra, words, tmp_path, capsys):
    refused([*_fleet_argv(tmp_path), *extra], capsys, *words)


@pytest.mark.parametrize(
    "replica, words",
    [
        ("1 x nobox/big", ["--replica: segment 1: unknown class 'nobox/big'", "bigbox/big, smallbox/small"]),
        ("bigbox/big: 2 stages x tp2 in 1 server", ["--replica:", "write 'on 2 servers'"]),
        ("9 x smallbox/small", ["--replica:", "more than the class has"]),
        ("bigbox/big 2 stages", ["--replica: segment 1", "expected"]),
        ("\uff12 x bigbox/big", ["--replica: segment 1", "expected"]),  # a full-width 2: counts are ASCII
        ("1 x bigbox/big[tp\u0662]", ["--replica: segment 1", "expected"]),  # an Arabic-Indic 2
    ],
)
def test_a_bad_replica_exits_2_naming_the_flag(replica, words, tmp_path, capsys):
    refused([*_fleet_argv(tmp_path, replica), "--concurrency", "8"], capsys, *words)


def test_a_group_on_a_kind_that_forms_none_says_so(capsys):
    argv = ["--cluster", FOUR_GPUS, "--allow-cpu", "--model", "gpt2", "--concurrency", "4"]
    argv += ["--replica", "1 x server/xeon-8380[tp2]", "--prompt-len", "10", "--output-len", "5"]
    refused(argv, capsys, "server/xeon-8380 forms no tensor-parallel group", "`tensor_parallel: false`")


def test_a_missing_prompt_length_or_model_is_refused(tmp_path, capsys):
    spec = str(write_fleet(tmp_path))
    base = ["--cluster", spec, "--replica", "1 x bigbox/big", "--concurrency", "8"]
    refused([*base, "--model", "llama2-7b", "--output-len", "8"], capsys, "--prompt-len")
    refused([*base, "--model", "resnet18", *SHAPE], capsys, "--model 'resnet18'")


def test_a_replica_on_a_kind_the_precision_left_out_says_why(tmp_path, capsys):
    """fp8 weights on gpt3-six-servers leave the V100s out (no fp8, no FP8 Marlin): the refusal of a
    V100 replica names them and the reason, not only the classes that remain."""
    argv = ["--cluster", str(SPECS / "gpt3-six-servers.yaml"), "--model", "llama3-70b", *SHAPE, "--weights", "fp8"]
    replica = ["--replica", "v100-server/v100-32g: 1 stage x tp2", "--concurrency", "4"]
    refused(
        [*argv, *replica],
        capsys,
        "unknown class 'v100-server/v100-32g'",
        "'v100-32g' (its peak_flops give no fp8",
    )


def test_weights_and_kv_cache_dtype_score_the_precision_a_plan_would_take(capsys):
    """--weights fp8 --kv-cache-dtype fp8 on an H100: the weights and cache read at one byte, so
    more tokens/s than fp16 at the same concurrency, and the same figures as the serving model at
    that precision; an unknown format exits 2 naming the flag."""
    spec = str(SPECS / "h100-a10g.yaml")
    argv = ["--cluster", spec, "--model", "llama3-8b", *SHAPE, "--replica", "1 x h100-server/h100-80g"]
    argv += ["--concurrency", "64"]
    plain, _ = score_json(argv, capsys)
    fp8, _ = score_json([*argv, "--weights", "fp8", "--kv-cache-dtype", "fp8"], capsys)
    assert fp8["tokens_per_s"] > plain["tokens_per_s"] and fp8["mem_bytes"][0] < plain["mem_bytes"][0]
    precision = serving_precision("llama3-8b", None, "fp8", "fp8")
    ctx = build_context(spec, "llama3-8b", workload(256, 128), precision, ServingOptions())
    ev = ctx.replica((Segment("h100-server/h100-80g", 1, 1),)).evaluate((32,), 64, 1)
    assert (fp8["tpot_s"], fp8["ttft_s"]) == (ev.tpot_s, ev.ttft_s)
    assert main(["score", *argv, "--weights", "int3"]) == 2
    assert "--weights int3" in capsys.readouterr().err


def test_an_engine_without_chunked_prefill_is_scored_with_whole_prompts(capsys, tmp_path):
    """--no-chunked-prefill: each prompt runs whole in an iteration of its own, reading the weights
    again (llm_planner.cost.chunks): slower per token and to the first token than chunked prefill on
    the same replica; the figures are the model's with the option set; a measured profile refused."""
    argv = ["--cluster", FOUR_GPUS, "--model", "gpt2", *SHAPE, "--replica", "1 x server/a100-80g"]
    argv += ["--concurrency", "64"]
    chunked, _ = score_json(argv, capsys)
    whole, err = score_json([*argv, "--no-chunked-prefill"], capsys)
    assert err == "" and chunked["chunked_prefill"] and not whole["chunked_prefill"]
    assert whole["tpot_s"] > chunked["tpot_s"] and whole["decode_step_s"] == chunked["decode_step_s"]
    options = ServingOptions(chunked_prefill=False)
    ctx = build_context(FOUR_GPUS, "gpt2", workload(256, 128), "fp16", options)
    ev = ctx.replica((Segment("server/a100-80g", 1, 1),)).evaluate((12,), 64, 1)
    assert (whole["tpot_s"], whole["ttft_s"]) == (ev.tpot_s, ev.ttft_s)
    profile = tmp_path / "p.yaml"
    profile.write_text("format: llm_planner.serving-profile/1\n")
    refused([*argv, "--no-chunked-prefill", "--profile", str(profile)], capsys, "--no-chunked-prefill", "profile")


def test_a_prompt_joining_a_loaded_replica_waits_for_its_visit_and_a_steady_iteration(capsys):
    """With 48 sequences in flight a new prompt waits half a cycle for its micro-batch's next visit
    and rides an iteration at least as long as the steady state's (which carries the others'
    prompt chunks too), so its TTFT is at least 1.5 TPOT; alone on the replica the engine is idle
    and its TTFT is its prompt's own iteration, shorter than that."""
    cluster = str(SPECS / "gpt3-six-servers.yaml")
    argv = ["--cluster", cluster, "--model", "gpt3-175b", "--replica", "1xa100-server/a100-80g[tp8]"]
    short = ["--prompt-len", "32", "--output-len", "256"]
    loaded, _ = score_json([*argv, *short, "--concurrency", "48"], capsys)
    assert loaded["ttft_s"] >= 1.5 * loaded["tpot_s"]
    alone, _ = score_json([*argv, *short, "--concurrency", "1"], capsys)
    assert alone["tpot_s"] <= alone["ttft_s"] < 1.5 * alone["tpot_s"]


def test_an_engine_is_scored_at_its_default_budget_and_with_its_way_with_prompts(capsys):
    """--engine: the engine's default token budget for the replica's GPUs (vLLM 2048 on an A100, 8192
    on an H100; SGLang 8192 on both) unless --max-batched-tokens is given, and SGLang's prompts in
    iterations of their own (no --enable-mixed-chunk) unless --chunked-prefill is; the figures are
    those of the same flags given by hand."""
    h100 = ["--cluster", str(SPECS / "h100-a10g.yaml"), "--model", "llama3-8b", *SHAPE, "--concurrency", "64"]
    h100 += ["--replica", "1 x h100-server/h100-80g"]
    a100 = [
        "--cluster",
        FOUR_GPUS,
        "--model",
        "gpt2",
        *SHAPE,
        "--concurrency",
        "64",
        "--replica",
        "1 x server/a100-80g",
    ]
    budgets = {}
    for name, argv in (("h100", h100), ("a100", a100)):
        for engine in ("vllm", "sglang"):
            got, _ = score_json([*argv, "--engine", engine], capsys)
            budgets[name, engine] = (got["max_batched_tokens"], got["chunked_prefill"])
    assert budgets == {
        ("h100", "vllm"): (8192, True),
        ("h100", "sglang"): (8192, False),
        ("a100", "vllm"): (2048, True),
        ("a100", "sglang"): (8192, False),
    }
    sglang, _ = score_json([*h100, "--engine", "sglang"], capsys)
    by_hand, _ = score_json([*h100, "--max-batched-tokens", "8192", "--no-chunked-prefill"], capsys)
    assert sglang == by_hand
    mixed, _ = score_json([*h100, "--engine", "sglang", "--chunked-prefill", "--max-batched-tokens", "4096"], capsys)
    assert (mixed["max_batched_tokens"], mixed["chunked_prefill"]) == (4096, True)
    refused([*h100, "--chunked-prefill", "--no-chunked-prefill"], capsys, "not allowed with argument")


def test_an_engines_default_budget_follows_its_smallest_gpu():
    def kind(gib: float, name: str = "gpu", catalog: str | None = None) -> DeviceKindSpec:
        return DeviceKindSpec(
            name=name, type="gpu", peak_flops=(("fp16", 1e14),), mem_bytes=gib * 2**30, mem_bw_bytes_per_s=1e12,
            catalog=catalog,
        )  # fmt: skip

    sglang = [engine_token_budget("sglang", [kind(g)]) for g in (16, 24, 79, 140, 180)]
    assert sglang == [2048, 4096, 8192, 8192, 16384]
    vllm = [engine_token_budget("vllm", [kind(g)]) for g in (24, 79, 140, 180)]
    assert vllm == [2048, 8192, 8192, 16384]
    assert engine_token_budget("vllm", [kind(80, catalog="a100-sxm-80g")]) == 2048  # vLLM's A100 exception
    assert engine_token_budget("vllm", [kind(80, name="A100-80G")]) == 2048
    assert engine_token_budget("sglang", [kind(180), kind(24)]) == 4096  # the smallest GPU's


def test_eplb_on_a_replica_without_data_parallel_attention_is_refused(capsys):
    """--eplb rebalances a dpaK group's experts; on a tensor-parallel replica it would change
    nothing, so it is refused rather than silently ignored."""
    argv = ["--cluster", str(SPECS / "h100-4x8.yaml"), "--model", "mixtral-8x7b", "--replica", "1 x hgx/h100[tp2]"]
    argv += ["--concurrency", "64", "--prompt-len", "512", "--output-len", "256", "--eplb", "4"]
    refused(argv, capsys, "--eplb rebalances the experts of a group with data-parallel attention", "has none")
