"""The iteration times of a served run, wave by wave, from its raw record (`serving_raw.json` in
`launch --workdir`): each replica's decode-only iterations' round trips (llm_planner.runtime.serve_run),
split into waves where an iteration carries at least `--wave-tokens` tokens (a closed loop's
requests of one shape end together and the next wave's prompts come in at once).

    .venv/bin/python benchmarks/serve_iterations.py benchmarks/results/gpu_serve/raw-c65-graphs.json
"""

from __future__ import annotations

import argparse
import json
import statistics


def waves(iterations: list[list], wave_tokens: int) -> list[list[list]]:
    """The iterations cut before each one of at least `wave_tokens` tokens."""
    out: list[list[list]] = [[]]
    for it in iterations:
        if it[3] >= wave_tokens and out[-1]:
            out.append([])
        out[-1].append(it)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="a served run's serving_raw.json")
    ap.add_argument("--wave-tokens", type=int, default=512, help="an iteration of this many tokens starts a wave")
    args = ap.parse_args()
    with open(args.raw) as f:
        raw = json.load(f)
    print("| replica | wave | from s | iterations | decode-only | median decode-only ms | first ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for replica in raw["replicas"]:
        for k, wave in enumerate(waves(replica["iterations"], args.wave_tokens)):
            decodes = [(end - start) * 1e3 for start, end, decode_only, *_ in wave if decode_only]
            median = f"{statistics.median(decodes):.2f}" if decodes else "-"
            first = f"{(wave[0][1] - wave[0][0]) * 1e3:.1f}"
            print(
                f"| {replica['replica']} | {k} | {wave[0][0]:.2f} | {len(wave)} | {len(decodes)} | {median} | {first} |"
            )


if __name__ == "__main__":
    main()
