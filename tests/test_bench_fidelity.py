"""The fidelity benchmark's fixed-batch rows (vLLM's offline latency test): every such reference
carries what scoring it needs, and the model's end-to-end time is one prefill of the batch plus
output - 1 decode steps, each at least the weights' stream at the GPU's data-sheet bandwidth."""

from __future__ import annotations

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
