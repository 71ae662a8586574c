"""What each serving upper bound gives, on instances where the cell or the price bound matters.

    .venv/bin/python benchmarks/bench_serving_bounds.py [--out DIR]

For each instance: the least of the first two bounds (concurrency levels, and concurrency and
micro-batch levels: llm_planner.serving.bound), the cell bound over whole replicas
(llm_planner.serving.bound_cells), the price bound at the device prices of the plan's search
(llm_planner.serving.bound_prices, searched to its end rather than stopped near the plan), the
time each takes, and the plan's tokens/s (the serving search, as `plan` runs it).
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
from llm_planner.serving.bound_prices import price_bound  # noqa: E402
from llm_planner.serving.context import ServingOptions, build_context  # noqa: E402
from llm_planner.serving.search import solve_serving  # noqa: E402
from llm_planner.serving.workload import RequestShape, ServingWorkload  # noqa: E402

CASES = [  # (row of bench_serving, spec, model, prompt, output, TPOT target in s)
    ("gpt3-175b/gpt3-six-servers/50ms", "gpt3-six-servers", "gpt3-175b", 512, 128, 0.05),
    ("llama2-70b/a100-l4-t4-cloud/200ms", "a100-l4-t4-cloud", "llama2-70b", 512, 256, 0.2),
    ("llama3-70b/dgx-a100-l4/100ms", "dgx-a100-l4", "llama3-70b", 512, 256, 0.1),
    ("llama3-70b/h100-a10g/50ms", "h100-a10g", "llama3-70b", 512, 256, 0.05),
]
COLUMNS = (
    "row",
    "plan_tokens_per_s",
    "first_two_tokens_per_s",
    "first_two_s",
    "cell_tokens_per_s",
    "cell_s",
    "price_tokens_per_s",
    "price_s",
)


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
    fleet, _ = solve_serving(ctx)
    started = time.monotonic()
    prices = price_bound(ctx.cache, ctx.classes, tpot, ctx.cluster.inter_node, fleet.prices)
    prices_s = time.monotonic() - started
    values = (fleet.tokens_per_s, first, first_s, cells, cells_s, prices, prices_s)
    return dict(zip(COLUMNS, (row, *(round(v, 1) for v in values))))


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
    provenance.write_results(out, COLUMNS, rows, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
