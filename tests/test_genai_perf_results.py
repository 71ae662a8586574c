"""genai-perf's and AIPerf's profile exports read as serving measurements for `calibrate --serving`
(llm_planner.measure.genai_perf): units, statistics, the concurrency or the request rate, and
every malformed export an exit 2 naming the file and the metric."""

from __future__ import annotations

import json

import pytest
from serving_fixtures import write_fleet
from test_cli_flags import refused

from llm_planner.measure.serving_results import read_serving_results

TP2 = "1 x bigbox/big[tp2]"


def _genai(itl: dict, **extra) -> dict:
    """What genai-perf's profile_export_genai_perf.json holds (older releases: ns, num_*_token)."""
    doc = {
        "request_throughput": {"unit": "requests/sec", "avg": 2.0},
        "request_latency": {"unit": "ns", "avg": 4.0e9, "p95": 4.5e9},
        "time_to_first_token": {"unit": "ns", "avg": 2.5e8, "p95": 3.0e8},
        "inter_token_latency": itl,
        "output_token_throughput": {"unit": "tokens/sec", "avg": 400.0},
        "num_output_token": {"unit": "tokens", "avg": 199.6, "p95": 200.0},
        "num_input_token": {"unit": "tokens", "avg": 1000.0, "p95": 1000.0},
        "input_config": {"model": ["meta-llama3-8b-instruct"], "concurrency": 8},
    }
    return doc | extra


def test_genai_perf_and_aiperf_exports_are_read_in_their_units(tmp_path):
    path = tmp_path / "profile_export_genai_perf.json"
    path.write_text(json.dumps(_genai({"unit": "ns", "avg": 1.9e7, "p95": 2.2e7})))
    (old,) = read_serving_results(path)
    assert (old.engine, old.concurrency, old.model) == ("genai-perf", 8, "meta-llama3-8b-instruct")
    assert old.measured.tpot_s == pytest.approx(0.019) and old.measured.ttft_s == pytest.approx(0.25)
    assert old.measured.tokens_per_s == 400.0 and "input_config.concurrency 8" in old.concurrency_note
    assert [(r.prompt_len, r.output_len) for r in old.requests] == [(1000, 200)]
    newer = _genai(
        {"unit": "ms", "avg": 19.0, "p50": 18.0}, input_config={"perf_analyzer": {"stimulus": {"concurrency": 32}}}
    )
    newer["output_sequence_length"] = newer.pop("num_output_token")
    path.write_text(json.dumps(newer))
    (new,) = read_serving_results(path)
    assert new.measured.tpot_s == pytest.approx(0.018) and new.concurrency == 32  # p50 before avg
    assert new.requests[0].output_len == 200 and new.model is None
    aiperf = _genai({"unit": "ms", "avg": 19.0}, input_config={"loadgen": {"concurrency": 64}})
    path.write_text(json.dumps(aiperf))
    assert read_serving_results(path)[0].concurrency == 64
    rate = _genai({"unit": "ms", "avg": 19.0}, input_config={"request_rate": 2.0})
    path.write_text(json.dumps(rate))
    (open_loop,) = read_serving_results(path)  # Little's law: 2 requests/s x 4 s mean latency
    assert open_loop.concurrency == 8 and "8.0 in flight" in open_loop.concurrency_note


def test_genai_perf_exports_name_the_metric_when_wrong(tmp_path, capsys):
    spec = str(write_fleet(tmp_path))
    base = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", "-o", str(tmp_path / "o.yaml")]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(_genai({"unit": "fortnights", "avg": 1.0})))
    refused([*base, "--replica", TP2, str(path)], capsys, "export.json", "inter_token_latency: unit", "fortnights")
    doc = _genai({"unit": "ms", "avg": 19.0})
    del doc["output_token_throughput"]
    path.write_text(json.dumps(doc))
    refused([*base, "--replica", TP2, str(path)], capsys, "export.json", "missing metric 'output_token_throughput'")
    doc = _genai({"unit": "ms", "avg": 19.0}, input_config={})
    path.write_text(json.dumps(doc))
    refused([*base, "--replica", TP2, str(path)], capsys, "export.json", "neither a concurrency", "--concurrency")


def test_a_rate_run_is_read_by_littles_law_under_its_concurrency_cap(tmp_path):
    path = tmp_path / "profile_export_aiperf.json"
    capped = _genai({"unit": "ms", "avg": 19.0}, input_config={"loadgen": {"request_rate": 2.0, "concurrency": 5}})
    path.write_text(
        json.dumps(capped | {"input_config": capped["input_config"] | {"endpoint": {"model_names": ["m"]}}})
    )
    (obs,) = read_serving_results(path)  # 2/s x 4 s = 8 in flight, but the run never held more than 5
    assert obs.concurrency == 5 and "at most input_config.loadgen.concurrency 5" in obs.concurrency_note
    assert obs.model == "m"


def test_an_export_without_streaming_or_lengths_is_refused_saying_why(tmp_path, capsys):
    spec = str(write_fleet(tmp_path))
    base = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", "-o", str(tmp_path / "o.yaml")]
    path = tmp_path / "export.json"
    doc = _genai({"unit": "ms", "avg": 19.0})
    del doc["inter_token_latency"]
    path.write_text(json.dumps(doc))
    refused([*base, "--replica", TP2, str(path)], capsys, "export.json", "--streaming")
    doc = _genai({"unit": "ms", "avg": 19.0})
    del doc["num_input_token"]
    path.write_text(json.dumps(doc))
    refused([*base, "--replica", TP2, str(path)], capsys, "'input_sequence_length' or 'num_input_token'")
