"""Tensor-parallel decoder shares in one process: k members run as threads whose collectives
meet at a barrier; their greedy tokens must equal the whole model's `generate`."""

from __future__ import annotations

import pytest
import torch
from runtime_fixtures import ThreadGroup, tiny_gpt2, tiny_llama, tiny_qwen3

from llm_planner.graph import hf_config
from llm_planner.graph.tp_layout import even_range, task_layout
from llm_planner.runtime import gpt, tp_layers
from llm_planner.runtime.decoder_tasks import DecoderError


def _generate_on_group(config, prompts, steps, k, seed=0, checkpoint=None):
    """Every task of the model on one group of k members (threads): member 0's tokens, the collective counts,
    the weight sources."""
    config = gpt.prepare_config(config)
    sources = []
    group, tasks = ThreadGroup(k), gpt.decoder_tasks(gpt.num_layers_of(config))
    out = [None] * k

    def member(index: int) -> None:
        source = gpt.weight_source(config, checkpoint=checkpoint, seed=seed)
        sources.append(source)
        shard = gpt.DecoderShard(
            config,
            set(tasks),
            device=torch.device("cpu"),
            dtype=torch.float32,
            source=source,
            group=group.member(index),
        )
        eos, pad = gpt.special_tokens(config)
        ids, mask = gpt.pad_prompts(prompts, gpt.prompt_pad_id(config))
        stream = shard.new_stream(
            requests=list(range(len(prompts))), prompt_ids=ids, prompt_mask=mask, eos_ids=eos, pad_id=pad
        )
        value = ids
        with torch.no_grad():
            for step in range(steps):
                value = shard.run_stage(tasks, value, stream, step)
        out[index] = stream.tokens()

    group.run(member)
    assert all(o == out[0] for o in out), "members disagree"
    return out[0], group.counts, sources


def _whole(config, prompts, steps, seed=0):
    config = gpt.prepare_config(config)
    return gpt.generate_whole(
        gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=None, seed=seed)), config, prompts, steps
    )


PROMPTS = [[5, 6, 7, 9, 10], [1, 2], [3, 4, 5]]  # uneven: left padding and a 2D mask


@pytest.mark.parametrize("k", [2, 4])
def test_gpt2_on_a_group_matches_generate(k):
    config = tiny_gpt2()
    tokens, counts, _ = _generate_on_group(config, PROMPTS, 8, k)
    assert tokens == _whole(config, PROMPTS, 8)
    # per step: embed 1 all-reduce, each block 2, lm_head one all-gather (the planner's tp_allreduces / tp_allgathers)
    assert counts[0] == {"all_reduce": 8 * (1 + 2 * 4), "all_gather": 8, "reduce_scatter": 0}


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen3], ids=["llama", "qwen3-qk-norm"])
@pytest.mark.parametrize("k", [2])
def test_llama_with_grouped_kv_heads_on_a_group_matches_generate(k, make):
    config = make()  # 4 heads, 2 KV heads: each member holds one KV head for two query heads
    tokens, _, _ = _generate_on_group(config, PROMPTS, 8, k)
    assert tokens == _whole(config, PROMPTS, 8)
    assert len({tuple(t) for t in tokens}) > 1


def test_uneven_vocabulary_splits_and_ties_pick_the_first_index():
    assert [even_range(127, 2, i) for i in range(2)] == [(0, 63), (63, 127)]
    config = tiny_gpt2(vocab_size=127, eos_token_id=126)
    tokens, _, _ = _generate_on_group(config, PROMPTS, 6, 2)
    assert tokens == _whole(config, PROMPTS, 6)


def test_a_group_that_cannot_split_the_heads_is_refused():
    config = hf_config.from_hf_config(tiny_gpt2(n_head=2))
    with pytest.raises(DecoderError, match="cannot split heads 2"):
        tp_layers.check_divisible(config, 4)


def test_causal_mask_hides_future_and_padded_keys():
    mask = tp_layers.causal_mask(torch.tensor([[0, 1, 1]]), 2, 3, torch.float32, torch.device("cpu"))
    visible = (mask == 0)[0, 0].tolist()
    assert visible == [[False, True, False], [False, True, True]]
    assert tp_layers.causal_mask(None, 1, 5, torch.float32, torch.device("cpu")) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: tiny_llama(num_hidden_layers=2),
        lambda: tiny_gpt2(n_layer=2),  # q, k, v in one (in, out) Conv1D with their biases
        lambda: tiny_llama(num_hidden_layers=2, attention_bias=True, mlp_bias=True),
    ],
    ids=["llama", "gpt2", "llama-biases"],
)
def test_members_read_their_slices_of_a_checkpoint(make, tmp_path):
    """A checkpoint's biases are not zero (the seeded source's are): a member that read the wrong part of a
    fused or transposed tensor, or of a bias, would change the tokens."""
    from transformers import AutoModelForCausalLM

    config = gpt.prepare_config(make())
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.5)
    model.save_pretrained(tmp_path / "ckpt")
    tokens, _, sources = _generate_on_group(config, PROMPTS, 6, 2, checkpoint=str(tmp_path / "ckpt"))
    whole = gpt.build_whole_model(config, gpt.weight_source(config, checkpoint=str(tmp_path / "ckpt"), seed=0))
    assert tokens == gpt.generate_whole(whole, config, PROMPTS, 6)
    assert all(s.summary()["source"] == "checkpoint" for s in sources)


