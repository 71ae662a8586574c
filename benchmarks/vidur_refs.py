"""Per-operator reference times from Vidur's published profiles, as YAML rows for the fidelity check.

Source: the public repository microsoft/vidur (MIT licence), files
    data/profiling/compute/<gpu>/<org>/<model>/mlp.csv
    data/profiling/network/<cluster>/all_reduce.csv
Vidur measured them in fp16 with CUDA timers (milliseconds); this script writes seconds.

Command that produced benchmarks/data/vidur_operators.yaml (VIDUR_DIR: a checkout of
microsoft/vidur, here commit 7d47513363ec447a741ac5e47241580b47724fbf):

    python benchmarks/vidur_refs.py VIDUR_DIR --commit 7d47513363ec447a741ac5e47241580b47724fbf \
        -o benchmarks/data/vidur_operators.yaml

Rows kept:
  mlp.csv        num_tokens in {1, 8, 32, 64, 128, 256, 512, 1024, 2048} (those present) x every
                 num_tensor_parallel_workers present; the medians of the operators in OPERATORS,
                 keyed by Vidur's own operator names (column time_stats.<name>.median).
  all_reduce.csv for each power of two 2^11..2^26 bytes, the profiled message size nearest to it
                 in log scale (Vidur profiled sizes on a linear grid), x every (num_workers,
                 devices_per_node) present; the median time.
Where the CSV holds more than one profile row for the same key (Vidur re-profiled some points),
the value written is the mean of those rows' medians and `profile_rows` says how many there were.
Nothing is fitted or interpolated.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from llm_planner.cost.vidur import OPERATORS  # Vidur's operator names, read by the importer too

NUM_TOKENS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048)
# (Vidur path under data/profiling/compute, our catalog gpu, Hugging Face model)
MLP_FILES = (
    ("a100/meta-llama/Meta-Llama-3-8B/mlp.csv", "a100-sxm-80g", "meta-llama/Meta-Llama-3-8B"),
    ("a100/meta-llama/Meta-Llama-3-70B/mlp.csv", "a100-sxm-80g", "meta-llama/Meta-Llama-3-70B"),
    ("h100/meta-llama/Llama-2-70b-hf/mlp.csv", "h100-sxm-80g", "meta-llama/Llama-2-70b-hf"),
)
# (Vidur path under data/profiling/network, our catalog gpu)
ALL_REDUCE_FILES = (
    ("a100_dgx/all_reduce.csv", "a100-sxm-80g"),
    ("h100_dgx/all_reduce.csv", "h100-sxm-80g"),
)
MS = 1e-3


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def mlp_rows(vidur: Path, rel: str, gpu: str, model: str) -> list[dict]:
    rows = _read(vidur / "data/profiling/compute" / rel)
    groups: dict[tuple[int, int], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        key = (int(r["num_tokens"]), int(r["num_tensor_parallel_workers"]))
        if key[0] in NUM_TOKENS:
            groups[key].append(r)
    out = []
    for (tokens, tp), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        times = {op: round(_mean([float(r[f"time_stats.{op}.median"]) for r in rs]) * MS, 12) for op in OPERATORS}
        out.append(
            {
                "id": f"vidur-mlp-{gpu}-{model.split('/')[1]}-tp{tp}-n{tokens}",
                "source": f"microsoft/vidur data/profiling/compute/{rel}",
                "gpu": gpu,
                "model": model,
                "dtype": "fp16",
                "tp": tp,
                "num_tokens": tokens,
                "stat": "median",
                "profile_rows": len(rs),
                "time_s": times,
                "use": "calibration",
            }
        )
    return out


def all_reduce_rows(vidur: Path, rel: str, gpu: str) -> list[dict]:
    rows = [r for r in _read(vidur / "data/profiling/network" / rel) if r["collective"] == "all_reduce"]
    sizes = sorted({int(r["size"]) for r in rows})
    wanted = []
    for k in range(11, 27):
        nearest = min(sizes, key=lambda s: abs(math.log2(s) - k))
        if nearest not in wanted:
            wanted.append(nearest)
    groups: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for r in rows:
        size = int(r["size"])
        if size in wanted:
            groups[(int(r["num_workers"]), int(r["devices_per_node"]), size)].append(
                float(r["time_stats.all_reduce.median"])
            )
    out = []
    for (workers, per_node, size), ts in sorted(groups.items()):
        out.append(
            {
                "id": f"vidur-allreduce-{rel.split('/')[0]}-w{workers}-dpn{per_node}-b{size}",
                "source": f"microsoft/vidur data/profiling/network/{rel}",
                "gpu": gpu,
                "collective": "all_reduce",
                "dtype": "fp16",
                "num_workers": workers,
                "devices_per_node": per_node,
                "size_bytes": size,
                "stat": "median",
                "profile_rows": len(ts),
                "time_s": round(_mean(ts) * MS, 12),
                "use": "calibration",
            }
        )
    return out


HEADER = """\
# Per-operator reference times from Vidur's profiles (microsoft/vidur, MIT licence), written by
# benchmarks/vidur_refs.py -- do not edit by hand; rerun the script (its docstring has the command).
# Every row is use: calibration (the rule is in fidelity_references.yaml).
# mlp rows: one transformer layer's non-attention operators for a batch of num_tokens tokens at
#   tensor-parallel degree tp; time_s maps Vidur's operator name (column time_stats.<name>.median
#   of mlp.csv) to the median time in seconds. fp16, as Vidur profiled them.
#   attn_pre_proj = fused QKV projection, attn_post_proj = attention output projection,
#   mlp_up_proj = fused gate+up projection, mlp_down_proj = down projection, mlp_act = SiLU-and-mul,
#   add = residual add (Vidur's names).
# all_reduce rows: one fp16 all-reduce of size_bytes bytes over num_workers GPUs with
#   devices_per_node GPUs per node (num_workers > devices_per_node spans nodes); time_s is the
#   median in seconds.
# profile_rows > 1: the CSV held several profile rows for that key; time_s is the mean of their medians.
"""


def build(vidur: Path, commit: str | None) -> dict:
    doc: dict = {"vidur_commit": commit, "mlp": [], "all_reduce": []}
    for rel, gpu, model in MLP_FILES:
        doc["mlp"].extend(mlp_rows(vidur, rel, gpu, model))
    for rel, gpu in ALL_REDUCE_FILES:
        doc["all_reduce"].extend(all_reduce_rows(vidur, rel, gpu))
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vidur_dir", type=Path, help="a checkout of microsoft/vidur")
    ap.add_argument("--commit", default=None, help="the Vidur commit checked out (recorded in the file)")
    ap.add_argument("-o", "--output", type=Path, default=None, help="YAML file to write (default: stdout)")
    args = ap.parse_args(argv)
    first = args.vidur_dir / "data/profiling/compute" / MLP_FILES[0][0]
    if first.read_text()[:40].startswith("version https://git-lfs"):
        sys.exit(f"{first} is a Git LFS pointer; fetch the LFS objects first")
    text = HEADER + yaml.safe_dump(build(args.vidur_dir, args.commit), sort_keys=False, width=120)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
