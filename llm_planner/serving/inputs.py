"""What a serving plan reads from files, read here and handed to the model as data: the cluster spec,
the model's configuration (a preset, or a config.json), a measured serving profile, and the workload
(--prompt-len/--output-len or a --workload file). The model below (serving.context, serving.costs,
...) takes what these return and opens no file.
"""

from __future__ import annotations

from typing import Any

from llm_planner.core import units
from llm_planner.core.fileio import read_document
from llm_planner.core.precision import DEFAULT_DTYPE, Precision, PrecisionError, build_precision, parse_weights
from llm_planner.core.spec import load_cluster
from llm_planner.core.spec_fields import Reader, as_int
from llm_planner.cost.serving_profile import load_serving_profile
from llm_planner.graph.checkpoint import checkpoint_precision
from llm_planner.graph.hf_config import named_config
from llm_planner.graph.transformer import DecoderConfig
from llm_planner.serving.workload import (
    TPOT_RANGE,
    TPOT_SLO_RANGE_S,
    TTFT_SLO_RANGE_S,
    RequestShape,
    ServingWorkload,
    WorkloadError,
    duration_s,
)


def read_context_inputs(cluster_path: str, model: str, profile_path: str | None = None) -> dict[str, Any]:
    """ServingContext's cluster, config and measured serving profile (None without one), read from
    the files named (its other arguments are not files)."""
    return {
        "cluster": load_cluster(cluster_path),
        "config": decoder_config(model),
        "profile": None if profile_path is None else load_serving_profile(profile_path),
    }


def serving_precision(model: str, dtype: str | None, weights: str | None, kv_cache: str | None) -> Precision:
    """The precision of `--dtype`, `--weights` and `--kv-cache-dtype` (None: not given) for `model`:
    activations default to the config's torch_dtype (else DEFAULT_DTYPE), weights to the format its
    quantization_config declares (else the activation dtype); PrecisionError naming both when an
    explicit --weights contradicts the checkpoint."""
    ckpt = checkpoint_precision(model)
    activations = dtype or (ckpt.dtype if ckpt is not None else None) or DEFAULT_DTYPE
    stated = ckpt.weights_label if ckpt is not None else None
    if (
        stated is not None
        and weights is not None
        and parse_weights(weights, "--weights") != parse_weights(stated, ckpt.source)
    ):
        raise PrecisionError(
            f"--weights {weights} contradicts {ckpt.source}: quantization_config, whose weights are {stated}"
        )
    return build_precision(activations, weights or stated, kv_cache)


def checkpoint_weights(model: str) -> str | None:
    """The weight format the model's config.json declares (as --weights writes it), None without one."""
    ckpt = checkpoint_precision(model)
    return ckpt.weights_label if ckpt is not None else None


def decoder_config(name: str) -> DecoderConfig:
    config = named_config(name)
    if config is None:
        raise WorkloadError(
            f"--model {name!r}: serving needs a decoder: a preset (`llm-planner models` lists them), a config.json "
            "or a directory holding one"
        )
    return config


def workload_from_flags(
    *,
    prompt_len: int | None,
    output_len: int | None,
    workload_file: str | None,
    tpot_slo: str | float | None,
    ttft_slo: str | float | None,
) -> ServingWorkload:
    """The workload of `plan --objective serving`: --prompt-len/--output-len or --workload FILE."""
    if tpot_slo is None:
        raise WorkloadError(f"--tpot-slo is required for --objective serving (a time such as '50 ms'; {TPOT_RANGE})")
    tpot = duration_s("--tpot-slo", tpot_slo, TPOT_SLO_RANGE_S)
    ttft = None if ttft_slo is None else duration_s("--ttft-slo", ttft_slo, TTFT_SLO_RANGE_S)
    if workload_file is not None:
        if prompt_len is not None or output_len is not None:
            raise WorkloadError("give either --workload FILE or --prompt-len/--output-len, not both")
        return ServingWorkload(
            requests=read_workload_file(workload_file), tpot_slo_s=tpot, ttft_slo_s=ttft, source=workload_file
        )
    for flag, value in (("--prompt-len", prompt_len), ("--output-len", output_len)):
        if value is None:
            raise WorkloadError(f"{flag} is required without --workload FILE (mean tokens per request)")
        if isinstance(value, bool) or value < 1:
            raise WorkloadError(f"{flag} must be a positive integer (mean tokens per request), got {value!r}")
    return ServingWorkload(
        requests=(RequestShape(prompt_len=prompt_len, output_len=output_len),), tpot_slo_s=tpot, ttft_slo_s=ttft
    )


MAX_SHAPES = 1000


def read_workload_file(path: str) -> tuple[RequestShape, ...]:
    """A YAML/JSON file: `requests: [{prompt_len: N, output_len: N, weight: W}, ...]` (weight optional)."""
    data = read_document(path, WorkloadError, finite=True)
    r = Reader(path, "", data)
    items = r.get("requests")
    r.done()
    if not isinstance(items, list) or not items or len(items) > MAX_SHAPES:
        r.fail(f"expected a list of 1 to {MAX_SHAPES} request shapes", "requests")
    out = []
    for i, item in enumerate(items):
        c = r.child(f"requests[{i}]", item)
        shape = RequestShape(
            prompt_len=c.get("prompt_len", as_int, positive=True),
            output_len=c.get("output_len", as_int, positive=True),
            weight=float(c.get("weight", units.parse_fraction, default=1.0, positive=True)),
        )
        c.done()
        out.append(shape)
    return tuple(out)
