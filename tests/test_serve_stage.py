"""The served stage in one process: batched attention over slots (decodes batched, prompt chunks
causal, sequences of different lengths side by side) gives every request the whole model's greedy
tokens, whole or split into two stages, from seeded weights or a checkpoint, for dense models and
mixtures of experts (transformers' own MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM)."""

from __future__ import annotations

import pytest
import torch
from runtime_fixtures import tiny_gpt2, tiny_llama, tiny_mixtral, tiny_qwen2_moe, tiny_qwen3, tiny_qwen3_moe
from serve_fixtures import greedy_whole

from llm_planner.runtime import gpt
from llm_planner.runtime.serve_graphs import Pieces, capture_refusal, size_for
from llm_planner.runtime.serve_requests import LoadSpec, ReplicaQueue, RequestStream
from llm_planner.runtime.serve_scheduler import Entry, Scheduler
from llm_planner.runtime.serve_stage import ServeStage, attend, index_of

SHAPES = ((9, 6, 1.0), (3, 8, 1.0), (1, 5, 1.0))  # prompts of 9, 3 and 1 tokens: chunks, decodes and a lone token
CONTEXT = 24


def _stages(
    config, splits: list[tuple[int, int]], slots: int, checkpoint: str | None = None, context: int = CONTEXT
) -> list[ServeStage]:
    source = gpt.weight_source(config, checkpoint=checkpoint, seed=0)
    return [
        ServeStage(
            config,
            first_layer=a,
            num_layers=n,
            slots=slots,
            context_len=context,
            device=torch.device("cpu"),
            dtype=torch.float32,
            source=source,
        )
        for a, n in splits
    ]


def _serve(
    stages, *, concurrency: int, micro_batches: int, budget: int, requests: int, context: int = CONTEXT
) -> Scheduler:
    load = LoadSpec(shapes=SHAPES, vocab_size=128, seed=1)
    queue = ReplicaQueue(RequestStream(load), [1.0], 0, requests)
    sched = Scheduler(
        concurrency=concurrency,
        micro_batches=micro_batches,
        max_batched_tokens=budget,
        context_len=context,
        queue=queue,
    )
    with torch.no_grad():
        while not sched.done:
            for j in range(micro_batches):
                it = sched.next_iteration(j, 0.0)
                if it is None:
                    continue
                value = torch.tensor(it.token_ids)
                for stage in stages:
                    value = stage.run(it.entries, value)
                sched.apply_tokens(it, value.tolist(), 0.0)
    return sched


@pytest.mark.parametrize(
    "make, split",
    [
        (tiny_gpt2, False),
        (tiny_llama, True),
        (tiny_qwen3, True),
        (tiny_mixtral, True),
        pytest.param(tiny_qwen2_moe, False, marks=pytest.mark.slow),  # their layers: tests/test_serve_moe.py
        pytest.param(tiny_qwen3_moe, True, marks=pytest.mark.slow),
    ],
    ids=["gpt2", "llama", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"],
)
def test_every_request_gets_the_whole_models_greedy_tokens(make, split, tmp_path):
    """On seeded weights in one stage, or split in two with the weights read from a checkpoint that
    transformers saved (the experts one tensor each)."""
    config = gpt.prepare_config(make())
    layers = gpt.num_layers_of(config)
    whole = gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=None, seed=0))
    checkpoint = None
    if split:
        whole.save_pretrained(tmp_path / "ckpt")
        checkpoint = str(tmp_path / "ckpt")
    splits = [(0, 2), (2, layers - 2)] if split else [(0, layers)]
    stages = _stages(config, splits, slots=3, checkpoint=checkpoint)
    sched = _serve(stages, concurrency=3, micro_batches=2, budget=5, requests=6)
    assert len(sched.finished) == 6
    for seq in sched.finished:
        assert seq.generated == greedy_whole(whole, list(seq.request.prompt), seq.request.output_len), seq.request


def test_a_window_that_holds_every_context_serves_the_whole_models_tokens():
    """Mixtral sliding a window as long as the longest request (9 + 6 tokens): the stage's full
    attention gives the tokens of transformers' windowed model (llm_planner.graph.attention_window);
    a context longer than the window is refused before anything runs."""
    config = gpt.prepare_config(tiny_mixtral())
    config.sliding_window = max(p + o for p, o, _ in SHAPES)
    whole = gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=None, seed=0))
    stages = _stages(config, [(0, gpt.num_layers_of(config))], slots=3, context=config.sliding_window)
    sched = _serve(stages, concurrency=3, micro_batches=1, budget=5, requests=3, context=config.sliding_window)
    for seq in sched.finished:
        assert seq.generated == greedy_whole(whole, list(seq.request.prompt), seq.request.output_len), seq.request
    config.sliding_window = 4  # the reference does slide its window: a short one changes the tokens
    short = gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=None, seed=0))
    longest = max(sched.finished, key=lambda seq: len(seq.request.prompt))
    assert greedy_whole(short, list(longest.request.prompt), 6) != longest.generated
    with pytest.raises(gpt.DecoderError, match="sliding_window 4 < a context of 24 tokens"):
        _stages(config, [(0, 1)], slots=1)