def test_a_checkpoint_slice_is_the_rows_of_the_whole_tensor(tmp_path):
    from safetensors.torch import save_file

    from llm_planner.runtime.weights import CheckpointWeights, WeightsError

    whole = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    save_file({"w": whole}, str(tmp_path / "model.safetensors"))
    weights = CheckpointWeights(tmp_path)
    assert torch.equal(weights.tensor_slice("w", torch.Size([6, 4]), 0, 2, 5), whole[2:5])
    assert torch.equal(weights.tensor_slice("w", torch.Size([6, 4]), 1, 1, 3), whole[:, 1:3])
    with pytest.raises(WeightsError, match=r"shape \(6, 4\), the model expects \(4, 6\)"):
        weights.tensor_slice("w", torch.Size([4, 6]), 0, 0, 2)


class Recorder:
    """Member `index` of a group of `size`, alone: its collectives return its own part (as profiling's
    Unconnected) and are recorded as (op, bytes) the way GroupComm counts them."""

    def __init__(self, size: int, index: int):
        self.size, self.index, self.calls = size, index, []

    def all_reduce_(self, t):
        self.calls.append(("all_reduce", t.numel() * t.element_size()))
        return t

    def all_gather(self, t):
        self.calls.append(("all_gather", t.numel() * 4))  # float32, as GroupComm sends it
        return t.to(torch.float32).expand(self.size, *t.shape)


def _whole_model_names(config) -> set[str]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return set(AutoModelForCausalLM.from_config(config).state_dict())


@pytest.mark.parametrize(
    "make",
    [
        tiny_gpt2,
        tiny_llama,
        lambda: tiny_gpt2(vocab_size=127, eos_token_id=126),  # uneven vocabulary ranges
        lambda: tiny_llama(attention_bias=True, mlp_bias=True),  # column-split and replicated biases
    ],
    ids=["gpt2", "llama-gqa", "gpt2-vocab-127", "llama-biases"],
)
def test_members_hold_and_send_what_the_layout_declares(make):
    """For each member of a group of 2 and each task it shares: the tensors it reads have the declared
    member shapes and are tensors of the whole model; its share holds exactly the declared elements;
    one call of the task on a batch of 3 prompts of 5 tokens makes the declared collectives, in order,
    with the declared bytes (the layout the planner costs, llm_planner.graph.tp_layout)."""
    hf = gpt.prepare_config(make())
    cfg, family, batch, tokens, k = hf_config.from_hf_config(hf), gpt.family_of(hf), 3, 5, 2
    names = _whole_model_names(hf)
    for index in range(k):
        ops = Recorder(k, index)
        source = gpt.weight_source(hf, checkpoint=None, seed=0)
        shard = gpt.DecoderShard(
            hf,
            {"embed", "block.0", "lm_head"},
            device=torch.device("cpu"),
            dtype=torch.float32,
            source=source,
            group=ops,
        )
        assert set(source.tensors_read) <= names
        ids = torch.arange(batch * tokens).reshape(batch, tokens) % cfg.vocab_size
        stream = shard.new_stream(requests=[0, 1, 2], prompt_ids=ids, prompt_mask=None, eos_ids=[], pad_id=0)
        value = ids
        for task, kind in (("embed", "embed"), ("block.0", "block"), ("lm_head", "lm_head")):
            layout = task_layout(cfg, kind)
            fresh = gpt.weight_source(hf, checkpoint=None, seed=0)
            held = tp_layers.member_tensors(task, cfg, family, k, index, fresh, dtype=torch.float32, device="cpu")
            assert {n: tuple(t.shape) for n, t in held.items()} == {
                w.name: w.member_shape(k, index) for w in layout.weights
            }
            assert sum(p.numel() for p in shard.parts[task].parameters()) == layout.member_elements(k, index)
            ops.calls.clear()
            with torch.no_grad():
                value = shard.run_stage([task], value, stream, 0)
            positions = 1 if layout.last_position_only else tokens
            assert ops.calls == [(c.op, c.bytes_per_position(4) * positions * batch) for c in layout.collectives]
