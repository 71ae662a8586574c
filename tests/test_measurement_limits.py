"""Numbers no engine run can have, in the files `calibrate --serving` reads and on the command lines of
`score` and `plan`: each an exit 2 naming the file (or flag) and the key, before the model's
arithmetic overflows or runs for hours; and a calibration that would write its spec over one of
its measurements refused."""

from __future__ import annotations

import json
import math

import pytest
from serving_fixtures import write_fleet
from test_calibrate_serving import _report, _vllm
from test_cli_flags import refused
from test_genai_perf_results import _genai
from test_import_vidur import MODEL, write_vidur

from llm_planner.cli.main import main
from llm_planner.core.precision import build_precision
from llm_planner.graph.model_names import same_model
from llm_planner.serving.closed_loop import MOST_CONCURRENCY, closed_loop
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.layer_time import HULL_MOST, RooflineLayerTime
from llm_planner.serving.layout_text import parse_layout
from llm_planner.serving.workload import RequestShape, ServingWorkload

TP2 = "1 x bigbox/big[tp2]"


def _calibrate(tmp_path, doc: dict, name: str = "run.json") -> list[str]:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    spec = str(write_fleet(tmp_path))
    out = str(tmp_path / "o.yaml")
    return ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", "--replica", TP2, "-o", out, str(path)]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"total_input_tokens": 1e300}, ("total_input_tokens / completed", "16,777,216")),
        ({"total_output_tokens": 1e300}, ("total_output_tokens / completed",)),
        ({"median_tpot_ms": 1e-300}, ("median_tpot_ms", "1 us to an hour")),
        ({"median_ttft_ms": 1e300}, ("median_ttft_ms", "1 us to an hour")),
        ({"output_throughput": 1e300}, ("output_throughput",)),
        ({"max_concurrency": 1e18}, ("max_concurrency", "1,048,576")),
        ({"max_concurrency": None, "request_rate": -2.0}, ("request_rate", "above 0")),
        ({"max_concurrency": None, "request_rate": 2.0, "concurrency": 1e300}, ("the mean in flight",)),
        ({"input_lens": [10**12] * 32, "output_lens": [128] * 32}, ("input_lens[0]", "16,777,216")),
    ],
)
def test_an_engine_result_past_any_run_is_refused_naming_the_key(tmp_path, capsys, changes, words):
    refused(_calibrate(tmp_path, _vllm(8, 0.0077, 1039.0, 0.0256) | changes), capsys, "run.json", *words)


@pytest.mark.parametrize(
    ("where", "changes", "words"),
    [
        ("replica", {"max_batched_tokens": 1e15}, ("replicas[0]", "max_batched_tokens", "1,048,576")),
        ("replica", {"concurrency": 2**21}, ("replicas[0]", "concurrency")),
        ("workload", {"prompt_len": 1e300}, ("workload", "prompt_len")),
        ("measured", {"tpot_p50_s": 7200.0}, ("replicas[0].measured", "tpot_p50_s", "1 us to an hour")),
    ],
)
def test_a_run_report_past_any_run_is_refused_naming_the_key(tmp_path, capsys, where, changes, words):
    report = _report(TP2)
    part = {"replica": report["replicas"][0], "workload": report["workload"]}.get(where)
    part = report["replicas"][0]["measured"] if where == "measured" else part
    part.update(changes)
    refused(_calibrate(tmp_path, report), capsys, "run.json", *words)


def test_a_genai_perf_export_past_any_run_is_refused_naming_the_metric(tmp_path, capsys):
    huge = _genai({"unit": "ms", "avg": 19.0}, num_input_token={"unit": "tokens", "avg": 1e300})
    refused(_calibrate(tmp_path, huge), capsys, "run.json", "num_input_token")
    crowd = _genai({"unit": "ms", "avg": 19.0}, input_config={"concurrency": 1e300})
    refused(_calibrate(tmp_path, crowd), capsys, "run.json", "concurrency")
    instant = _genai({"unit": "ns", "avg": 1e-3})
    refused(_calibrate(tmp_path, instant), capsys, "run.json", "inter_token_latency", "1 us to an hour")


def test_calibrate_will_not_write_its_spec_over_a_measurement(tmp_path, capsys):
    argv = _calibrate(tmp_path, _vllm(8, 0.0077, 1039.0, 0.0256))
    result = argv[-1]
    before = (tmp_path / "run.json").read_text()
    argv[argv.index("-o") + 1] = result
    refused(argv, capsys, "run.json", "is the input RESULT", "would destroy it")
    assert (tmp_path / "run.json").read_text() == before


def test_a_request_past_a_rotary_models_positions_is_said_and_past_learned_ones_refused(tmp_path, capsys, caplog):
    spec = str(write_fleet(tmp_path))
    base = ["score", "--cluster", spec, "--replica", TP2, "--concurrency", "2", "--output-len", "128"]
    assert main([*base, "--model", "llama2-7b", "--prompt-len", "5000", "--json"]) == 0
    assert "--prompt-len + --output-len of 5128 tokens is past llama2-7b's 4096 positions" in caplog.text
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in caplog.text
    refused([*base, "--model", "gpt2", "--prompt-len", "1000"], capsys, "1128 tokens", "1024 learned positions")