def test_batched_decode_attention_equals_each_sequence_alone():
    """Hidden keys add nothing: a decode batched with longer sequences attends as it would alone."""
    torch.manual_seed(0)
    heads, kv, d, slots = 4, 2, 8, 3
    cache = [torch.zeros(slots, kv, CONTEXT, d) for _ in range(2)]
    for c in cache:
        c[:, :, :10] = torch.randn(slots, kv, 10, d)
    entries = (Entry(0, 9, 1, True), Entry(2, 2, 1, True), Entry(1, 4, 1, True))
    q, k, v = torch.randn(3, heads, d), torch.randn(3, kv, d), torch.randn(3, kv, d)
    cpu = torch.device("cpu")
    together = attend(q, k, v, cache[0].clone(), cache[1].clone(), index_of(entries, cpu), heads // kv)
    for i, e in enumerate(entries):
        one = index_of((e,), cpu)
        alone = attend(q[i : i + 1], k[i : i + 1], v[i : i + 1], cache[0].clone(), cache[1].clone(), one, heads // kv)
        assert torch.allclose(together[i], alone[0], atol=1e-6)


def test_prompt_chunks_of_one_shape_attend_together_as_each_would_alone():
    """Two chunks of 3 tokens from position 4 are one batch (a PromptGroup); a third of another shape
    and a decode are not in it; each row equals its entry attended alone."""
    torch.manual_seed(0)
    heads, kv, d, slots, rep = 4, 2, 8, 4, 2
    cache = [torch.zeros(slots, kv, CONTEXT, d) for _ in range(2)]
    for c in cache:
        c[:, :, :10] = torch.randn(slots, kv, 10, d)
    entries = (Entry(0, 4, 3, True), Entry(3, 9, 1, True), Entry(2, 4, 3, False), Entry(1, 0, 2, True))
    tokens = sum(e.tokens for e in entries)
    q, k, v = torch.randn(tokens, heads, d), torch.randn(tokens, kv, d), torch.randn(tokens, kv, d)
    cpu = torch.device("cpu")
    index = index_of(entries, cpu, rep)
    assert [tuple(g.rows.shape) for g in index.prompts] == [(2, 3), (1, 2)]
    together = attend(q, k, v, cache[0].clone(), cache[1].clone(), index, rep)
    at = 0
    for e in entries:
        rows = slice(at, at + e.tokens)
        alone = attend(q[rows], k[rows], v[rows], cache[0].clone(), cache[1].clone(), index_of((e,), cpu, rep), rep)
        assert torch.allclose(together[rows], alone, atol=1e-6), e
        at += e.tokens


@pytest.mark.parametrize(
    "make, max_tokens",
    [(tiny_gpt2, 5), (tiny_llama, 5), (tiny_qwen3, 3)],
    ids=["gpt2", "llama", "qwen3-some-iterations-eager"],
)
def test_the_pieces_between_attentions_give_the_whole_models_greedy_tokens(make, max_tokens):
    """llm_planner.runtime.serve_graphs run as plain calls (no CUDA here): each stage's iterations go
    through the static buffers, padded to their capture size; an iteration larger than the buffers
    (5 tokens, 3 rows) runs eagerly instead."""
    config = gpt.prepare_config(make())
    layers = gpt.num_layers_of(config)
    whole = gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=None, seed=0))
    stages = _stages(config, [(0, 2), (2, layers - 2)], slots=3)
    runners = [Pieces(stage, max_tokens, capture=False) for stage in stages]
    sched = _serve(runners, concurrency=3, micro_batches=2, budget=5, requests=6)
    assert len(sched.finished) == 6
    for seq in sched.finished:
        assert seq.generated == greedy_whole(whole, list(seq.request.prompt), seq.request.output_len), seq.request
    assert all(size <= max_tokens for r in runners for size in r.sizes)
    assert any(size < max_tokens for size in runners[0].sizes)  # some iterations were padded to a smaller size


def test_capture_sizes_hold_the_iteration_within_the_buffers():
    assert [size_for(t, 300) for t in (1, 3, 5, 8, 9, 250, 257, 300)] == [1, 4, 8, 8, 16, 256, 272, 300]
    assert size_for(301, 300) is None
    assert size_for(10**6, 10**7) is None  # past the largest size: eager


def test_a_stage_that_cannot_be_captured_says_why():
    config = gpt.prepare_config(tiny_llama())
    (stage,) = _stages(config, [(0, gpt.num_layers_of(config))], slots=2)
    assert capture_refusal(stage) == "the stage runs on cpu, not CUDA"
    with pytest.raises(ValueError, match="CUDA graphs: the stage runs on cpu"):
        Pieces(stage, 8, capture=True)
    plain = Pieces(stage, 8, capture=False)
    assert plain.capture_all() == 4 and plain.sizes == [1, 2, 4, 8]
