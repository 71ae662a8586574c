"""Tensor-parallel decoder shares in one process: k members run as threads whose collectives
meet at a barrier; their greedy tokens must equal the whole model's `generate`."""

from __future__ import annotations

import threading

import pytest
import torch
from runtime_fixtures import tiny_gpt2, tiny_llama

from llm_planner.runtime import gpt, tp_layers
from llm_planner.runtime.decoder_tasks import DecoderError


class ThreadGroup:
    """Collectives among k threads (one per member): what GroupComm does over MPI."""

    def __init__(self, k: int):
        self.size, self.slots, self.barrier = k, [None] * k, threading.Barrier(k, timeout=60)
        self.counts = [{"all_reduce": 0, "all_gather": 0} for _ in range(k)]

    def member(self, index: int):
        group = self

        class Member:
            size = group.size

            def __init__(self):
                self.index = index

            def _exchange(self, t):
                group.slots[index] = t.clone()
                group.barrier.wait()
                every = list(group.slots)
                group.barrier.wait()
                return every

            def all_reduce_(self, t):
                group.counts[index]["all_reduce"] += 1
                every = self._exchange(t)
                total = every[0].clone()
                for part in every[1:]:
                    total += part
                return t.copy_(total)

            def all_gather(self, t):
                group.counts[index]["all_gather"] += 1
                return torch.stack(self._exchange(t))

        return Member()


def _generate_on_group(config, prompts, steps, k, seed=0, checkpoint=None):
    """Every task of the model on one group of k members (threads): member 0's tokens, the collective counts,
    the weight sources."""
    config = gpt.prepare_config(config)
    sources = []
    group, tasks = ThreadGroup(k), gpt.decoder_tasks(gpt.num_layers_of(config))
    out, errors = [None] * k, []

    def member(index: int) -> None:
        try:
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
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
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
    assert counts[0] == {"all_reduce": 8 * (1 + 2 * 4), "all_gather": 8}


@pytest.mark.parametrize("k", [2])
def test_llama_with_grouped_kv_heads_on_a_group_matches_generate(k):
    config = tiny_llama()  # 4 heads, 2 KV heads: each member holds one KV head for two query heads
    tokens, _, _ = _generate_on_group(config, PROMPTS, 8, k)
    assert tokens == _whole(config, PROMPTS, 8)
    assert len({tuple(t) for t in tokens}) > 1


def test_uneven_vocabulary_splits_and_ties_pick_the_first_index():
    assert [tp_layers.even_range(127, 2, i) for i in range(2)] == [(0, 63), (63, 127)]
    config = tiny_gpt2(vocab_size=127, eos_token_id=126)
    tokens, _, _ = _generate_on_group(config, PROMPTS, 6, 2)
    assert tokens == _whole(config, PROMPTS, 6)


def test_a_group_that_cannot_split_the_heads_is_refused():
    config = gpt.prepare_config(tiny_gpt2(n_head=2))
    with pytest.raises(DecoderError, match="cannot split heads 2"):
        tp_layers.check_divisible(config, "gpt2", 4)


def test_causal_mask_hides_future_and_padded_keys():
    mask = tp_layers.causal_mask(torch.tensor([[0, 1, 1]]), 2, 3, torch.float32, torch.device("cpu"))
    visible = (mask == 0)[0, 0].tolist()
    assert visible == [[False, True, False], [False, True, True]]
    assert tp_layers.causal_mask(None, 1, 5, torch.float32, torch.device("cpu")) is None


def test_members_read_their_slices_of_a_checkpoint(tmp_path):
    from transformers import LlamaForCausalLM

    config = gpt.prepare_config(tiny_llama(num_hidden_layers=2))
    torch.manual_seed(3)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "ckpt")
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
