#!/usr/bin/env bash
# Predicted against measured with profiled costs (docs/benchmarks.md, "Predicted against measured").
# Usage: bash benchmarks/run_measure.sh [OUT_DIR]   (default benchmarks/results/measure)
#
# For GPT-2 (decode) and ResNet-18 on cluster_specs/localhost-2cpu.yaml (two one-core CPU ranks: one per core of
# a 2-core machine; on a machine with more cores, CLUSTER=cluster_specs/localhost-cpu.yaml runs four):
#   1. profile the tasks on the devices, and the links, under MPI (`profile --mpi`);
#   2. plan with those costs (`plan --profile`);
#   3. run the plan under MPI, warmed up, and compare (`launch --measure`).
# On identical single cores a latency plan's optimum is one device (a transfer only adds time),
# so the plans use even-split: the chain of tasks cut into contiguous stages, one per rank, so that
# every stage boundary puts a transfer on the critical path.
# The plans run one sample; the profile times sub-batches of 1 and 2, so that the affine fit the cost
# model uses, t(b) = fixed_s + per_sample_s * b, passes through the batch-1 median (a decode block's time
# is not affine in b on a CPU: with 1, 2, 4 the line missed the batch-1 median by up to 39%).
# Kept under OUT/<model>/: profile.yaml, plan.yaml, run.json (the run report), measure.json,
# and the printed tables (profile.txt, plan.txt, measure.txt); the rest of the run stays in a
# temporary directory (hostfile, rank table, the output tensor).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/measure}
export HF_HUB_OFFLINE=1
cli=.venv/bin/llm-planner
cluster=${CLUSTER:-cluster_specs/localhost-2cpu.yaml}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

measure() {  # name, launch options, then the model options shared by profile and plan
  name=$1; launch_opts=$2; shift 2
  dir=$out/$name; mkdir -p "$dir"
  echo "== $name: $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$dir/profile.txt"
  $cli profile --cluster $cluster "$@" --mpi --batch-sizes 1,2 --repetitions 10 --workdir "$scratch/$name.profile" -o "$dir/profile.yaml" | tee -a "$dir/profile.txt"
  $cli plan --cluster $cluster "$@" --profile "$dir/profile.yaml" --solver even-split -o "$dir/plan.yaml" | tee "$dir/plan.txt"
  # shellcheck disable=SC2086  # launch_opts is a list of options
  $cli launch "$dir/plan.yaml" --measure $launch_opts --report "$dir/run.json" --workdir "$scratch/$name.launch" | tee "$dir/measure.txt"
  echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$dir/measure.txt"
  cp "$scratch/$name.launch/measure.json" "$dir/measure.json"
  # no machine-specific paths in the kept files
  sed -i -e "s#$scratch/#<scratch>/#g" -e "s#$PWD/##g" "$dir/run.json" "$dir/measure.json" "$dir/measure.txt" "$dir/profile.txt"
}

# GPT-2 (124M, seeded weights), one decode step. The run generates 16 tokens after the default
# 8-token prompt, so its contexts go from 9 to 24: seq-len 16 = prompt + new tokens / 2 is the
# mean step (docs/profiling.md).
measure gpt2-decode "--max-new-tokens 16" --model gpt2 --phase decode --seq-len 16 --dtype fp32
# ResNet-18, one forward pass of one image.
measure resnet18 "" --model resnet18 --dtype fp32
