#!/usr/bin/env bash
# The compare-symmetry tables of docs/benchmarks.md (issue: multi-node GPT planning).
# Usage: bash benchmarks/run_symmetry.sh [OUT_DIR]   (default benchmarks/results/symmetry)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/symmetry}
run() { name=$1; shift; mkdir -p "$out/$name"; .venv/bin/llm-planner compare-symmetry "$@" --out-dir "$out/$name" | tee "$out/$name/table.txt"; }
# A smaller GPT where the exact MILP proves optimality under every criterion.
run gpt2-four-gpus-throughput --cluster cluster_specs/four-gpus.yaml --model gpt2 --objective throughput --batch 8 --max-shards 1 --time-limit 120
# GPT-3 175B on the six-server cluster, decode step (one batch shard for the exact MILP's sake).
run gpt3-latency-b8 --cluster cluster_specs/gpt3-six-servers.yaml --model gpt3-175b --objective latency --batch 8 --max-shards 1 --time-limit 30
run gpt3-latency-b32 --cluster cluster_specs/gpt3-six-servers.yaml --model gpt3-175b --objective latency --batch 32 --max-shards 1 --time-limit 30
# Throughput, one batch shard: the exact MILP's transfer charges are one per edge, device and group of
# partners at one link cost (a few per device), so it builds on 54 devices.
run gpt3-throughput-b8 --cluster cluster_specs/gpt3-six-servers.yaml --model gpt3-175b --objective throughput --batch 8 --max-shards 1 --time-limit 60
run gpt3-throughput-b32 --cluster cluster_specs/gpt3-six-servers.yaml --model gpt3-175b --objective throughput --batch 32 --max-shards 1 --time-limit 60
