"""Write docs/benchmarks.md from the benchmarks' current results (never edit that file by hand).

    .venv/bin/python benchmarks/make_docs.py

One section per benchmark: what it measures and how to read its table, the command,
when and at which commit the results were measured (benchmarks/results/<name>/meta.json,
written by the benchmark itself through benchmarks/provenance.py), and the table the
benchmark wrote (benchmarks/results/<name>/table.md). A benchmark with no current
results is listed with its command under "Not measured at this commit". Earlier
results live in git history, not in benchmarks/results/.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Section:
    name: str  # benchmarks/results/<name>/
    title: str
    about: str  # what the benchmark measures and how to read the table; no figures (they are in the table)
    command: str | None = None  # how to measure it, listed while it has no results


SECTIONS = [
    Section(
        "fidelity",
        "Fidelity: the serving model against measured engines",
        """\
Each serving row of benchmarks/data/fidelity_references.yaml (a published run: engine, model,
GPUs, tensor-parallel degree, concurrency, mean prompt and output lengths, with its source) scored
by the planner's model at the same settings (docs/fidelity.md): TPOT, output tokens/s and TTFT,
measured and modelled, and their ratio (model / measured; above 1 the model is slow or
pessimistic for TPOT and TTFT, optimistic for tokens/s). `calibration` rows are those the
catalog's constants were fitted on; `held_out` rows judge the model. A closed batch's TTFT (all
prompts at once) and its tokens/s are not the steady state the model describes: marked, and kept
out of the summary; rows whose concurrency does not fit memory in the model are marked `over
memory` (the engine runs fewer and queues the rest). Below the table, the linear kernel (Vidur's
four projections summed) and one all-reduce per call against Vidur's operator medians, then two
tables of many runs, summarised per model, GPU, degree and precision: the NIM grid (TensorRT-LLM
under genai-perf's closed loop, each run scored as that loop simulated iteration by iteration, by
concurrency, with a fit of the TPOT the model misses and the held-out runs' summary in the steady
state beside it; its A100 runs and its H100 runs at 1-25 in flight are calibration runs, its H100
runs at 50-250 held out) and TensorRT-LLM
0.9.0's static batches (held out, by batch size); docs/fidelity.md reads them.""",
    ),
    Section(
        "fit_catalog",
        "The catalog's serving factors, fitted on the calibration runs",
        """\
`benchmarks/fit_catalog.py` fits the GPU catalog's memory efficiency, step overhead, per-call
collective overhead and time per sequence (one value of each for the A100 and H100 entries) on two
calibration sources weighted alike: the vLLM calibration rows of the fidelity references (10 in
flight) and the NIM grid's runs on A100 (1 to 250 in flight, in the steady state); then the H200's
memory efficiency on its three calibration rows. It prints the fitted values and writes them to fit.json; the table
gives each source's TPOT ratio (model / measured: median, share within 15%, RMS of the error) with
the catalog's factors at the commit it ran at and with the fitted ones. The catalog rounds the
fitted values (docs/fidelity.md, "What was fitted, on what").""",
        ".venv/bin/python benchmarks/fit_catalog.py",
    ),
    Section(
        "fit_engine",
        "TensorRT-LLM's factor set, fitted on its own runs",
        """\
`benchmarks/fit_engine.py` fits the same four factors on TensorRT-LLM's calibration runs on one GPU
alone (here the NIM grid's runs on A100, scored in the steady state as the set was fitted), from the
catalog's values, by fit_catalog's Gauss-Newton; the catalog's `tensorrt-llm` engine set
(llm_planner/core/data/engine_factors.yaml) rounds them. The table scores the grid's held-out runs
(H100 at 50-250 in flight, fp8 runs among them) as the closed loop genai-perf ran
(benchmarks/fidelity_grid.py) with the catalog's factors and with the fitted ones: TPOT and output
tokens/s ratios (model / measured), median and share within 15%, over the held-out runs (all at
32-256 in flight, the issue's range).""",
        ".venv/bin/python benchmarks/fit_engine.py",
    ),
    Section(
        "fit_engine_h100",
        "TensorRT-LLM's H100 factors, fitted on its H100 runs at low load",
        """\
The same fit on the NIM grid's H100 runs at 1-25 in flight (`--gpu h100-sxm-80g`), the set's H100
values (its `by_entry`), judged on the same held-out runs, the H100's at 50-250 in flight.""",
        ".venv/bin/python benchmarks/fit_engine.py --gpu h100-sxm-80g",
    ),
    Section(
        "fit_engine_closed_loop",
        "TensorRT-LLM's factors fitted on its runs as the closed loop they ran",
        """The same fit with the calibration runs scored as the closed loop genai-perf ran
(`--fit-on closed-loop`), judged the same way; compare with the section above (docs/fidelity.md,
"What was fitted, on what": the set keeps the steady fit's values).""",
        ".venv/bin/python benchmarks/fit_engine.py --fit-on closed-loop "
        "--out benchmarks/results/fit_engine_closed_loop",
    ),
    Section(
        "fit_engine_decode_key",
        "TensorRT-LLM's factors fitted with decode attention's least time per key, on A100",
        """The fit of the section "TensorRT-LLM's factor set, fitted on its own runs" with one more factor,
decode attention's least time per key of a sequence (`decode_key_s`, docs/cluster-spec.md), judged
the same way; the set does not take it (docs/fidelity.md, "Where it stands").""",
        ".venv/bin/python benchmarks/fit_engine.py --fit-decode-key --out benchmarks/results/fit_engine_decode_key",
    ),
    Section(
        "fit_engine_h100_decode_key",
        "TensorRT-LLM's H100 factors fitted with decode attention's least time per key",
        """The H100's fit with one more factor, decode attention's least time per key of a sequence
(`decode_key_s`), judged the same way; the set does not take it (docs/fidelity.md, "Where it
stands").""",
        ".venv/bin/python benchmarks/fit_engine.py --gpu h100-sxm-80g --fit-decode-key "
        "--out benchmarks/results/fit_engine_h100_decode_key",
    ),
    Section(
        "fit_grid_admission",
        "The NIM grid's token budget and front end, fitted on its calibration runs",
        """\
`benchmarks/fit_grid_admission.py` scores the NIM grid's runs that fit the model's memory as the
closed loop genai-perf ran, at each pair of a token budget an iteration (the engine's
`max_num_tokens`) and a front-end time a request (NIM's server passing requests to the engine one at
a time), neither of which the source states: TTFT, TPOT and output tokens/s ratios (model /
measured), median and share within 30% (TTFT) or 15%. The pair with the most TTFT ratios within 30%
on one GPU's calibration runs (here the A100's) is kept (`kept`), and benchmarks/fidelity_grid.py
scores that GPU's runs at it; the held-out rows (H100 at 50-250 in flight) are scored beside it.""",
        ".venv/bin/python benchmarks/fit_grid_admission.py",
    ),
    Section(
        "fit_grid_admission_h100",
        "The NIM grid's H100 token budget and front end, fitted on its runs at low load",
        """\
The same choice on the H100's calibration runs, 1-25 in flight (`--gpu h100-sxm-80g`), with the engine
set's H100 values; the held-out rows, the H100's at 50-250 in flight, judge it.""",
        ".venv/bin/python benchmarks/fit_grid_admission.py --gpu h100-sxm-80g",
    ),
    Section(
        "fp8_cache_readings",
        "The fp8 runs' KV cache, read three ways",
        """\
`benchmarks/fp8_cache_readings.py` scores the fp8 runs of the NIM grid (H100; those at 50-250 in flight
held out, those at 1-25 among the H100 calibration runs; TensorRT-LLM's factor set, as the closed loop
genai-perf ran) and of TensorRT-LLM 0.9.0's static batches (held out,
the catalog's factors) with three readings of a KV cache their sources do not state: held in 16 bits;
held and read in 8 bits; held in 8 bits and read at the 16-bit cache's time (a kind's
`kv_dequant_factor` 2). Per reading: the runs that fit the model's memory, their ratios (model /
measured; the static batches' TPOT is the decode step) with medians and shares within the bars (15%,
TTFT 30%), and the runs past memory with their TTFT (the engine's queue simulated). `scored so today`
marks the reading each benchmark uses.""",
        ".venv/bin/python benchmarks/fp8_cache_readings.py",
    ),
    Section(
        "grid_decode_share",
        "The grid's TPOT under load against the model's decode step",
        """\
`benchmarks/grid_decode_share.py` takes every NIM grid run at 100-250 in flight that fits the model's
memory (A100 calibration, H100 held out from 50 in flight; TensorRT-LLM's factor set) and divides its
measured TPOT, and
the model's (the closed loop as the fidelity benchmark scores it), by the model's pure decode step at
that concurrency (C decodes at the mean context, no prompt work). Medians per GPU, precision and
request shape. With 200-token prompts, 200/2000 carries a tenth of a prompt token per output token and
200/200 one: the rise from the one to the other is the prompt work a TPOT carries; the 200/2000 figure
is mostly how far the decode step is from the engine's.""",
        ".venv/bin/python benchmarks/grid_decode_share.py",
    ),
    Section(
        "grid_ttft_probes",
        "Four readings of the grid's closed loop",
        """\
`benchmarks/grid_ttft_probes.py` rescores the NIM grid's runs that fit the model's memory under four
readings of the closed loop genai-perf ran: as the fidelity benchmark scores it; with the cold start
(the first C requests to end) left out; with the front end's time a request grown by a time a prompt
token; with context chunking on. Each reading's budget and front end (and time a prompt token) are
chosen on each GPU's calibration runs as `fit_grid_admission.py` chooses them; the held-out runs (H100
at 50-250 in flight) are scored at the H100's choice, and at the reading's best candidate for them
(what no calibration picks). The last column counts the A100's runs of 2,000-token prompts at 50 in
flight and more within 30% at the A100's choice. Nothing is kept from it.""",
        ".venv/bin/python benchmarks/grid_ttft_probes.py",
    ),
    Section(
        "grid_gpu_ratio",
        "How much faster the grid's engine runs on H100 than on A100, measured and modelled",
        """\
`benchmarks/grid_gpu_ratio.py` pairs every 16-bit NIM grid run on A100 with its twin on H100 (same
model, degree, request shape and concurrency; both fitting the model's memory) and divides the A100
run's TPOT by the H100 run's: measured / modelled (TensorRT-LLM's factor set, each GPU's values
fitted on its own calibration runs; the closed loop as the fidelity benchmark scores it). The data
sheets' bandwidths differ 1.64x (3,350 and 2,039 GB/s). Where the model's ratio falls short of the
measured, its H100 time is too long against its A100 time.""",
        ".venv/bin/python benchmarks/grid_gpu_ratio.py",
    ),
    Section(
        "gpu_parts",
        "A layer's parts on an H200 against the kernel model",
        """\
`llm-planner profile-serving --raw` on one H200 (bf16, CUDA graphs, the L2 flushed before each
timed replay; the raw files and the profiles written beside them are in the results folder, with
the command in docs/fidelity.md, "The kernels on an H200, measured") read back without a GPU:
a layer's four projections (cuBLAS) per member of a tensor-parallel group of 1 to 8, against the
kernel model's `linear` kernel at the catalog's h200-sxm-141g factors (model / measured: below 1
the model is fast); an affine fit of the small-token points over every degree (a fixed time per
layer plus the weight bytes over a bandwidth); decode attention (torch's flash kernel, query heads
packed per key/value head) against the model's `attn_decode`.""",
        ".venv/bin/python benchmarks/bench_gpu_parts.py",
    ),
    Section(
        "refit",
        "Refitting the serving model on a few runs of one engine: the NIM grid",
        """\
For each (model, GPU, tensor-parallel degree, dtype) of the fidelity benchmark's NIM grid
(NIM's TensorRT-LLM backend, Llama-3 8B and 70B on A100 and H100 servers; docs/fidelity.md),
`calibrate --serving` fits the GPU's five serving factors (compute and memory efficiency, step,
collective and per-sequence overheads) on three of the group's runs, one prompt/output size at three
concurrencies, read as genai-perf profile exports; the fitted spec then scores the group's other
runs. Columns: what was trained on; the fitted factors (those the data could not tell keep the
catalog's, named); the runs held out; for TPOT, output tokens/s and TTFT the median ratio model /
measured over them and the share within 15% (30% for TTFT), with the catalog's factors and with
the fitted ones.""",
        ".venv/bin/python benchmarks/bench_refit.py",
    ),
    Section(
        "all2all",
        "DeepEP's low-latency dispatch and combine against its published times",
        """\
Each row of DeepEP's own low-latency table (public repository deepseek-ai/DeepEP, docs/legacy.md:
H800 servers of 8, a 400 Gb/s card per GPU, 128 tokens a rank, hidden 7168, top-8, fp8 dispatch,
bf16 combine; benchmarks/data/deepep_low_latency.yaml) beside the time the serving model charges
for that call (`llm_planner.cost.dp_attention.deepep_call_s`, the kernel of a `dpa<k>-deepep` group:
a fixed time per call plus the bytes of the (token, expert) pairs leaving a rank over NVLink and
over its card between servers, at the links' data-sheet bandwidth). The fixed time was fitted on
these rows (the median of measured minus the bytes' time), so they are calibration rows: the table
shows how well one fixed time and the links' bandwidth describe DeepEP from 8 to 256 ranks.""",
        ".venv/bin/python benchmarks/bench_all2all.py",
    ),
    Section(
        "serving",
        "Serving: tokens/s under a per-token latency target against engineer-best",
        """\
Each row plans `--objective serving` (docs/serving.md) for one model on one example cluster at
one TPOT target, and scores, with the same model, the layouts an engineer would run on vLLM or
SGLang (`engineer-best`: per class of identical servers every tensor-parallel degree, pipeline
split and replica count at the best concurrency; classes as separate engines) and `megatron`.
Columns: output tokens/s of the cluster; the ratio to engineer-best; the replicas (copies x
layout @ concurrency / micro-batches); the largest TPOT; the largest share of a device's usable
memory in use with every sequence in flight; for the plan, the upper bound over every plan, the
gap to it, the search time (wall clock, limited to 60 s) and the total time of the plan (search,
baselines and the bound). Every plan was verified.
Requests: prompt 512, output 128 (GPT-3) or 256 tokens; the Helix rows use Helix's 24-machine
cluster and its measured LLaMA-2 70B layer profiles (`llm-planner import helix`) with the Azure
Conversation means (prompt 763, output 232).""",
    ),
    Section(
        "precision",
        "Precision: Llama-3 70B in fp16, fp8 and int4 on two mixed fleets",
        """\
The serving table's columns (above) for Llama-3 70B at a 50 ms TPOT target (prompt 512, output
256) on `dgx-a100-l4` and `l40s-h100` (16 servers of 8 L40S, 4 of 8 H100), once per precision:
fp16; fp8 weights and KV cache (W8A8 on the GPUs with fp8 tensor cores, weight-only W8A16 on the
A100s); int4-AWQ weights with an fp8 KV cache. Engineer-best and megatron run in the row's
precision, so each row compares layouts at equal terms and the rows of a fleet compare formats,
which also change the model's quality: the planner plans the formats a user allows
(`--allow-weights`), never one chosen silently.""",
        ".venv/bin/python benchmarks/bench_precision.py",
    ),
    Section(
        "moe",
        "Mixture of experts: Mixtral-8x7B and DeepSeek-V3 against the layouts their engines document",
        """\
The serving table's columns (above) for Mixtral-8x7B in fp16 on `dgx-a100-l4` (prompt 512, output
128) and DeepSeek-V3 with fp8 weights and KV cache and bf16 activations on `h200-2x8` (prompt and
output 1,000), at 50 and 100 ms TPOT. Engineer-best includes data-parallel attention with the
experts split over a server (`dpaK`, SGLang's DeepSeek guide); megatron is tensor parallelism over
each server (the guides' plain `--tp 8`). Every plan is verified; solve and total times are the
search's and the whole plan's (search, baselines and the bound) on this machine.""",
        ".venv/bin/python benchmarks/bench_moe.py",
    ),
    Section(
        "serving-bounds",
        "Serving: what each upper bound gives",
        """\
On instances where the cell bound over whole replicas or the price bound changes the answer:
the plan's tokens/s (the serving search), the least of the first two serving bounds
(concurrency levels; concurrency and micro-batch levels), the cell bound, the price bound at the
device prices of the plan's search (searched to its end, not stopped within 2% of the plan as
`plan` stops it), and the seconds each took (docs/serving.md, "The upper bound").""",
    ),
    Section(
        "fleet",
        "Fleets: serving plans for 6 to 512 servers",
        """\
Fleets of the three server types of `gpt3-six-servers` (8x H100, 8x A100 80GB, 8x V100 32GB)
and an L40S type (8x L40S 48GB on PCIe), in proportion; 512 servers hold 4,096 GPUs. Each row
plans `--objective serving` at a 100 ms TPOT target (the specs are in the results folder) and
verifies the plan. Identical servers are counts, never copies: the search evaluates replica
layouts over classes and the fleet MILP chooses how many copies of each, so neither grows with
the number of servers. Columns: servers and GPUs of the fleet; the model; the plan's tokens/s,
engineer-best's, their ratio; the bound and gap; the solve time (the whole plan: baselines,
the layout search within its 60 s limit, the bound) and `verify`'s time (which recomputes the
bound); layouts evaluated of the candidates (the others priced out by the fleet LP, or, where
said, left when the search reached its time limit); the replicas (copies x layout). The solve
time is the layout search (the layouts its optimistic check cannot price out, docs/serving.md,
"What the planner searches") and the price bound (docs/serving.md, "The upper bound": up to
3,000 small MILPs, two at a time on the two cores, each about as long on every fleet size); the
first two bounds run in a child process beside the search. `verify` recomputes the bound, the
price bound included.""",
    ),
    Section(
        "helix",
        "Helix's own simulator on Helix's layout and on ours",
        """\
Helix's discrete-event simulator (docs/helix.md: offline LLaMA-2 70B on its 24-machine cluster
of 4 A100 40GB, 8 L4 and 12 T4 over 1 GB/s links with 1 ms latency, Azure Conversation request
lengths, MaxFlow scheduling) scores a layout by the decode tokens that reach the coordinator
per simulated second over Helix's window (600 s after a 60 s warm-up). Rows: `helix-milp` is
Helix's own MILP layout (Helix reports 252.1 for it); `plan-helix-llama2-70b.ini` is the layout
`llm-planner plan-helix` writes for the cluster from Helix's own files (docs/helix.md, "Planning
for Helix's engine"), `-fast-first` the same stages with `--order fast-first`;
`serving-llama2-70b-1s.ini` is the layout of our serving plan at a 1 s TPOT target ("Serving"
above; `llm-planner export --to helix`), one pipeline of all 24 machines. The model column is
`plan-helix --score` as it was then (the chain model, for layouts whose machines form stages);
`--score` now routes every layout as Helix's own max flow routes it, and docs/helix.md ("Measured
on this version") gives those estimates beside each simulated figure. The target, at least Helix's
252.1 under its simulator, is met by `plan-helix`'s layout: 292.2. Helix reports 124.3 for one
pipeline per GPU type.""",
    ),
    Section(
        "helix-cases/single24-30b",
        "Helix's simulator: LLaMA-1 30B on its 24-machine cluster",
        """\
Helix's published LLaMA-1 30B case (docs/helix.md, "Measured on this version"): `helix-30b` is
Helix's own answer, one MILP layout per machine type, each simulated on its own sub-cluster and the
rates summed (Helix reports 339.6); `plan-helix-30b` is `plan-helix`'s plan, one deployment per
chain (`single24-30b-<k>.ini` on `single24-30b-<k>.cluster.ini`), summed the same way. The model
column is the routed estimate (`plan-helix --score` of each deployment, summed).""",
    ),
    Section(
        "helix-cases/cluster42-70b",
        "Helix's simulator: LLaMA-2 70B on its 42-machine cluster",
        """\
Helix's high-heterogeneity case (42 machines of 7 types, docs/helix.md): `helix-cluster42` is
Helix's MILP layout with its own simulator cluster file (Helix reports 645.6);
`plan-helix-cluster42` is `plan-helix`'s plan, two deployments of half of every type's machines
(chosen by the replay among the candidates, docs/helix.md), simulated apart and summed. The model
column is the routed estimate (the replay's is in "Helix's simulator against the plan-helix
estimates" below). Latencies are of Helix's offline closed loop at full load (a decode step: one
token through the whole route), for rows of one simulation (Helix pools the latencies of separate
deployments, which these records do not keep).""",
    ),
    Section(
        "helix-cases/3cluster24-70b",
        "Helix's simulator: LLaMA-2 70B on its three-region cluster",
        """\
Helix's geo-distributed case (24 machines in three regions, 10-15 MB/s and 40-59 ms between
regions, docs/helix.md): `helix-3cluster24` is Helix's MILP layout with its own simulator cluster
file (Helix reports 98.0); `3cluster24-70b.ini` is `plan-helix`'s layout, its stages ordered by
region. The model column is the routed estimate. Latencies are of Helix's offline closed loop at
full load (a decode step: one token through the whole route).""",
    ),
    Section(
        "helix-online",
        "Helix's simulator online: LLaMA-2 70B on its 24-machine cluster at 700 tokens/s offered",
        """\
Helix's online mode (requests of the Azure Conversation lengths arriving at a mean 700 tokens/s,
1,800 simulated seconds, its KV expectation 0.9 and 0.6 of the output): decode tokens/s and the
percentiles of a decode step's latency (one token through the whole route) and of a prompt's, as
Helix's `analyze_latency` reads them. `helix-milp-online` is Helix's MILP layout (Helix reports
141.6 tokens/s, decode p95 3.19 s); `plan-helix-llama2-70b.ini` is `plan-helix`'s layout for the
offline case. The model column is the offline routed estimate, not a latency model.""",
    ),
    Section(
        "helix-replay",
        "Helix's simulator against the plan-helix estimates: the routed formula and the replay",
        """\
Every offline simulation recorded in the Helix sections above (one Helix deployment per row: a
plan of several chains is one row per chain), beside the two estimates `plan-helix` computes at
this commit (docs/helix.md, "The engine, replayed"): the routed estimate (the steady-state
formula the search ranks layouts by) and the replay (Helix's engine replayed request by request
on the layout's max flow, over Helix's 60 s + 600 s window, with Helix's own request lengths),
each with its ratio to the simulated figure. The simulated column is the recorded one (the commit
each was recorded at is in its section's meta.json); Helix's simulator is not run by this
benchmark (it needs `LLM_PLANNER_HELIX` naming a Helix checkout, for Helix's cluster files, model
folders and request lengths). replay_s is the replay's wall time on this 2-core machine.""",
    ),
    Section(
        "tp",
        "Tensor parallelism: MILP-SPLIT against the layouts engineers write by hand",
        """\
One decode step (context 2048, fp16) per row, on the example clusters; MILP-SPLIT with
groups up to a whole server (`--max-tp` default). Columns: the plan's objective
(latency: seconds for the batch; throughput: seconds per sample), its lower bound over
every plan with or without groups, the gap, the solve time (the whole `solve` call,
bounds and verification included), physical devices used, the fullest device (one member
of a group) against its usable memory; then `megatron` and `tp-replicas`
(docs/objectives.md), the best of the five single-device baselines, and MILP-SPLIT with
`--max-tp 1` (no groups); the layout is the group degree MILP-SPLIT chose per class of
identical devices. Every plan passed the verifier. The README's main job is the row
`gpt3-175b/gpt3-six-servers/latency/32`.""",
    ),
    Section(
        "launch",
        "Launch: predicted against measured (profile, plan, launch --measure)",
        """\
Each run is the whole pipeline a user runs, with the CLI, on
`cluster_specs/localhost-2cpu.yaml` (two one-core CPU devices: one MPI rank per core of a
2-core machine): `profile --mpi` (single devices, a member's share of each task on the
group of two, and the group running its tasks together with its real all-reduces),
`plan --profile`, then `launch --measure` (two untimed warm-up runs, then the timed
one). GPT-2 (124M, seeded weights, fp32, `--max-new-tokens 16`), one decode step at
`--seq-len 16`: the run generates 16 tokens after an 8-token prompt and compares the mean
of its 15 decode steps (`run.json`'s `measured_s`, the same quantity as the plan's
`objective_s`). Cases: `gpt2-latency-tp`, the `megatron` layout (every task on the
tensor-parallel group of the two cores), batch 1; `gpt2-latency`, the plan MILP-SPLIT
makes with groups offered, batch 1; `gpt2-throughput-b4`, MILP-SPLIT's throughput plan
at batch 4, run in steady state (the batches in flight its pipeline needs), seconds per
sample. ResNet-18 (seeded weights, fp32): `resnet18-throughput-b8`, MILP-SPLIT's throughput
plan at batch 8 in one shard (`--max-shards 1`: a pipeline over the two cores), its batches
streamed through the stages, seconds per sample over the steady state's period between
batch ends (docs/measure.md). Beside each run: the decoder block as the plan costs it (the profile's fit at the
plan's sub-batch, `@group2` on the group) and as the run executed it (seconds per call over
the decode steps); for the CNN the busiest device's work a batch, as the plan costs it
(`max_load_s`) and as the run did it (the largest rank compute a batch over the batches
streamed): the period the run would have with its stages overlapping perfectly, so the
measured period over it is what the overlap lost, and the measured work over the planned what
the tasks lost against their profile; and the 1-minute load average before the profile and before the launch
(other processes on the two cores land in either). Every run is listed; each run's profile,
plan, run report and measurement are kept under `benchmarks/results/launch/<case>/run<i>/`.
The target: every run within 15% of its prediction.""",
    ),
    Section(
        "serve",
        "Serve: served plans against the serving model calibrated on this machine",
        """\
`llm-planner launch SERVING_PLAN` (docs/serve-runtime.md) on `cluster_specs/localhost-serve.yaml`
(one-core CPU devices, one MPI rank each) serving the small GPT-2 beside it
(`cluster_specs/localhost-serve-gpt2`: 8 layers, 256 wide, vocabulary 2048, fp32, seeded
weights), every request a 32-token prompt and 32 output tokens, closed loop, a token budget of 64
per iteration. Rows `calibration` are the runs `llm-planner calibrate --serving` fits the spec's
serving factors on (five, the time per sequence among them: docs/measure.md) (a single-stage
replica at concurrency 1 and 8, a tensor-parallel pair at 4: `calibrated.yaml` in the results
folder, its fit in `calibrate.txt`); their predictions are the uncalibrated spec's. Rows `judged`
are kept apart from the fit: each is a plan scored on the calibrated spec and served (`single`: one
device; `pipeline`: two stages, two micro-batches; `tp2-tp1`: a tensor-parallel pair feeding one
device, three ranks; `two-replicas`: two single-device replicas behind the front end, C per
replica). Every run is served three times, in rounds (each round serves every run of its phase
once in turn, so a slow stretch of this shared machine falls on all runs alike); each measured
figure of a row is the median of the run's repeats, and the calibration fits each run's repeat of
median tokens/s. Each run serves 8 requests per slot of its concurrency (at least 16).
Columns: MPI ranks, concurrency C, micro-batches m; output tokens/s of the run and mean TPOT over
its requests, each measured and predicted, and predicted / measured; TTFT measured as the mean over
every request and as the steady mean (`steady`: the requests admitted once the opening burst has
drained, `ttft_steady_s` of the run report, docs/serve-runtime.md), predicted, and predicted /
steady; `spread`: (largest - smallest) / median tokens/s over the repeats, how far the machine
moved; `within 15%`: tokens/s and TPOT both within 15% (the target); `TTFT within 30%`: the steady
TTFT within 30%. The model's TTFT is a prompt's in the steady state; a closed-loop run admits all C
requests at its start, whose prompts then wait for the token budget behind one another, a ramp the
mean over every request carries and the steady mean leaves out. Rows `oversubscribed` are
judged runs whose processes exceed the machine's cores (the three ranks of `tp2-tp1`, or two
replicas' ranks and the front end, on two cores): run and shown, not judged, since their ranks
take turns on a core where the spec gives each its own.
Each run's plan is kept under `benchmarks/results/serve/runs/<run>/`, each repeat's report and
log under `rep1/` to `rep3/` there.""",
        ".venv/bin/python benchmarks/bench_serve.py",
    ),
    Section(
        "split",
        "MILP-SPLIT against the exact MILP",
        """\
Every row is a model preset on a cluster spec (batch 1 and 8, latency), solved in one run
by the exact MILP under a time limit (in a child process), MILP-SPLIT, the best baseline
and the fastest single device. Columns: the tasks; the MILP's objective, status and solve
time; MILP-SPLIT's objective and solve time; the best bound known (the larger of
MILP-SPLIT's and the MILP's dual bound); MILP-SPLIT's gap to it; MILP-SPLIT against the
MILP (negative: MILP-SPLIT is better), the speedup (MILP time over MILP-SPLIT time, a
lower bound where the MILP hit its limit), and the improvement over the best baseline and
the single device. Solve times are wall-clock `solve(...)` with the verifier off; every
plan was verified apart. `--quick` runs four models with a 10 s MILP limit; the full run
(`bench_split.py` without it, 60 s limits, more models and throughput rows with
`--objectives latency,throughput`) takes hours on this machine. The targets of the
MILP-SPLIT issue follow the table.""",
    ),
    Section(
        "milp-models",
        "The exact MILP on models",
        """\
The exact MILP (HiGHS, one thread) on ResNet-50, randomly wired networks of 22 to 202
tasks and GPT-2's prefill in blocks, on the CPU + two GPUs node, batch 1 and 8, latency
and throughput, each under the time limit in the command. Columns: the MILP's objective,
its bound and gap, its status, the solve time (the whole solve_milp call, warm start
included), the model's size (variables, integers, rows), branch-and-bound nodes, the best
baseline and the MILP against it. The same benchmark on the published dnn-partitioning
inputs is `bench_milp.py workloads` (docs/workloads.md).""",
    ),
    Section(
        "runtime",
        "Runtime: the MPI decoder pipeline against one process",
        """\
A small GPT-2 with seeded weights is planned on `cluster_specs/localhost-cpu.yaml` with
its blocks split evenly over two single-core CPU devices (embed with the first blocks,
final norm and LM head with the last) and generates greedily. Rows: `generate (1
process)`, transformers' `model.generate` on the whole model, one torch thread; `stages
(1 process)`, the runtime's decoder code with every task in one stage, no MPI; `mpi, R
ranks, M micro-batch(es)`, `launch` of the plan with the batch in one shard, and cut into
one shard per rank on the same stages (the plan's pipelined micro-batches). Columns:
tokens/s over the wall time of generation (model building excluded), per-token latency
(one step of the whole batch), compute summed over ranks, and the runtime's overhead
(the share of the ranks' time outside compute, transfers and waiting). Each row is the
run of median time over the repeats; the script fails if the tokens differ between rows
or the overhead exceeds 10%.""",
    ),
    Section(
        "symmetry",
        "Symmetry breaking among identical devices and servers",
        """\
Each table is `llm-planner compare-symmetry` on one instance (one batch shard, so that
the exact MILP's size stays in reach): the exact MILP and MILP-SPLIT under every
`--symmetry` criterion (docs/symmetry.md), with the plan's objective, the proven bound,
the gap, the solve time, the solver's status and the exact MILP's branch-and-bound
nodes. By default the benchmark runs the GPT-2 row (a small GPT over four identical
GPUs, where branch-and-bound meets mirrored devices); `--rows all` adds the GPT-3 175B
rows on `gpt3-six-servers` (about 25 minutes).""",
    ),
    Section(
        "symmetry-fleet",
        "Symmetry breaking on a fleet: an LLM over several heterogeneous servers",
        """\
DiviML's case study, an LLM across several heterogeneous servers, at the size the exact MILP
handles: `compare-symmetry` on six servers of two GPUs, two identical servers of each of the
H100, A100 and V100 types of `gpt3-six-servers` (its data-sheet kinds and links; the CPUs not
offered), a GPT-2-style decoder of GPT-3 6.7B's width (4,096, 32 heads, vocabulary 50,257) with
12 blocks (15 tasks at block granularity), one decode step of a batch of 8 at a context of 128
tokens, throughput, one batch shard, no tensor-parallel groups: 12 devices, three server
classes of two and six device classes of two. The spec and the model's config.json are in the
row's results folder. The exact MILP works on the expanded devices (it has no counts); what the
criteria add is one ordering row per consecutive pair of identical devices and of identical
servers. Columns as above, plus the MILP's own status and dual bound: the plan's status and
bound are the ones `verify` re-derives (bounds/combined.py), which do not see the MILP's proof,
so an optimum the MILP proved shows as `feasible` with the combined bound beside it (`-`: the
plan's status is the MILP's own, as when it stopped at its time limit).""",
    ),
    Section(
        "limits",
        "Input limits: the sizes at each limit, planned, with time and peak memory",
        """\
Each row is `llm-planner plan` (default solver, MILP-SPLIT, with its baselines; the command is
under the table) on inputs at one limit of docs/inputs.md, the sizes taken from the code's own
limits: the task limit (a chain), the edge limit (each task reading the ones before it), the
task x device pair limit and the transfer-table limit (GPT-3 175B at sublayer granularity on
the largest copy of `gpt3-six-servers` inside both), the device limit (`--objective serving`,
which works on classes of servers, and a latency plan, which the transfer-table limit refuses),
and the longest names. One case runs at a time, in a child process; peak memory is the largest
process's (`wait4`'s `ru_maxrss`) and all of the command's processes together (sampled from
/proc). A case past its timeout or memory cap is killed and says so. Each plan was then checked
by `verify` (its exit code, time and peak memory in the last column).""",
    ),
    Section(
        "cost-model",
        "The roofline against a measured profile, task by task",
        """\
For every task of a GPT-2 profile (sublayer granularity, context 256, fp32, batch 1 and
4, two blocks) on `cluster_specs/localhost-2cpu.yaml`: the roofline's time from the
cluster spec and the measured median, and their ratio. A task whose bytes or FLOPs were
counted wrong stands out from the others' ratio; a ratio shared by every task is the
spec's efficiency or overhead, which `llm-planner calibrate` fits.""",
    ),
]

