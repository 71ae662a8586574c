"""Serving plans of chosen replicas on the localhost cluster, and the whole-model reference, for the
serving runtime's tests. The plans' figures are the replica model's at the chosen operating point
(what `plan` would write for that replica); their totals, bound and baselines are not searched."""

from __future__ import annotations

from pathlib import Path

import torch
from runtime_fixtures import LOCALHOST

from llm_planner.runtime import gpt
from llm_planner.runtime.serve_requests import LoadSpec, RequestStream
from llm_planner.serving.api import fixed_plan_data, replica_record
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.layout import Pattern, Segment
from llm_planner.serving.plan_file import input_digest, save_serving_plan
from llm_planner.serving.workload import RequestShape, ServingWorkload

CLASS = "localhost/cpu-core"


def dev(i: int) -> str:
    return f"localhost/cpu-core:{i}"


def serving_plan(
    path: Path,
    model_dir: Path,
    replicas: list[dict],
    *,
    prompt_len: int = 6,
    output_len: int = 5,
    max_batched_tokens: int = 8,
    cluster: Path = LOCALHOST,
) -> Path:
    """replicas: [{"degrees": [k per stage], "layers": [...], "concurrency": C, "micro_batches": m,
    "devices": [[names of stage 0], ...], "classes": [class of each stage] (default: all CLASS), "attention":
    the stages' attention (default "tp"; "dp": data-parallel, experts split)}], one copy each."""
    workload = ServingWorkload(requests=(RequestShape(prompt_len=prompt_len, output_len=output_len),), tpot_slo_s=10.0)
    options = ServingOptions(allow_cpu=True, max_batched_tokens=max_batched_tokens)
    ctx = build_context(str(cluster), str(model_dir), workload, "fp32", options)
    records = []
    for r in replicas:
        classes = r.get("classes", [CLASS] * len(r["degrees"]))
        layout = tuple(Segment(c, k, 1, r.get("attention", "tp")) for c, k in zip(classes, r["degrees"]))
        ev = ctx.replica(layout).evaluate(tuple(r["layers"]), r["concurrency"], r["micro_batches"])
        records.append(replica_record(ctx, Pattern(layout=layout, ev=ev), 1, [r["devices"]]))
    model_sha256 = input_digest(str(Path(model_dir) / "config.json"), "model")
    data = fixed_plan_data(
        ctx, cluster=str(cluster), model_name=str(model_dir), model_sha256=model_sha256, records=records
    )
    save_serving_plan(data, path)
    return path


def greedy_whole(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens of the whole Hugging Face model, every step recomputed from the full sequence
    (no KV cache, no batching, no end-of-sequence stop)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            token = int(torch.argmax(model(ids).logits[0, -1].float()))
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]], device=device)], dim=1)
    return out


def check_tokens(config, report: dict, raw: dict, requests: int, prompt_len: int = 6, output_len: int = 5) -> None:
    """Every request of the run (report, and the ranks' raw record) served once, with the whole model's greedy
    tokens for its prompt (seeded weights and requests, seed 0, one request shape)."""
    config = gpt.prepare_config(config)
    whole = gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=None, seed=0))
    stream = RequestStream(LoadSpec(shapes=((prompt_len, output_len, 1.0),), vocab_size=config.vocab_size, seed=0))
    served = [r for rep in raw["replicas"] for r in rep["requests"]]
    assert sorted(r["index"] for r in served) == list(range(requests))
    for r in served:
        request = stream.request(r["index"])
        assert r["tokens"] == greedy_whole(whole, list(request.prompt), output_len), r["index"]
    assert report["total"]["requests_completed"] == requests
    assert report["total"]["output_tokens"] == output_len * requests
