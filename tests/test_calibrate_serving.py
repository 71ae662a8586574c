"""`calibrate --serving`: the readers of vLLM, SGLang and our own serving run reports, the fit
recovering the factors that made synthetic measurements (scored by `llm-planner score` on a spec
with known factors), what the data cannot tell, and every bad input an exit 2 naming file and key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from serving_fixtures import SMALL_FLEET

from llm_planner.cli import main as cli_main
from llm_planner.cli.main import main
from llm_planner.core.precision import build_precision
from llm_planner.core.spec import load_cluster
from llm_planner.measure.serving_cases import (
    ServingSettings,
    build_cases,
    even_split,
    mixed_iterations,
    model_config,
    predict,
)
from llm_planner.measure.serving_fit import DEFAULT_WEIGHTS, fit_serving
from llm_planner.measure.serving_results import ServingResultError, read_serving_results

TRUTH = {
    "compute_efficiency": 0.45,
    "mem_efficiency": 0.62,
    "step_overhead_s": 3.1e-4,
    "collective_overhead_s": 9e-6,
    "sequence_overhead_s": 2e-5,
}
PROMPT, OUTPUT = 512, 128
TP2, TP1, PP2 = "1 x bigbox/big[tp2]", "1 x bigbox/big", "2 x bigbox/big"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(cli_main, "console", cli_main.LiteralConsole(width=400))


REPO = Path(__file__).resolve().parents[1]


def _spec(tmp_path, name: str, **big) -> str:
    """The small fleet (serving_fixtures) with the "big" kind's fields set."""
    data = yaml.safe_load(SMALL_FLEET)
    next(k for k in data["device_kinds"] if k["name"] == "big").update(big)
    path = tmp_path / name
    path.write_text("# the spec to correct: this comment must survive\n" + yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _vllm(c: int, tpot_s: float, tokens_per_s: float, ttft_s: float, **extra) -> dict:
    """What `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py), numbers given."""
    n = 4 * c
    return {
        "date": "20261128-120000",
        "endpoint_type": "openai",
        "backend": "openai",
        "label": None,
        "model_id": "meta-llama/Llama-2-7b-hf",
        "tokenizer_id": "meta-llama/Llama-2-7b-hf",
        "num_prompts": n,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": c,
        "duration": n * OUTPUT / tokens_per_s,
        "completed": n,
        "failed": 0,
        "total_input_tokens": n * PROMPT,
        "total_output_tokens": n * OUTPUT,
        "request_throughput": tokens_per_s / OUTPUT,
        "request_goodput": None,
        "output_throughput": tokens_per_s,
        "total_token_throughput": tokens_per_s * (1 + PROMPT / OUTPUT),
        "max_output_tokens_per_s": tokens_per_s * 1.1,
        "max_concurrent_requests": c,
        "mean_ttft_ms": ttft_s * 1.2e3,
        "median_ttft_ms": ttft_s * 1e3,
        "std_ttft_ms": 1.0,
        "p99_ttft_ms": ttft_s * 2e3,
        "mean_tpot_ms": tpot_s * 1.05e3,
        "median_tpot_ms": tpot_s * 1e3,
        "std_tpot_ms": 0.1,
        "p99_tpot_ms": tpot_s * 1.5e3,
        "mean_itl_ms": tpot_s * 1e3,
        "median_itl_ms": tpot_s * 1e3,
        **extra,
    }


def _scored(capsys, spec: str, replica: str, c: int, m: int = 1, layers: str | None = None) -> dict:
    """`llm-planner score --json` of the replica on `spec`: the synthetic measurement."""
    argv = ["score", "--cluster", spec, "--model", "llama2-7b", "--replica", replica, "--concurrency", str(c)]
    argv += ["--micro-batches", str(m), "--prompt-len", str(PROMPT), "--output-len", str(OUTPUT), "--json"]
    argv += ["--layers", layers] if layers else []
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# (replica, concurrency, micro-batches, layers): the engines' one batch per stage, their even split; memory aside
POINTS = [(TP2, 4, 1, "32"), (TP2, 32, 1, "32"), (TP2, 40, 1, "32"), (TP1, 2, 1, "32"), (PP2, 16, 2, "16,16")]


def _measurements(tmp_path, capsys) -> tuple[list[str], list[str]]:
    """One vLLM result per point, measured on the true spec; and the replica of each."""
    true = _spec(tmp_path, "true.yaml", **TRUTH)
    files = []
    for n, (replica, c, m, layers) in enumerate(POINTS):
        s = _scored(capsys, true, replica, c, m, layers)
        path = tmp_path / f"vllm-{n}.json"
        path.write_text(json.dumps(_vllm(c, s["tpot_s"], s["tokens_per_s"], s["ttft_s"])))
        files.append(str(path))
    return files, [p[0] for p in POINTS]


@pytest.mark.heavy
def test_the_fit_recovers_the_factors_that_made_the_measurements_and_writes_them(tmp_path, capsys):
    files, replicas = _measurements(tmp_path, capsys)
    spec = _spec(tmp_path, "spec.yaml")  # the fixture's factors: ce 0.6, me 0.8, step 0.5 ms, collective default
    out = tmp_path / "calibrated.yaml"
    argv = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", *files, "-o", str(out)]
    for r in replicas:
        argv += ["--replica", r]
    assert main(argv) == 0, capsys.readouterr().err
    printed = " ".join(capsys.readouterr().out.split())
    assert "vllm-4.json" in printed and "TPOT" in printed and "corrected spec written" in printed
    big = load_cluster(out).kind("big")
    for field, value in TRUTH.items():
        assert getattr(big, field) == pytest.approx(value, rel=1e-3), field  # the spec rounds to 4 digits
    text = out.read_text()
    assert text.startswith("# Calibrated by `llm-planner calibrate` from ") and "this comment must survive" in text
    assert load_cluster(out).kind("small") == load_cluster(spec).kind("small")
    # the fit itself, before the spec's rounding
    cluster = load_cluster(spec)
    observations = [(f, read_serving_results(f)) for f in files]
    settings = ServingSettings(model="llama2-7b", replicas=tuple(replicas))
    config = model_config(settings, [o for _, obs in observations for o in obs])
    result = fit_serving(cluster, config, build_cases(cluster, config, observations, settings))
    fit = next(f for f in result.calibration.kinds if f.name == "big")
    assert set(fit.fitted) == set(TRUTH) and fit.kept == {}
    for field, value in TRUTH.items():
        assert fit.values[field] == pytest.approx(value, rel=1e-6), field
    assert fit.rel_rms_after < 1e-6 < 0.05 < fit.rel_rms_before
    for row in result.figures:  # the medians written above, read back
        assert row.after == pytest.approx(row.measured, rel=1e-6)
    small = next(f for f in result.calibration.kinds if f.name == "small")
    assert small.fitted == () and set(small.kept.values()) == {"no observation ran on this kind"}
    # the same factors from a spec far from them: peak rates and no overheads
    far = load_cluster(_spec(tmp_path, "far.yaml", **dict.fromkeys(TRUTH, 0) | dict.fromkeys(list(TRUTH)[:2], 1.0)))
    result = fit_serving(far, config, build_cases(far, config, observations, settings))
    fit = next(f for f in result.calibration.kinds if f.name == "big")
    assert fit.before["mem_efficiency"] == 1.0 and fit.before["step_overhead_s"] == 0
    for field, value in TRUTH.items():
        assert fit.values[field] == pytest.approx(value, rel=1e-6), field


@pytest.mark.heavy
def test_what_the_measurements_cannot_tell_keeps_the_specs_value_with_its_reason(tmp_path, capsys):
    files, replicas = _measurements(tmp_path, capsys)
    spec = load_cluster(_spec(tmp_path, "spec.yaml"))
    config = model_config(ServingSettings(model="llama2-7b"), [])
    # single devices only: no all-reduce, so the collective overhead is unknown
    single = [(f, read_serving_results(f)) for f, r in zip(files, replicas) if r != TP2]
    cases = build_cases(spec, config, single, ServingSettings(model="llama2-7b", replicas=(TP1, PP2)))
    fit = next(f for f in fit_serving(spec, config, cases).calibration.kinds if f.name == "big")
    assert fit.kept["collective_overhead_s"] == "no observation runs a tensor-parallel group of this kind"
    assert fit.values["collective_overhead_s"] == spec.kind("big").collective_call_s
    # one result: TPOT and TTFT are 2 figures, so one factor at most (the one that fits them best; here the
    # time per sequence, on which the TTFT's wait for the next visit, half a cycle, also depends)
    cases = build_cases(spec, config, single[:1], ServingSettings(model="llama2-7b", replicas=(TP1,)))
    fit = next(f for f in fit_serving(spec, config, cases).calibration.kinds if f.name == "big")
    assert fit.fitted == ("sequence_overhead_s",)
    assert fit.kept["mem_efficiency"] == "2 figure(s) cannot fit more than 1 factor(s)"
    assert fit.kept["step_overhead_s"] == "2 figure(s) cannot fit more than 1 factor(s)"
    # without TTFT (--ttft-weight 0), TPOT alone: nothing to fit, the spec's values kept
    fit = next(f for f in fit_serving(spec, config, cases, {"ttft_s": 0}).calibration.kinds if f.name == "big")
    assert fit.fitted == () and fit.values == fit.before
    assert fit.kept["step_overhead_s"] == "1 figure(s) cannot fit more than 0 factor(s)"


def test_vllm_results_are_read_with_their_lens_and_appended_results_line_by_line(tmp_path):
    one = tmp_path / "vllm.json"
    lens = {"input_lens": [100, 300, 500, 700], "output_lens": [50, 0, 150, 250]}  # a failed request: no output
    one.write_text(json.dumps(_vllm(8, 0.02, 300.0, 0.1, **lens)))
    (obs,) = read_serving_results(one)
    assert (obs.engine, obs.source, obs.concurrency, obs.model) == ("vllm", str(one), 8, "meta-llama/Llama-2-7b-hf")
    assert obs.measured.tpot_s == pytest.approx(0.02) and obs.measured.ttft_s == pytest.approx(0.1)
    assert obs.measured.tokens_per_s == 300.0 and obs.measured.decode_step_s is None
    assert [(r.prompt_len, r.output_len, r.weight) for r in obs.requests] == [
        (100, 50, 1),
        (500, 150, 1),
        (700, 250, 1),
    ]
    few = tmp_path / "few.json"  # fewer requests than --max-concurrency: never more in flight than requests
    few.write_text(json.dumps(_vllm(8, 0.02, 300.0, 0.1) | {"completed": 5}))
    (obs,) = read_serving_results(few)
    assert obs.concurrency == 5 and "5 requests completed" in obs.concurrency_note
    appended = tmp_path / "appended.json"  # `--append-result`: one object per line
    appended.write_text(json.dumps(_vllm(4, 0.01, 100.0, 0.05)) + "\n" + json.dumps(_vllm(16, 0.03, 500.0, 0.2)) + "\n")
    first, second = read_serving_results(appended)
    assert (first.concurrency, second.concurrency) == (4, 16)
    assert second.source == f"{appended} line 2" and second.requests[0].prompt_len == PROMPT


def test_sglang_jsonl_is_read_one_observation_per_line(tmp_path):
    rows = []
    for c, tpot in ((8, 0.015), (None, 0.03)):
        row = {
            "backend": "sglang",
            "dataset_name": "random",
            "request_rate": float("inf"),
            "max_concurrency": c,
            "sharegpt_output_len": None,
            "random_input_len": 1024,
            "random_output_len": 256,
            "random_range_ratio": 0.0,
            "duration": 60.0,
            "completed": 200,
            "total_input_tokens": 200 * 700,
            "total_output_tokens": 200 * 180,
            "total_output_tokens_retokenized": 200 * 179,
            "request_throughput": 3.3,
            "input_throughput": 2333.0,
            "output_throughput": 600.0,
            "mean_e2e_latency_ms": 3000.0,
            "median_ttft_ms": 40.0,
            "mean_ttft_ms": 45.0,
            "mean_tpot_ms": tpot * 1e3,
            "concurrency": 7.6,
            "accept_length": None,
        }
        rows.append(json.dumps(row))  # Infinity, as Python's json writes it
    path = tmp_path / "sglang.jsonl"
    path.write_text("\n".join(rows) + "\n")
    first, second = read_serving_results(path)
    assert first.engine == "sglang" and first.concurrency == 8 and first.source == f"{path} line 1"
    assert first.measured.tpot_s == pytest.approx(0.015)  # no median_tpot_ms: the mean
    assert first.measured.ttft_s == pytest.approx(0.04)  # the median where given
    assert [(r.prompt_len, r.output_len) for r in first.requests] == [(700, 180)]  # totals / completed
    assert second.concurrency is None and "max_concurrency is null" in second.concurrency_note


def _report(layout: str = TP2) -> dict:
    """A serving run report as `llm-planner launch SERVING_PLAN --report run.json` writes it."""
    measured = {"tokens_per_s": 2400.0, "tpot_s": 0.0135, "tpot_p50_s": 0.013, "tpot_p90_s": 0.015}
    measured |= {"tpot_p99_s": 0.02, "ttft_s": 0.04, "ttft_p50_s": 0.035, "ttft_p99_s": 0.09, "decode_step_s": 0.012}
    predicted = {"tokens_per_s": 2600.0, "tpot_s": 0.0125, "ttft_s": 0.03, "decode_step_s": 0.011}
    replica = {"replica": 0, "layout": layout, "concurrency": 32, "micro_batches": 1, "max_batched_tokens": 4096}
    replica |= {"requests_completed": 320, "output_tokens": 40960, "duration_s": 17.1}
    return {
        "format": "llm_planner.serving_run",
        "version": 1,
        "plan": "plan.yaml",
        "model": "llama2-7b",
        "workload": {"prompt_len": PROMPT, "output_len": OUTPUT, "seed": 0, "request_rate": None},
        "replicas": [replica | {"measured": measured, "predicted": predicted}],
        "total": {"tokens_per_s": 2400.0, "predicted_tokens_per_s": 2600.0},
    }


def test_our_serving_run_report_is_read_with_its_layout_and_operating_point(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_report(), indent=2))
    (obs,) = read_serving_results(path)
    assert (obs.engine, obs.layout, obs.concurrency, obs.micro_batches) == ("llm_planner", TP2, 32, 1)
    assert (obs.max_batched_tokens, obs.model, obs.source) == (4096, "llama2-7b", f"{path} replicas[0]")
    m = obs.measured
    assert (m.tpot_s, m.tokens_per_s, m.ttft_s, m.decode_step_s) == (0.013, 2400.0, 0.035, 0.012)  # medians
    report = _report()
    report["replicas"][0]["measured"] |= {"ttft_steady_s": 0.025, "steady_requests": 250}
    path.write_text(json.dumps(report))
    assert read_serving_results(path)[0].measured.ttft_s == 0.025  # past the opening burst, where given
    spec = load_cluster(_spec(tmp_path, "spec.yaml"))
    settings = ServingSettings()  # the model and everything else from the report
    (case,) = build_cases(spec, model_config(settings, [obs]), [(str(path), [obs])], settings)
    assert case.options.max_batched_tokens == 4096 and case.layers == (32,) and case.grouped_kinds == ("big",)


