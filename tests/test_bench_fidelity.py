"""The fidelity benchmark's fixed-batch rows (vLLM's offline latency test): every such reference
carries what scoring it needs, and the model's end-to-end time is one prefill of the batch plus
output - 1 decode steps, each at least the weights' stream at the GPU's data-sheet bandwidth."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_fidelity  # noqa: E402

REFS = yaml.safe_load((REPO / "benchmarks" / "data" / "fidelity_references.yaml").read_text())
SERVERS = yaml.safe_load((REPO / "benchmarks" / "data" / "fidelity_servers.yaml").read_text())
FIXED = [r for r in REFS["serving"] if r.get("run") == "fixed_batch"]


def test_fixed_batch_rows_state_what_scoring_needs():
    assert FIXED, "the references hold vLLM's latency tests"
    for row in FIXED:
        assert row["e2e_s"] > 0 and row["concurrency"] > 0, row["id"]
        # the H200's calibrate its memory efficiency (the GPU catalog); the others judge the model
        assert row["use"] == ("calibration" if row["gpu"] == "h200-sxm-141g" else "held_out"), row["id"]
        assert bench_fidelity.why_not(row) is None, row["id"]


@pytest.mark.parametrize("row", [r for r in FIXED if "llama3-8b" in r["id"]], ids=lambda r: r["id"])
def test_fixed_batch_e2e_is_prefill_plus_decode_steps(row, tmp_path):
    got = bench_fidelity.score(row, SERVERS, tmp_path)
    out = row["output_len"]
    assert got["e2e_s"] == pytest.approx(got["ttft_s"] + (out - 1) * got["tpot_s"])
    # one decode step streams the 8B model's 16 GB of bf16 weights at no more than the data sheet's bandwidth
    assert got["tpot_s"] > 16.0e9 / {"h200-sxm-141g": 4.8e12, "a100-sxm-80g": 2.039e12}[row["gpu"]]
    assert 0 < got["ttft_s"] < got["tpot_s"] * 4  # 256 prompt tokens: one iteration, near a step


import fidelity_grid  # noqa: E402

GRID_HEADER = (
    "model,execution_type,gpu,n_gpus,precision,concurrency,input_tokens_mean_config,output_tokens_mean_config,"
    "num_input_token_avg,num_output_token_avg,ttft_avg_ns,ttft_p95_ns,itl_avg_ns,itl_p95_ns,request_latency_avg_ns,"
    "output_token_throughput_avg,request_throughput_avg,row_number\n"
)


def test_grid_row_takes_the_source_columns_as_a_serving_row(tmp_path):
    path = tmp_path / "grid.csv"
    path.write_text(
        GRID_HEADER
        + "meta-llama3-70b-instruct,NIM_TRT-LLM,H100_80GB_HBM3,4,fp8,50,200,1000,199.5,999.0,"
        + "250000000.0,1,20000000.0,1,1,2400.0,1,7\n"
    )
    (row,) = fidelity_grid.grid_rows(path)
    assert row["model"] == "meta-llama/Meta-Llama-3-70B-Instruct" and row["gpu"] == "h100-sxm-80g"
    assert (row["num_gpus"], row["tp"], row["pp"], row["concurrency"]) == (4, 4, 1, 50)
    # TensorRT-LLM's fp8 quantization: fp8 weights and matmuls, the KV cache in 16 bits
    assert (row["precision"], row["dtype"], row["weights"], row["kv_cache_dtype"]) == ("fp8", "fp16", "fp8", "auto")
    assert (row["prompt_len"], row["output_len"]) == (199.5, 999.0)  # the means the requests had
    assert row["tpot_s"] == pytest.approx(0.020) and row["ttft_s"] == pytest.approx(0.25)
    assert row["output_tokens_per_s"] == 2400.0 and row["use"] == "held_out"
    assert row["id"].endswith("-c50-r7") and "row 7" in row["source"]
    assert bench_fidelity.why_not(row) is None


def test_the_grid_file_holds_every_source_row_once_and_each_is_scoreable():
    path = REPO / "benchmarks" / "data" / REFS["grid_file"]
    rows = fidelity_grid.grid_rows(path)
    assert len(rows) == 787  # the source's data rows, repeats included
    assert len({r["id"] for r in rows}) == len(rows)
    assert {r["tp"] for r in rows} == {1, 2, 4, 8} and {r["gpu"] for r in rows} == {"a100-sxm-80g", "h100-sxm-80g"}
    assert all(bench_fidelity.why_not(r) is None for r in rows)
    # the catalog is fitted on the A100 runs (benchmarks/fit_catalog.py); the H100 runs judge it


def test_grid_tables_take_each_cells_median_and_mark_cells_with_no_fit():
    base = {"model": "m/M", "gpu": "g", "tp": 1, "precision": "fp16"}
    rows = [{**base, "concurrency": c} for c in (1, 1, 1, 10)]
    scored = [{"tpot": x, "tokens_per_s": 1.0, "ttft": 1.0} for x in (0.5, 0.9, 0.7)] + [None]
    head, lines = fidelity_grid.tables(rows, scored)["tpot"]
    assert head[-2:] == ["c1", "c10"] and lines == [["M", "g", "1", "fp16", "0.70", "-"]]
    (tpot, *_) = fidelity_grid.summary(scored)
    assert "n=3 median 0.70 p10-p90 0.54-0.86 within 15%: 33%" in tpot  # 0.9 is within 15%


def test_a_grid_run_reads_back_from_its_genai_perf_export_unchanged(tmp_path):
    import json

    import bench_refit

    from llm_planner.measure.serving_results import read_serving_results

    row = fidelity_grid.grid_rows(REPO / "benchmarks" / "data" / REFS["grid_file"])[100]
    path = tmp_path / "profile_export_genai_perf.json"
    path.write_text(json.dumps(bench_refit.genai_export(row)))
    (obs,) = read_serving_results(path)
    assert obs.engine == "genai-perf" and obs.concurrency == row["concurrency"] and obs.model == row["model"]
    assert obs.measured.tpot_s == row["tpot_s"] and obs.measured.ttft_s == row["ttft_s"]
    assert obs.measured.tokens_per_s == row["output_tokens_per_s"]
    assert (obs.requests[0].prompt_len, obs.requests[0].output_len) == (
        round(row["prompt_len"]),
        round(row["output_len"]),
    )


def test_gap_fits_recover_a_known_fixed_per_sequence_and_per_key_time():
    rows, got = [], []
    for c in (1, 10, 100):
        for prompt, output in ((200, 200), (2000, 200), (200, 2000)):
            context = prompt + output / 2
            model = 0.010 + 1e-4 * c
            gap = 0.002 + 20e-6 * c + 30e-9 * c * context
            rows.append({"model": "m/M", "gpu": "g", "tp": 1, "precision": "fp16", "concurrency": c})
            rows[-1] |= {"prompt_len": prompt, "output_len": output, "tpot_s": model + gap}
            got.append({"fits": True, "tpot_s": model})
    (line,) = fidelity_grid.gap_fits(rows, got)
    assert line[4:8] == ["9", "2.00", "20.0", "30.0"] and line[8].endswith("/ 0.00")


def test_static_batches_read_as_fixed_batch_rows_and_say_which_are_not_scored(tmp_path):
    import fidelity_static

    path = tmp_path / "static.csv"
    head = "model,gpu,tp_size,pp_size,precision,batch_size,input_output_lengths,ttft_ms,token_to_token_latency_ms,"
    path.write_text(
        head + "latency_ms,row_number\n"
        'LLaMA v2 70B,H100 80GB HBM3,4,1,FP8,64,"2048,128",900.0,20.0,3440.0,12\n'
        'LLaMA v2 70B,L40S,4,1,FP8,8,"128,128",90.0,30.0,3900.0,13\n'
        'Mixtral 8x7B,H100 80GB HBM3,2,1,Mixed,8,"128,128",20.0,10.0,1290.0,14\n'
    )
    row, l40s, mixtral = fidelity_static.static_rows(path)
    assert (row["run"], row["concurrency"], row["prompt_len"], row["output_len"], row["tp"]) == (
        "fixed_batch",
        64,
        2048,
        128,
        4,
    )
    assert (row["weights"], row["kv_cache_dtype"], row["enable_chunked_prefill"]) == ("fp8", "fp8", False)
    assert (row["tpot_s"], row["ttft_s"], row["e2e_s"]) == pytest.approx((0.020, 0.9, 3.44))
    assert fidelity_static.why_not(row, SERVERS) is None and bench_fidelity.why_not(row) is None
    assert "GPU link" in fidelity_static.why_not(l40s, SERVERS)
    assert "fake weights" in fidelity_static.why_not(mixtral, SERVERS) and mixtral["dtype"] == "fp16"
    rows = fidelity_static.static_rows(REPO / "benchmarks" / "data" / REFS["static_file"])
    assert len(rows) == 1080 and len({r["id"] for r in rows}) == 1080


@pytest.mark.heavy
def test_a_refit_reproduces_the_runs_it_was_fitted_on(tmp_path):
    """The NIM grid's 8B fp8 TP2 group on three runs: three TPOT figures determine two factors,
    the per-sequence time and one that sets the step's fixed part, and the fit's figures are the
    runs' (its first pass had moved a factor before giving it up, and once left the TPOT 37% short;
    the second pass fits the chosen set again)."""
    import bench_refit

    grid = fidelity_grid.grid_rows(REPO / "benchmarks" / "data" / REFS["grid_file"], closed_loop=False)
    group = [r for r in grid if r["gpu"] == "h100-sxm-80g" and r["tp"] == 2 and r["precision"] == "fp8"]
    train = [next(r for r in group if r["size"] == "200/1000" and r["concurrency"] == c) for c in (1, 25, 100)]
    got = bench_refit.refit_group(group[:0] + train, train, SERVERS, tmp_path, 0.0)
    assert len(got["fit"].fitted) == 2 and "sequence_overhead_s" in got["fit"].fitted
    spec = tmp_path / "fitted-h100-sxm-80g-2-fp8.yaml"
    for row in train:
        assert bench_fidelity.score(row, SERVERS, tmp_path, spec)["tpot_s"] == pytest.approx(row["tpot_s"], rel=0.05)


def test_the_nim_grid_is_scored_with_tensorrt_llms_set_and_nothing_else_is():
    """The grid's rows (TensorRT-LLM under NIM, what the set is fitted on) take `engine: tensorrt-llm`
    where the set stands for their GPU; the static batches, NIM 1.8's rows (backend unstated) and the
    vLLM and SGLang rows keep the catalog's factors."""
    import fidelity_static

    grid = fidelity_grid.grid_rows(REPO / "benchmarks" / "data" / REFS["grid_file"])
    static = fidelity_static.static_rows(REPO / "benchmarks" / "data" / REFS["static_file"])
    assert {bench_fidelity.engine_set(r) for r in grid} == {"tensorrt-llm"}
    assert {bench_fidelity.engine_set(r) for r in static + REFS["serving"]} == {None}
    h200 = {**grid[0], "gpu": "h200-sxm-141g"}  # a GPU the set does not stand for
    assert bench_fidelity.engine_set(h200) is None
    spec = yaml.safe_load(bench_fidelity.cluster_yaml(grid[0]["gpu"], grid[0]["num_gpus"], SERVERS, row=grid[0]))
    assert spec["device_kinds"][0]["engine"] == "tensorrt-llm"
    plain = yaml.safe_load(bench_fidelity.cluster_yaml(grid[0]["gpu"], grid[0]["num_gpus"], SERVERS))
    assert "engine" not in plain["device_kinds"][0]


