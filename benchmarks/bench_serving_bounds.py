"""What each serving upper bound gives on the instances where the cell bound matters.

    .venv/bin/python benchmarks/bench_serving_bounds.py [--out DIR]

For each instance: the least of the first two bounds (concurrency levels, and concurrency and
micro-batch levels: llm_planner.serving.bound), the cell bound over whole replicas
(llm_planner.serving.bound_cells) and the time each takes. The plan's tokens/s for the same
instance is in the serving benchmark's table (bench_serving.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

import provenance  # noqa: E402 (benchmarks/provenance.py, beside this script)

from llm_planner.serving.bound import tokens_upper_bound  # noqa: E402
from llm_planner.serving.bound_cells import cell_bound  # noqa: E402
from llm_planner.serving.context import ServingOptions, build_context  # noqa: E402
from llm_planner.serving.workload import RequestShape, ServingWorkload  # noqa: E402

CASES = [  # (row of bench_serving, spec, model, prompt, output, TPOT target in s)
    ("gpt3-175b/gpt3-six-servers/50ms", "gpt3-six-servers", "gpt3-175b", 512, 128, 0.05),
    ("llama2-70b/a100-l4-t4-cloud/200ms", "a100-l4-t4-cloud", "llama2-70b", 512, 256, 0.2),
]
COLUMNS = ("row", "first_two_tokens_per_s", "first_two_s", "cell_tokens_per_s", "cell_s")


def measure(case) -> dict:
    row, spec, model, prompt, output, tpot = case
    workload = ServingWorkload(requests=(RequestShape(prompt_len=prompt, output_len=output),), tpot_slo_s=tpot)
    ctx = build_context(str(REPO / "cluster_specs" / f"{spec}.yaml"), model, workload, "fp16", ServingOptions())
    started = time.monotonic()
    first = tokens_upper_bound(ctx.cache, ctx.classes, tpot, tokens_per_s=float("inf"))
    first_s = time.monotonic() - started
    started = time.monotonic()
    cells = cell_bound(ctx.cache, ctx.classes, tpot, ctx.cluster.inter_node)
    cells_s = time.monotonic() - started
    return dict(zip(COLUMNS, (row, round(first, 1), round(first_s, 1), round(cells, 1), round(cells_s, 1))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "serving-bounds"))
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    facts = provenance.start(sys.argv)
    rows = []
    for case in CASES:
        rows.append(measure(case))
        print("  ".join(str(rows[-1][c]) for c in COLUMNS), flush=True)
    provenance.write_csv(out, COLUMNS, rows)
    (out / "table.md").write_text(provenance.markdown_table(COLUMNS, ([r[c] for c in COLUMNS] for r in rows)))
    provenance.record(out, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
