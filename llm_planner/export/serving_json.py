"""Serving plans as data (`export --format json`, `--to megatron`): the engines of
llm_planner.export.serving with their sizes, ports and budgets, and Megatron-LM's parallel sizes."""

from __future__ import annotations

from typing import Any

from llm_planner.export.engine_args import past_limit
from llm_planner.export.serving import EnginePlan, ServingExport, layer_partition


def megatron_config(export: ServingExport) -> dict[str, Any]:
    """Megatron-LM's parallel sizes per pattern: tensor t, pipeline p, data = the copies, and the
    layer split (--decoder-first/last-pipeline-num-layers when only the end stages differ, else
    --pipeline-model-parallel-layout, E the embedding, t a decoder layer, L the loss)."""
    patterns: dict[int, list[EnginePlan]] = {}
    for e in export.engines:
        patterns.setdefault(e.replica, []).append(e)
    out = []
    for r, copies in patterns.items():
        first = copies[0]
        t, p, split = first.tensor_parallel, first.pipeline_parallel, first.layers
        args = [
            "--tensor-model-parallel-size",
            str(t),
            "--pipeline-model-parallel-size",
            str(p),
            "--num-layers",
            str(export.num_layers),
        ]
        if len(set(split)) > 1:
            middle = split[1:-1]
            if p > 2 and len(set(middle)) == 1:
                args += [
                    "--decoder-first-pipeline-num-layers",
                    str(split[0]),
                    "--decoder-last-pipeline-num-layers",
                    str(split[-1]),
                ]
            else:
                args += ["--pipeline-model-parallel-layout", "E" + "|".join(f"t*{n}" for n in split) + ",L"]
        out.append(
            {
                "replica": r,
                "pattern": first.pattern,
                "tensor_model_parallel_size": t,
                "pipeline_model_parallel_size": p,
                "data_parallel_size": len(copies),
                "num_layers_per_stage": split,
                "args": " ".join(args),
                "tokens_per_s_per_copy": first.tokens_per_s,
                "devices": [[list(s.devices) for s in e.stages] for e in copies],
            }
        )
    return {
        "framework": "megatron",
        "plan": export.plan_path,
        "model": export.model,
        "num_layers": export.num_layers,
        "patterns": out,
    }


def engines_config(export: ServingExport, ports: dict[str, int]) -> dict[str, Any]:
    """The engines as JSON (`export --format json`): sizes, partition, hosts, ports and shares."""
    env = past_limit(export.framework, export.max_model_len, export.model_limit)
    environment = dict([env]) if env is not None else {}
    return {
        "framework": export.framework,
        "plan": export.plan_path,
        "model": export.model,
        "dtype": export.dtype,
        "num_layers": export.num_layers,
        "max_model_len": export.max_model_len,
        "environment": environment,  # what the engines need to take max_model_len (past the limit)
        "quantization": export.quantization,
        "kv_cache_dtype": export.kv_cache_dtype,
        "multinode": export.multinode,
        "tokens_per_s": export.tokens_per_s,
        "engines": [
            {
                "name": e.name,
                "replica": e.replica,
                "copy": e.copy,
                "pattern": e.pattern,
                "tensor_parallel_size": e.tensor_parallel,
                "data_parallel_attention": e.data_parallel_attention,  # then each of the group's ranks runs:
                "all2all_backend": e.all2all if e.data_parallel_attention else None,
                # EPLB's redundant experts (--enable-eplb) on a data-parallel engine; null: EPLB off
                "eplb_redundant_experts": export.eplb if e.data_parallel_attention else None,
                "max_num_seqs_per_rank": e.rank_concurrency,
                "pipeline_parallel_size": e.pipeline_parallel,
                "layers_per_stage": e.layers,
                "layer_partition": layer_partition(e, export.num_layers),
                "max_num_seqs": e.concurrency,
                "mem_fraction": e.mem_fraction,
                "kv_tokens": export.kv[e.name].tokens,
                "kv_cache_memory_bytes": export.kv[e.name].gpu_bytes,
                "max_num_batched_tokens": export.batched_tokens[e.name],
                "port": ports[e.name],
                "head": e.hosts[0],
                "hosts": [{"host": h, "stages": e.host_stages(h), "gpus": e.host_gpus(h)} for h in e.hosts],
                "tokens_per_s": e.tokens_per_s,
                "share": export.share(e),
            }
            for e in export.engines
        ],
    }