@pytest.mark.parametrize(
    ("gpu", "folder"), [("a100-sxm-80g", "fit_grid_admission"), ("h100-sxm-80g", "fit_grid_admission_h100")]
)
def test_the_grid_is_scored_at_the_budget_and_front_end_its_fit_kept(gpu, folder):
    """fidelity_grid's budget and front-end time on each GPU are the pair benchmarks/fit_grid_admission.py
    kept on that GPU's calibration runs, as its results (docs/benchmarks.md) state."""
    with open(REPO / "benchmarks" / "results" / folder / "results.csv", newline="") as f:
        kept = [
            (int(r["budget"]), float(r["front end ms"]))
            for r in csv.DictReader(f)
            if r["kept"] and r["use"] == "calibration"
        ]
    engine = fidelity_grid.ENGINE_BUDGETS[gpu]
    assert kept == [(engine["max_num_batched_tokens"], pytest.approx(engine["front_end_s"] * 1e3))]


def test_the_grid_runs_below_the_issue_range_calibrate_and_the_h100_runs_in_it_are_held_out():
    """Every A100 run calibrates; on H100 the runs at 1-25 in flight calibrate the engine set's H100
    values and the runs at 50-250 (the bars' range) are held out."""
    rows = fidelity_grid.grid_rows(REPO / "benchmarks" / "data" / REFS["grid_file"])
    for r in rows:
        held = r["gpu"] == "h100-sxm-80g" and r["concurrency"] >= fidelity_grid.ISSUE_RANGE[0]
        assert r["use"] == ("held_out" if held else "calibration"), r["id"]
    assert sum(r["use"] == "held_out" for r in rows) > 200