def test_the_token_budget_has_one_range_for_plan_score_and_calibrate(tmp_path, capsys):
    spec = str(write_fleet(tmp_path))
    score = ["score", "--cluster", spec, "--model", "llama2-7b", "--replica", TP2, "--concurrency", "8"]
    score += ["--prompt-len", "512", "--output-len", "128", "--max-batched-tokens", str(2**20 + 1)]
    refused(score, capsys, "--max-batched-tokens", "1,048,576")
    argv = _calibrate(tmp_path, _vllm(8, 0.0077, 1039.0, 0.0256))
    refused([*argv, "--max-batched-tokens", str(2**24)], capsys, "--max-batched-tokens", "1,048,576")


def test_a_closed_loop_past_its_most_sequences_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="at most"):
        closed_loop(lambda d, p: 0.01, concurrency=MOST_CONCURRENCY + 1, prompt_len=8, output_len=8, token_budget=64,
                    chunked_prefill=True)  # fmt: skip
    spec = str(write_fleet(tmp_path))
    argv = ["score", "--cluster", spec, "--model", "llama2-7b", "--replica", TP2, "--prompt-len", "512"]
    argv += ["--output-len", "128", "--concurrency", str(MOST_CONCURRENCY + 1), "--closed-loop"]
    refused(argv, capsys, "--concurrency", "--closed-loop", "16,384")


def _block_time(tmp_path, budget: int) -> RooflineLayerTime:
    """llama2-7b's block on the small fleet's tp2 group, 512-token prompts and 128-token outputs."""
    workload = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=128),), tpot_slo_s=1.0)
    options = ServingOptions(max_batched_tokens=budget)
    ctx = build_context(str(write_fleet(tmp_path)), "llama2-7b", workload, "fp16", options)
    t = ctx.replica(parse_layout(TP2, ctx.by_name)).slots[0].costs.layer_time
    assert isinstance(t, RooflineLayerTime)
    return t


def test_a_budget_past_the_hulls_reach_keeps_only_pieces_below_the_time(tmp_path):
    """Past HULL_MOST sequences a micro-batch, the layer time takes no hull pieces (they would time
    every micro-batch one by one) and its spread-load pieces still lie below it."""
    wide = _block_time(tmp_path, 2**20)
    narrow = _block_time(tmp_path, 2048)
    assert math.floor(2**20 / (1 + wide.per_sequence.prompt_tokens)) > HULL_MOST
    assert len(wide.pieces) < len(narrow.pieces)
    for b in (1, 7, 64, 1000, 50_000, 200_000):
        assert wide.lower(b) <= wide(b) * (1 + 1e-9)


def test_names_of_one_model_match_and_of_two_do_not():
    assert same_model("meta-llama/Meta-Llama-3-8B", "llama3-8b") and same_model("meta-llama/Llama-2-7b-hf", "llama2-7b")
    assert not same_model("meta-llama/Meta-Llama-3-70B", "llama3-8b") and not same_model("Qwen/Qwen3-32B", "llama2-7b")
    assert same_model(None, "llama2-7b")


def test_a_profile_of_another_model_is_said(tmp_path, capsys, caplog):
    write_vidur(tmp_path / "vidur")
    profile = tmp_path / "p.yaml"
    argv = ["import", "vidur", str(tmp_path / "vidur"), "--gpu", "a100", "--model", MODEL, "--kind", "big"]
    assert main([*argv, "-o", str(profile)]) == 0
    spec = str(write_fleet(tmp_path))
    score = ["score", "--cluster", spec, "--replica", TP2, "--concurrency", "8", "--prompt-len", "512"]
    score += ["--output-len", "128", "--profile", str(profile), "--json"]
    assert main([*score, "--model", "llama3-8b"]) == 0
    assert "times the layers of" not in caplog.text
    assert main([*score, "--model", "llama3.1-8b"]) == 0  # the same layers under another name: said
    assert f"times the layers of {MODEL!r}, the model is 'llama3.1-8b'" in caplog.text
    assert main([*score, "--model", "llama2-7b"]) == 2  # other layers: refused, both shapes named
    err = " ".join(capsys.readouterr().err.split())
    assert "llama2-7b has other layers (hidden 4096, MLP 11008, 32 heads, 32 KV heads)" in err


@pytest.mark.parametrize("layers", ["1_6,16", "\uff11\uff16,16", "16,+16"])
def test_counts_are_read_in_ascii_digits_only(tmp_path, capsys, layers):
    spec = str(write_fleet(tmp_path))
    argv = ["score", "--cluster", spec, "--model", "llama2-7b", "--replica", TP2, "--concurrency", "8"]
    refused([*argv, "--prompt-len", "512", "--output-len", "128", "--layers", layers], capsys, "--layers")


def test_an_int4_group_that_does_not_divide_the_layers_is_refused(tmp_path, capsys):
    spec = str(write_fleet(tmp_path))
    argv = ["score", "--cluster", spec, "--model", "llama2-7b", "--replica", TP2, "--concurrency", "8"]
    argv += ["--prompt-len", "512", "--output-len", "128"]
    refused([*argv, "--weights", "int4-awq:g7"], capsys, "--weights int4-awq:g7", "hidden_size 4096")
    assert main([*argv, "--weights", "int4-awq:g64", "--json"]) == 0


def test_a_checkpoints_per_channel_group_passes_whatever_the_mlps_width(tmp_path):
    """`group_size: -1` plans a group of the hidden size (graph.checkpoint): llama2-7b's 11,008-wide
    MLP is no multiple of 4,096, and the group is still a row."""
    workload = ServingWorkload(requests=(RequestShape(prompt_len=512, output_len=128),), tpot_slo_s=1.0)
    precision = build_precision("fp16", "int4-gptq:g4096", None)
    build_context(str(write_fleet(tmp_path)), "llama2-7b", workload, precision, ServingOptions())