def test_a_replica_the_run_routed_fewer_requests_is_read_at_the_concurrency_it_reached(tmp_path):
    """launch --max-requests below a replica's concurrency: the report's predicted.concurrency is what it had
    in flight, and a replica routed none is left out (and a report of nothing but those is refused)."""
    path = tmp_path / "run.json"
    report = _report()
    report["replicas"][0]["predicted"] |= {"concurrency": 5}
    report["replicas"][0]["micro_batches"] = 8
    idle = {**report["replicas"][0], "replica": 1, "predicted": {"concurrency": 0, "tokens_per_s": 0.0}}
    report["replicas"].append(idle | {"measured": {"tokens_per_s": None}})
    path.write_text(json.dumps(report))
    (obs,) = read_serving_results(path)
    assert (obs.concurrency, obs.micro_batches) == (5, 5) and "routed it 5 requests" in obs.concurrency_note
    report["replicas"] = [report["replicas"][1]]
    path.write_text(json.dumps(report))
    with pytest.raises(ServingResultError, match="routed no replica a request"):
        read_serving_results(path)


def test_even_split_is_the_engines():
    assert even_split(32, 2) == (16, 16)
    assert even_split(7, 3) == (2, 3, 2)
    assert even_split(43, 10) == (4, 4, 4, 4, 4, 4, 5, 5, 5, 4)