NOT_MEASURED = [
    (
        "Exact MILP on the dnn-partitioning inputs",
        ".venv/bin/python benchmarks/bench_milp.py workloads --time-limit 600",
    ),
    (
        "Where MILP-SPLIT's gap comes from, one module",
        ".venv/bin/python benchmarks/bench_module_gap.py --model rwnn-ws-3x32 --cluster cpu-two-gpus",
    ),
    ("Predicted against measured, GPT-2 and ResNet-18 on even splits", "bash benchmarks/run_measure.sh"),
]


def _measured(meta: dict) -> str:
    commit = meta.get("commit", "")[:10] or "an unknown commit"
    where = f"at commit {commit}" + ("" if meta.get("clean", False) else " with uncommitted changes to the code")
    load = meta.get("load_before")
    return (
        f"Measured {meta.get('date_utc', '?')} to {meta.get('ended_utc', '?')} UTC {where}, "
        f"on {meta.get('cpus', '?')} cores"
        + (f", load average {load:.2f} before the run" if isinstance(load, (int, float)) else "")
        + "."
    )


def section_text(section: Section) -> str | None:
    folder = RESULTS / section.name
    if not (folder / "table.md").is_file() or not (folder / "meta.json").is_file():
        return None
    meta = json.loads((folder / "meta.json").read_text())
    table = (folder / "table.md").read_text().strip()
    return (
        f"## {section.title}\n\n```\n{meta['command']}\n```\n\n{section.about}\n\n{_measured(meta)}"
        f" Results: `benchmarks/results/{section.name}/`.\n\n{table}\n"
    )


def document() -> str:
    parts = [
        "# Benchmarks\n",
        "Written by `.venv/bin/python benchmarks/make_docs.py` from the results each benchmark wrote "
        "(`benchmarks/results/<name>/`: the table, and `meta.json`: the command, the commit and when); do not edit "
        "this file by hand. Earlier results are in git history.\n",
    ]
    missing = []
    for section in SECTIONS:
        text = section_text(section)
        if text is None:
            missing.append((section.title, section.command or f"(no results in benchmarks/results/{section.name}/)"))
        else:
            parts.append(text)
    rows = [f"- {title}: `{command}`" for title, command in [*missing, *NOT_MEASURED]]
    parts.append(
        "## Not measured at this commit\n\nThese benchmarks exist but their figures were not taken at this "
        "commit (earlier ones are in git history); run the command to measure them:\n\n" + "\n".join(rows) + "\n"
    )
    return "\n".join(parts)


def main() -> int:
    path = REPO / "docs" / "benchmarks.md"
    path.write_text(document())
    print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
