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
        assert row["e2e_s"] > 0 and row["concurrency"] > 0 and row["use"] == "held_out", row["id"]
        assert bench_fidelity.why_not(row) is None, row["id"]


@pytest.mark.parametrize("row", [r for r in FIXED if "llama3-8b" in r["id"]], ids=lambda r: r["id"])
def test_fixed_batch_e2e_is_prefill_plus_decode_steps(row, tmp_path):
    got = bench_fidelity.score(row, SERVERS, tmp_path)
    out = row["output_len"]
    assert got["e2e_s"] == pytest.approx(got["ttft_s"] + (out - 1) * got["tpot_s"])
    # one decode step streams the 8B model's 16 GB of bf16 weights at no more than 4.8 TB/s (H200)
    assert got["tpot_s"] > 16.0e9 / 4.8e12
    assert 0 < got["ttft_s"] < got["tpot_s"] * 4  # 256 prompt tokens: one iteration, near a step