def test_grid_runs_are_scored_as_the_closed_loop_they_ran_in(tmp_path):
    """genai-perf kept C requests of one shape in flight, all sent at once: the grid's runs are scored
    as that closed loop at the budget fitted on its calibration runs, prompts whole; at 250 in flight with
    200-token prompts the bursts' prompts land in the TTFT more than in the TPOT, where the steady
    state at the same budget spreads them over the TPOT of every sequence."""
    path = REPO / "benchmarks" / "data" / REFS["grid_file"]
    rows, steady = fidelity_grid.grid_rows(path), fidelity_grid.grid_rows(path, closed_loop=False)
    for r in rows:
        engine = fidelity_grid.ENGINE_BUDGETS[r["gpu"]]
        budget = (engine["max_num_batched_tokens"], False, engine["front_end_s"])
        assert (r["run"], r["max_num_batched_tokens"], r["enable_chunked_prefill"], r["front_end_s"]) == (
            "closed_loop",
            *budget,
        )
    assert all("run" not in r and "max_num_batched_tokens" not in r for r in steady)
    pick = next(i for i, r in enumerate(rows) if "h100-sxm-80g-llama3-8b-tp1-fp16-200-200-c250" in r["id"])
    same_budget = {**steady[pick], **fidelity_grid.ENGINE_BUDGETS["h100-sxm-80g"]}
    loop, plain = (bench_fidelity.score(row, SERVERS, tmp_path) for row in (rows[pick], same_budget))
    assert loop["fits"] and plain["fits"]
    assert loop["tpot_s"] < 0.9 * plain["tpot_s"] and loop["ttft_s"] > 5 * plain["ttft_s"]


