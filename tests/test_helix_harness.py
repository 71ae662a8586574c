"""benchmarks/helix_harness.py's own arithmetic, without a Helix checkout: the per-machine batch
figures of --batch-stats from the counts record_batches adds up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import helix_harness  # noqa: E402 (benchmarks/helix_harness.py: stdlib only at import)


def test_batch_stats_by_hand():
    """Over a 10 s window: machine 3 computed 4 s in 20 first-layer batches holding 150 decode
    requests, 5 of them a single request; machine 7 started none. The decode latencies' mean
    leaves the prompts out."""
    stats = {
        3: {"busy_s": 4.0, "first_batches": 20, "first_decodes": 150, "single": 5},
        7: {"busy_s": 0.5, "first_batches": 0, "first_decodes": 0, "single": 0},
    }
    out = helix_harness.batch_summary(stats, 10.0, [(False, 1.0), (True, 9.0), (False, 2.0)])
    assert out["machines"]["3"] == {
        "busy_share": 0.4,
        "first_batches_per_s": 2.0,
        "mean_decode_batch": 7.5,
        "single_per_s": 0.5,
    }
    assert out["machines"]["7"]["mean_decode_batch"] == 0.0 and out["machines"]["7"]["busy_share"] == 0.05
    assert out["decode_latency_mean_s"] == pytest.approx(1.5)
    assert helix_harness.batch_summary({}, 10.0, [])["decode_latency_mean_s"] is None