def _refused(capsys, argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "Traceback" not in captured.out + captured.err
    assert all(w in err for w in words), err
    return err


def _vllm_8b(c: int, tokens_per_s: float, ttft_ms: float, tpot_ms: float) -> dict:
    """A `vllm bench serve` result of Llama-3 8B: 320 prompts of 1,024 tokens and 256 out at C in flight."""
    return {
        "backend": "vllm",
        "model_id": "meta-llama/Meta-Llama-3-8B-Instruct",
        "num_prompts": 320,
        "request_rate": "inf",
        "max_concurrency": c,
        "duration": 60.0,
        "completed": 320,
        "total_input_tokens": 327680,
        "total_output_tokens": 81920,
        "output_throughput": tokens_per_s,
        "mean_ttft_ms": ttft_ms,
        "mean_tpot_ms": tpot_ms,
        "mean_itl_ms": tpot_ms,
    }


@pytest.mark.heavy
def test_a_factor_fitted_to_its_bound_is_written_as_the_bound(tmp_path, capsys):
    """Two runs the fit meets with no time a sequence: the damped steps leave it a hair above 0 (3e-16
    s before the bound was snapped to), which is written and printed as 0."""
    files = []
    for c, tokens_per_s, ttft_ms, tpot_ms in ((8, 894.1, 44.0, 8.67), (32, 2714.3, 104.5, 11.424)):
        files.append(tmp_path / f"c{c}.json")
        files[-1].write_text(json.dumps(_vllm_8b(c, tokens_per_s, ttft_ms, tpot_ms)))
    spec = tmp_path / "spec.yaml"
    spec.write_text((REPO / "cluster_specs" / "h100-4x8.yaml").read_text())
    out = tmp_path / "out.yaml"
    argv = ["calibrate", "--serving", "--cluster", str(spec), "--model", "llama3-8b", "--dtype", "bf16"]
    assert main([*argv, "--replica", "1xhgx/h100", *map(str, files), "-o", str(out)]) == 0
    assert load_cluster(out).kind("h100").sequence_overhead_s == 0.0
    assert "sequence_overhead_s 5e-05 -> 0 " in out.read_text()


def test_a_replica_that_cannot_hold_the_model_is_refused(tmp_path, capsys):
    """Llama-2 7B in fp16 (13.5 GB of weights) on one 8 GB device: no engine ran it there, so the fit
    is refused naming the file and the replica, not driven to whatever factors match the numbers."""
    result = tmp_path / "vllm.json"
    result.write_text(json.dumps(_vllm(8, 0.02, 400.0, 0.05)))
    argv = ["calibrate", "--serving", "--cluster", _spec(tmp_path, "spec.yaml"), "--model", "llama2-7b"]
    argv += [str(result), "--replica", "1 x smallbox/small", "-o", str(tmp_path / "out.yaml")]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{result}: the replica '1 x smallbox/small' cannot hold the model even with one sequence" in err
    assert "check --replica, --weights and --dtype" in err
    assert not (tmp_path / "out.yaml").exists()


def test_a_report_served_in_another_dtype_than_the_fit_asks_is_refused(tmp_path, capsys):
    """launch --dtype records the element type served; fitting those times as another would skew
    every factor, so calibrate --serving names the report and the --dtype to give."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_report() | {"dtype": "bf16"}))
    (obs,) = read_serving_results(path)
    assert obs.dtype == "bf16"
    argv = ["calibrate", "--serving", "--cluster", _spec(tmp_path, "spec.yaml"), str(path), "-o", str(tmp_path / "o")]
    assert main([*argv, "--dtype", "fp16"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{path} replicas[0]: the run served in bf16, and --dtype asks the fit for fp16: give --dtype bf16" in said


def test_the_spec_it_corrects_is_not_written_over(tmp_path, capsys):
    """-o naming the --cluster spec (or another spelling of it) is refused before anything is fitted."""
    files, replicas = _measurements(tmp_path, capsys)
    spec = _spec(tmp_path, "spec.yaml")
    before = Path(spec).read_text()
    argv = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", *files]
    for r in replicas:
        argv += ["--replica", r]
    for out in (spec, str(tmp_path / "." / "spec.yaml")):
        assert main([*argv, "-o", out]) == 2
        assert "is the input --cluster" in capsys.readouterr().err
    assert Path(spec).read_text() == before


def test_bad_inputs_exit_2_naming_the_file_and_the_key(tmp_path, capsys):
    spec = _spec(tmp_path, "spec.yaml")
    base = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", "-o", str(tmp_path / "o.yaml")]
    text = tmp_path / "notjson.json"
    text.write_text("Successful requests: 100\n")
    _refused(capsys, [*base, "--replica", TP2, str(text)], "notjson.json", "not valid JSON")
    lines = tmp_path / "runs.jsonl"
    lines.write_text(
        json.dumps(_vllm(8, 0.02, 300.0, 0.1)) + "\n" + json.dumps(_vllm(16, 0.02, 300.0, 0.1))[:40] + "\n"
    )
    _refused(capsys, [*base, "--replica", TP2, str(lines)], "runs.jsonl: line 2: not valid JSON")
    missing = tmp_path / "missing.json"
    row = _vllm(8, 0.02, 300.0, 0.1)
    del row["median_tpot_ms"], row["mean_tpot_ms"]
    missing.write_text(json.dumps(row))
    _refused(capsys, [*base, "--replica", TP2, str(missing)], "missing.json", "missing key 'median_tpot_ms'")
    unbounded = tmp_path / "unbounded.json"
    unbounded.write_text(json.dumps(_vllm(8, 0.02, 300.0, 0.1) | {"max_concurrency": None}))
    _refused(capsys, [*base, "--replica", TP2, str(unbounded)], "unbounded.json", "max_concurrency", "--concurrency")
    unbounded.write_text(json.dumps(_vllm(8, 0.02, 300.0, 0.1) | {"max_concurrency": None, "request_rate": "fast"}))
    _refused(capsys, [*base, "--replica", TP2, str(unbounded)], "unbounded.json: request_rate", "got 'fast'")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_vllm(8, 0.02, 300.0, 0.1)))
    _refused(
        capsys, [*base, "--replica", "1 x bigbox/huge[tp2]", str(good)], "--replica", "unknown class 'bigbox/huge'"
    )
    _refused(capsys, [*base, str(good)], "good.json", "give --replica")
    report = tmp_path / "run.json"
    report.write_text(json.dumps(_report(layout="bigbox/big: 1 stage x tp3")))
    _refused(capsys, [*base, str(report)], "run.json replicas[0]: layout", "tp3")
    data = _report()
    del data["replicas"][0]["measured"]["tokens_per_s"]
    report.write_text(json.dumps(data))
    _refused(capsys, [*base, str(report)], "run.json replicas[0].measured", "missing key 'tokens_per_s'")
    _refused(capsys, [*base, "--replica", TP2, "--replica", TP1, "--replica", TP1, str(good), str(good)], "--replica")
    plain = ["calibrate", "--cluster", spec, "-o", str(tmp_path / "o.yaml")]
    _refused(capsys, [*plain, str(good)], "good.json", "need --serving")
    _refused(capsys, [*base, "--plan", "p.yaml", str(good)], "--plan and --report are for placement runs")


def test_an_open_loop_run_is_read_at_its_mean_in_flight_by_littles_law(tmp_path):
    """Requests at a finite rate without --max-concurrency: the mean in flight is requests/s times
    the mean end-to-end latency (Little's law), from the file's mean e2e where it has one, else
    from its mean TTFT and TPOT; SGLang's own `concurrency` (that same mean) where written; every
    request at once (rate inf) still leaves it to the command line."""
    base = _vllm(8, 0.02, 300.0, 0.1) | {"max_concurrency": None, "request_rate": 4.0, "request_throughput": 2.5}
    rows = [
        base | {"mean_e2el_ms": 3000.0},  # 2.5/s x 3 s = 7.5 in flight: 8
        base,  # 2.5/s x (0.12 s + 127 x 21 ms) = 6.97: 7
        base | {"concurrency": 11.4, "random_input_len": 1024},  # SGLang's: 11
        base | {"request_rate": "inf"},
    ]
    path = tmp_path / "open.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    by_e2e, by_means, sglang, at_once = read_serving_results(path)
    assert by_e2e.concurrency == 8 and "request rate 4/s" in by_e2e.concurrency_note
    assert "7.5 in flight" in by_e2e.concurrency_note
    assert by_means.concurrency == round(2.5 * (0.12 + (OUTPUT - 1) * 0.021)) == 7
    assert sglang.engine == "sglang" and sglang.concurrency == 11 and "own mean" in sglang.concurrency_note
    assert at_once.concurrency is None and "max_concurrency is null" in at_once.concurrency_note
    assert [o.concurrency_inferred for o in (by_e2e, by_means, sglang, at_once)] == [True, True, True, False]


@pytest.mark.heavy
def test_the_command_says_where_an_open_loops_concurrency_came_from(tmp_path, capsys):
    """A run read at its mean in flight is fitted there, and the command says so beside the fit; one
    at a fixed concurrency gets no note."""
    spec = _spec(tmp_path, "spec.yaml")
    open_loop = tmp_path / "open.json"
    open_loop.write_text(
        json.dumps(
            _vllm(8, 0.02, 300.0, 0.1)
            | {"max_concurrency": None, "request_rate": 4.0, "request_throughput": 2.5, "mean_e2el_ms": 3000.0}
        )
    )
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(_vllm(16, 0.025, 500.0, 0.12)))
    argv = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", str(open_loop), str(fixed)]
    assert main([*argv, "--replica", TP2, "-o", str(tmp_path / "out.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"note: {open_loop}: fitted at 8 in flight: request rate 4/s without a concurrency cap" in out
    assert f"note: {fixed}" not in out


def test_a_quantized_run_is_scored_in_its_formats(tmp_path, capsys):
    """`--weights` / `--kv-cache-dtype` reach the cases: an fp8 KV cache (half the bytes a decode
    step reads of it) predicts a shorter TPOT than the 16-bit one, and the flags need --serving."""
    spec = _spec(tmp_path, "spec.yaml")
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(_vllm(16, 0.05, 250.0, 0.2)))
    cluster = load_cluster(spec)
    observations = [(str(path), read_serving_results(path))]
    tpot = {}
    for kv in ("auto", "fp8"):
        settings = ServingSettings(model="llama2-7b", replicas=(TP2,), dtype=build_precision("fp16", None, kv))
        config = model_config(settings, observations[0][1])
        (case,) = build_cases(cluster, config, observations, settings)
        tpot[kv] = predict(cluster, config, case)["tpot_s"]
    assert tpot["fp8"] < tpot["auto"]
    plain = ["calibrate", "--cluster", spec, "-o", str(tmp_path / "o.yaml"), "--kv-cache-dtype", "fp8"]
    _refused(capsys, plain, "--kv-cache-dtype", "need --serving")


def _closed_loop_measurements(tmp_path, capsys, points) -> list[str]:
    """One vLLM result per point: `score --closed-loop` on the true spec, its closed loop's figures."""
    true = _spec(tmp_path, "true.yaml", **TRUTH)
    files = []
    for n, (replica, c) in enumerate(points):
        argv = ["score", "--cluster", true, "--model", "llama2-7b", "--replica", replica, "--concurrency", str(c)]
        argv += ["--prompt-len", str(PROMPT), "--output-len", str(OUTPUT), "--layers", "32", "--closed-loop", "--json"]
        assert main(argv) == 0, capsys.readouterr().err
        loop = json.loads(capsys.readouterr().out)["closed_loop"]
        path = tmp_path / f"loop-{n}.json"
        path.write_text(json.dumps(_vllm(c, loop["tpot_s"], loop["tokens_per_s"], loop["ttft_s"])))
        files.append(str(path))
    return files


@pytest.mark.heavy
def test_closed_loop_results_are_fitted_as_the_closed_loop_they_ran(tmp_path, capsys):
    """Results of a closed loop (`vllm bench serve --max-concurrency`), fitted with --closed-loop:
    each predicted as `score --closed-loop` simulates it, so the factors that made them come back;
    fitted as the steady state they do not."""
    points = [(TP2, 4), (TP2, 32), (TP2, 40), (TP1, 2)]
    files = _closed_loop_measurements(tmp_path, capsys, points)
    spec = load_cluster(_spec(tmp_path, "spec.yaml"))
    observations = [(f, read_serving_results(f)) for f in files]
    replicas = tuple(r for r, _ in points)
    for closed, close in ((True, True), (False, False)):
        settings = ServingSettings(model="llama2-7b", replicas=replicas, closed_loop=closed)
        config = model_config(settings, [o for _, obs in observations for o in obs])
        fit = next(
            f
            for f in fit_serving(spec, config, build_cases(spec, config, observations, settings)).calibration.kinds
            if f.name == "big"
        )
        recovered = all(fit.values[k] == pytest.approx(v, rel=1e-3) for k, v in TRUTH.items())
        assert recovered is close, (closed, fit.values)


def test_closed_loop_calibration_refuses_micro_batches(tmp_path, capsys):
    files = _closed_loop_measurements(tmp_path, capsys, [(TP1, 4)])
    spec = _spec(tmp_path, "spec.yaml")
    argv = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", *files, "-o", str(tmp_path / "o.yaml")]
    err = _refused(capsys, [*argv, "--replica", PP2, "--closed-loop"], "loop-0.json", "--closed-loop simulates one")
    assert "micro-batch" in err
    _refused(
        capsys,
        ["calibrate", "--cluster", spec, "--plan", "p", "--report", "r", "-o", "x", "--closed-loop"],
        "--closed-loop",
        "need --serving",
    )


def test_closed_loop_calibration_sends_requests_through_the_front_end_given(tmp_path, capsys):
    """`--front-end-s S` reaches each closed-loop case as `score --front-end-s` takes it: at one
    sequence in flight a request's TTFT is longer by S; refused without --closed-loop or --serving."""
    files = _closed_loop_measurements(tmp_path, capsys, [(TP1, 1)])
    cluster = load_cluster(_spec(tmp_path, "spec.yaml"))
    observations = [(f, read_serving_results(f)) for f in files]
    ttft = {}
    for front_end_s in (0.0, 0.004):
        settings = ServingSettings(model="llama2-7b", replicas=(TP1,), closed_loop=True, front_end_s=front_end_s)
        config = model_config(settings, observations[0][1])
        (case,) = build_cases(cluster, config, observations, settings)
        assert case.front_end_s == front_end_s
        ttft[front_end_s] = predict(cluster, config, case)["ttft_s"]
    assert ttft[0.004] - ttft[0.0] == pytest.approx(0.004, rel=1e-6)
    spec = _spec(tmp_path, "flags.yaml")
    argv = ["calibrate", "--serving", "--cluster", spec, "--model", "llama2-7b", *files, "-o", str(tmp_path / "o.yaml")]
    _refused(capsys, [*argv, "--front-end-s", "0.004"], "--front-end-s", "give --closed-loop")
    _refused(capsys, [*argv, "--closed-loop", "--front-end-s", "-1"], "--front-end-s", "from 0")
    plain = ["calibrate", "--cluster", spec, "-o", str(tmp_path / "x.yaml"), "--front-end-s", "0.004"]
    _refused(capsys, plain, "--front-end-s", "need --serving")


@pytest.mark.heavy
def test_the_rms_reported_is_the_weighted_error_the_fit_lowers(tmp_path, capsys):
    """TTFTs five times the model's (a loaded run's wait for a slot): the fit, weighing TTFT at 0.25,
    may leave them as far off, and the RMS it reports before and after is the weighted one it lowers."""
    files, replicas = _measurements(tmp_path, capsys)
    for f in files:
        doc = json.loads(Path(f).read_text())
        doc.update({k: 5 * v for k, v in doc.items() if "ttft" in k})
        Path(f).write_text(json.dumps(doc))
    cluster = load_cluster(_spec(tmp_path, "spec.yaml"))
    observations = [(f, read_serving_results(f)) for f in files]
    settings = ServingSettings(model="llama2-7b", replicas=tuple(replicas))
    config = model_config(settings, [o for _, obs in observations for o in obs])
    result = fit_serving(cluster, config, build_cases(cluster, config, observations, settings))
    fit = next(f for f in result.calibration.kinds if f.name == "big")
    assert fit.rel_rms_after <= fit.rel_rms_before
    for when, reported in (("before", fit.rel_rms_before), ("after", fit.rel_rms_after)):
        rows = [(DEFAULT_WEIGHTS[r.figure], getattr(r, when) / r.measured - 1) for r in result.figures]
        weighted = math.sqrt(sum((w * e) ** 2 for w, e in rows) / sum(w * w for w, _ in rows))
        assert reported == pytest.approx(weighted, rel=1e-9)


def _old_sglang_line(rate: float) -> dict:
    """A line of an older `sglang.bench_serving --output-file`: no TPOT and no request_throughput, the
    median gap between tokens and the mean end-to-end latency instead."""
    return {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": rate,
        "max_concurrency": None,
        "total_input_tokens": 300 * 510,
        "total_output_tokens": 300 * 501,
        "total_output_tokens_retokenized": 300 * 500,
        "mean_e2e_latency_ms": 10_100.0,
        "median_e2e_latency_ms": 9_800.0,
        "median_ttft_ms": 100.0,
        "median_itl_ms": 14.0,
        "output_throughput": 500.0,
        "random_input_len": 1024,
        "duration": 300.0,
        "completed": 300,
    }


def test_an_older_sglang_line_gives_the_mean_time_per_token_from_its_end_to_end_latency(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join(json.dumps(_old_sglang_line(r)) for r in (1.0, 2.0)) + "\n")
    first, _ = read_serving_results(path)
    # (mean end-to-end - TTFT) / (mean output - 1), not the 14 ms median gap that leaves prefill stalls out
    assert first.measured.tpot_s == pytest.approx((10.1 - 0.1) / 500)
    # no request_throughput: completed / duration = 1/s, times the mean end-to-end latency
    assert first.concurrency == round(300 / 300.0 * 10.1) and "10.1 in flight" in first.concurrency_note


def test_a_line_without_a_tpot_or_an_end_to_end_latency_names_the_keys_it_lacks(tmp_path):
    line = _old_sglang_line(1.0)
    del line["mean_e2e_latency_ms"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(line))
    with pytest.raises(ServingResultError, match=r"missing key 'mean_e2el_ms' \(or 'mean_e2e_latency_ms', or both"):
        read_serving_results(path)  # the open loop's mean in flight needs it first
    path.write_text(json.dumps(line | {"max_concurrency": 8}))
    with pytest.raises(ServingResultError, match=r"missing key 'median_tpot_ms' \(or 'mean_tpot_ms'\)$"):
        read_serving_results(path)


def test_sglang_results_are_fitted_with_prompts_apart_unless_told_and_the_others_mixed(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps(_old_sglang_line(1.0)) + "\n" + json.dumps(_vllm(8, 0.02, 3000.0, 0.1)) + "\n")
    sglang, vllm = read_serving_results(path)
    assert (sglang.engine, vllm.engine) == ("sglang", "vllm")
    assert not mixed_iterations(sglang, ServingSettings())  # SGLang's default: no --enable-mixed-chunk
    assert mixed_iterations(vllm, ServingSettings())
    assert mixed_iterations(sglang, ServingSettings(chunked_prefill=True))  # calibrate --chunked-prefill
    assert not mixed_iterations(vllm, ServingSettings(chunked_prefill=False))
    spec = load_cluster(_spec(tmp_path, "spec.yaml"))
    for given, want in ((None, [False, True]), (True, [True, True]), (False, [False, False])):
        settings = ServingSettings(model="llama2-7b", replicas=(TP2,), concurrency=(8,), chunked_prefill=given)
        cases = build_cases(spec, model_config(settings, []), [(str(path), [sglang, vllm])], settings)
        assert [c.options.chunked_prefill for c in cases] == want, given  # what each case is scored with


def test_the_engine_is_the_server_the_result_names_not_the_client_that_wrote_it(tmp_path):
    lines = [_old_sglang_line(1.0) | {"backend": b} for b in ("sglang-oai", "vllm", "trt", "openai")]
    lines.append({k: v for k, v in _old_sglang_line(1.0).items() if k != "backend"})  # no backend: the client's keys
    lines.append(_vllm(8, 0.02, 3000.0, 0.1) | {"backend": "openai"})  # vLLM's client, an OpenAI endpoint
    path = tmp_path / "backends.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert [o.engine for o in read_serving_results(path)] == ["sglang", "vllm", "vllm", "sglang", "sglang", "vllm"]


def test_the_prefill_flags_are_one_choice_and_named_as_given(tmp_path, capsys):
    spec = _spec(tmp_path, "spec.yaml")
    out = str(tmp_path / "out.yaml")
    err = _refused(capsys, ["calibrate", "--cluster", spec, "-o", out, "--chunked-prefill"], "--chunked-prefill")
    assert "--no-chunked-prefill" not in err
    argv = ["calibrate", "--serving", "--cluster", spec, "-o", out, "r.json", "--chunked-prefill"]
    _refused(capsys, [*argv, "--no-chunked-prefill"], "not allowed with argument")