def test_a_grid_run_past_memory_is_scored_with_the_engine_queueing_the_rest(tmp_path):
    """Llama-3 8B on one H100 at 250 in flight of 4,000-token requests: memory holds 116 full contexts,
    so the run is not among the scored ones (`ratios` None) but is scored as the engine runs it, 116 at
    a time and the rest queued: a TTFT of a minute, as the run measured (61 s), and it is counted in
    the summary of the runs past memory."""
    path = REPO / "benchmarks" / "data" / REFS["grid_file"]
    row = next(r for r in fidelity_grid.grid_rows(path) if "h100-sxm-80g-llama3-8b-tp1-fp16-2000-2000-c250" in r["id"])
    got = bench_fidelity.score(row, SERVERS, tmp_path)
    assert not got["fits"] and got["admitted"] == 116 and fidelity_grid.ratios(row, got) is None
    assert 40 < got["ttft_s"] < 90 and row["ttft_s"] == pytest.approx(61.1, abs=0.1)
    assert fidelity_grid.past_memory_lines([row], [got]) == []  # one run: too few for its quantiles
    (tpot, *_) = fidelity_grid.past_memory_lines([row, row], [got, got])
    assert tpot.startswith("held_out grid past memory, 16-bit, engine queueing tpot") and "n=2" in tpot


import fp8_cache_readings  # noqa: E402


def test_an_fp8_cache_read_at_16_bit_time_holds_what_8_bits_hold_and_takes_the_16_bit_time():
    """The 8B in fp8 on one H100 at 150 in flight of 2,000 + 2,000 tokens: a 16-bit cache does not
    hold it (the engine's queue scored, a TTFT of seconds), an 8-bit one does; read at the 16-bit
    time (kv_dequant_factor 2) its TPOT is longer than the 8-bit cache's read at its bytes."""
    path = REPO / "benchmarks" / "data" / REFS["grid_file"]
    row = next(r for r in fidelity_grid.grid_rows(path) if "h100-sxm-80g-llama3-8b-tp1-fp8-2000-2000-c150" in r["id"])
    got = {reading: fp8_cache_readings._scored(("grid", reading, row)) for reading in fp8_cache_readings.READINGS}
    sixteen, bytes8, time16 = (got[r] for r in fp8_cache_readings.READINGS)
    assert not sixteen["fits"] and bytes8["fits"] and time16["fits"]
    assert time16["ratios"]["tpot"] > 1.05 * bytes8["ratios"]["tpot"]
    assert time16["ratios"]["ttft"] < 0.5 * sixteen["ratios"]["ttft"]  # no queue in front of it
    line = fp8_cache_readings.line("grid", "fp8 cache at 16-bit time", [time16])
    assert line[:5] == ["grid", "fp8 cache at 16-bit time", "", "1", "1"]


def test_sglang_rows_run_prompts_apart_unless_they_state_mixed_chunks_and_vllm_rows_mix_unless_stated_off():
    sglang = [r for r in REFS["serving"] if r["engine"] == "sglang"]
    assert sglang, "the references hold SGLang's runs"
    for row in sglang:  # SGLang's default: no --enable-mixed-chunk
        assert bench_fidelity.mixed_iterations(row) is (row.get("enable_mixed_chunk") is True), row["id"]
    assert bench_fidelity.mixed_iterations({**sglang[0], "enable_mixed_chunk": True})
    assert not bench_fidelity.mixed_iterations({**sglang[0], "enable_chunked_prefill": True})  # not the flag
    assert bench_fidelity.mixed_iterations({"engine": "vllm", "enable_chunked_prefill": None})
    assert not bench_fidelity.mixed_iterations({"engine": "vllm", "enable_chunked_prefill": False})


def test_a_prefill_that_stalls_the_decodes_makes_an_sglang_rows_tokens_slower(tmp_path):
    row = next(r for r in REFS["serving"] if r["id"] == "sglang-readme-sglang030-h100-llama3.1-70b-tp4-rps8")
    apart = bench_fidelity.score(row, SERVERS, tmp_path)
    mixed = bench_fidelity.score({**row, "enable_mixed_chunk": True}, SERVERS, tmp_path)
    assert apart["tpot_s"] > mixed["tpot_s"] * 1.05  # each prompt's iteration reads the weights again


def test_the_measured_tpot_is_the_stated_one_else_the_mean_gap_from_end_to_end_else_the_itl():
    row = {"tpot_s": 0.02, "itl_s": 0.01, "mean_e2e_s": 9.0, "ttft_s": 0.1, "output_len": 101}
    assert bench_fidelity.measured_tpot(row) == 0.02
    assert bench_fidelity.measured_tpot({**row, "tpot_s": None}) == pytest.approx((9.0 - 0.1) / 100)
    assert bench_fidelity.measured_tpot({**row, "tpot_s": None, "mean_e2e_s": None}) == 0.01
    assert bench_fidelity.measured_tpot({**row, "tpot_s": None, "ttft_s": None}) == 0.01  # no TTFT to take off
    assert bench_fidelity.measured_tpot({**row, "tpot_s": None, "output_len": 1}) == 0.01  # no token after the first
    assert bench_fidelity.measured_tpot({**row, "tpot_s": None, "mean_e2e_s": 0.05}) == 0.01  # under the TTFT
