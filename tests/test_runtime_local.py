"""The runtime's pieces in one process (no MPI): decoder stages against `generate`,
weights from seeds and checkpoints, the fx graph split, request splitting."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_fixtures import tiny_gpt2, tiny_llama, tiny_qwen3

from llm_planner.runtime import gpt
from llm_planner.runtime import graph as rg
from llm_planner.runtime.weights import CheckpointWeights, SeededWeights, WeightsError


def _pipeline_tokens(config, source, cuts: list[int], prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Generate by running the chain cut at `cuts` as separate DecoderShards, stage after stage."""
    tasks = gpt.decoder_tasks(config.num_hidden_layers)
    bounds = [0, *cuts, len(tasks)]
    stages = [tasks[a:b] for a, b in zip(bounds, bounds[1:])]
    shards = [
        gpt.DecoderShard(config, set(s), device=torch.device("cpu"), dtype=torch.float32, source=source) for s in stages
    ]
    eos, pad = gpt.special_tokens(config)
    ids, mask = gpt.pad_prompts(prompts, gpt.prompt_pad_id(config))
    streams = [
        sh.new_stream(requests=list(range(len(prompts))), prompt_ids=ids, prompt_mask=mask, eos_ids=eos, pad_id=pad)
        for sh in shards
    ]
    value = ids
    with torch.no_grad():
        for step in range(steps):
            for shard, stage, stream in zip(shards, stages, streams):
                value = shard.run_stage(stage, value, stream, step)
    return streams[-1].tokens()


@pytest.mark.parametrize(
    "make, cuts, prompts",
    [
        (tiny_gpt2, [1, 4], [[5, 6, 7], [1, 2, 3]]),  # embed alone, blocks 0-2, then block 3 + head
        (tiny_gpt2, [3, 6], [[5, 6, 7, 9, 10], [1, 2]]),  # left padding
        (tiny_llama, [2, 5, 7], [[5, 6, 7, 8, 9, 10], [1, 2, 3]]),  # final_norm and lm_head apart
        (tiny_qwen3, [3, 5], [[5, 6, 7, 8], [1, 2, 3]]),  # q and k norms on each head
    ],
)
def test_stages_generate_the_tokens_of_the_whole_model(make, cuts, prompts):
    config = gpt.prepare_config(make())
    source = gpt.weight_source(config, checkpoint=None, seed=3)
    expected = gpt.generate_whole(gpt.build_whole_model(config, source), config, prompts, 10)
    assert _pipeline_tokens(config, source, cuts, prompts, 10) == expected
    assert any(len(set(row)) > 1 for row in expected)  # a model that repeats one token would prove little


def test_eos_stops_a_request_and_pads_after_it():
    config = gpt.prepare_config(tiny_llama())
    source = gpt.weight_source(config, checkpoint=None, seed=3)
    model = gpt.build_whole_model(config, source)
    prompts = [[5, 6, 7], [9, 9, 4]]
    first = gpt.generate_whole(model, config, prompts, 1)
    eos_config = gpt.prepare_config(tiny_llama(eos_token_id=first[0][0]))  # request 0 ends at once
    expected = gpt.generate_whole(gpt.build_whole_model(eos_config, source), eos_config, prompts, 6)
    assert expected[0] == [first[0][0]]
    assert _pipeline_tokens(eos_config, source, [3], prompts, 6) == expected


def test_seeded_weights_depend_on_name_and_seed_only():
    a = SeededWeights(seed=1, std=0.1)
    w = a.tensor("model.layers.0.mlp.up_proj.weight", torch.Size([4, 3]))
    assert torch.equal(
        w, SeededWeights(seed=1, std=0.1).tensor("model.layers.0.mlp.up_proj.weight", torch.Size([4, 3]))
    )
    assert not torch.equal(w, a.tensor("model.layers.1.mlp.up_proj.weight", torch.Size([4, 3])))
    assert not torch.equal(
        w, SeededWeights(seed=2, std=0.1).tensor("model.layers.0.mlp.up_proj.weight", torch.Size([4, 3]))
    )
    assert torch.equal(a.tensor("x.bias", torch.Size([3])), torch.zeros(3))
    assert torch.equal(a.tensor("x.ln_1.weight", torch.Size([3])), torch.ones(3))


def test_checkpoint_shard_reads_its_tensors_and_matches_the_saved_model(tmp_path):
    from transformers import GPT2LMHeadModel

    config = gpt.prepare_config(tiny_gpt2())
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path)
    source = gpt.weight_source(config, checkpoint=str(tmp_path), seed=0)
    shard = gpt.DecoderShard(
        config, {"block.2", "lm_head"}, device=torch.device("cpu"), dtype=torch.float32, source=source
    )
    assert torch.equal(shard.modules["transformer.h.2"].attn.c_attn.weight, model.transformer.h[2].attn.c_attn.weight)
    assert torch.equal(shard.modules["lm_head"].weight, model.transformer.wte.weight)  # tied: read under wte's name
    assert set(shard.modules) == {"transformer.h.2", "lm_head"}


def test_checkpoint_errors_name_the_directory_and_tensor(tmp_path):
    with pytest.raises(WeightsError, match="no model.safetensors"):
        CheckpointWeights(tmp_path)
    from safetensors.torch import save_file

    save_file({"a.weight": torch.zeros(2, 3)}, str(tmp_path / "model.safetensors"))
    weights = CheckpointWeights(tmp_path)
    with pytest.raises(WeightsError, match="no tensor 'b.weight'"):
        weights.tensor("b.weight", torch.Size([2, 3]))
    with pytest.raises(WeightsError, match=r"shape \(2, 3\), the model expects \(3, 2\)"):
        weights.tensor("a.weight", torch.Size([3, 2]))


def test_decoder_task_check_refuses_other_models_and_sublayer_plans():
    gpt.check_decoder_tasks(gpt.decoder_tasks(3), 3, source="p.yaml")
    with pytest.raises(
        gpt.DecoderError, match=r"p.yaml: the plan does not match the model \(4 decoder blocks\).*'block.3'"
    ):
        gpt.check_decoder_tasks(gpt.decoder_tasks(3), 4, source="p.yaml")
    with pytest.raises(gpt.DecoderError, match="sublayer"):
        gpt.check_decoder_tasks(["embed", "block.0.attn", "block.0.mlp", "final_norm", "lm_head"], 1, source="p.yaml")


# ----------------------------------------------------------------------------
# fx graph split


class _Diamond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(4, 4) for _ in range(3))
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        a = torch.relu(self.a(x))
        b = self.b(a) * self.scale  # a get_attr node read by one stage
        return self.c(a + b), b.sum()


def test_a_device_whose_tasks_would_cycle_between_ranks_gets_two_stages():
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(_Diamond())
    names = [n.name for n in gm.graph.nodes if n.op not in ("get_attr",)]
    assignment = {n: 0 for n in names} | {"b": 1, "mul": 1}  # x, a, relu on 0 -> b, mul on 1 -> add, c on 0
    split = rg.split_graph(gm, assignment)
    assert [(s.owner, s.level) for s in split.stages] == [(0, 0), (1, 1), (0, 2)]
    assert split.stages[1].inputs == ("relu",) and "scale" in split.stages[1].nodes
    x = torch.randn(3, 4)
    got, want = rg.run_split_locally(gm, split, x), gm(x)
    assert all(torch.allclose(g, w) for g, w in zip(got, want))


def test_check_assignment_names_missing_and_unknown_tasks():
    gm = torch.fx.symbolic_trace(_Diamond())
    assignment = {n.name: 0 for n in gm.graph.nodes if n.op != "get_attr"}
    rg.check_assignment(gm, assignment, source="p.yaml")
    with pytest.raises(
        rg.GraphPlanError, match=r"p.yaml: .*1 node\(s\) not placed \['add'\], 1 task\(s\) not in the model \['zzz'\]"
    ):
        rg.check_assignment(gm, {k: v for k, v in assignment.items() if k != "add"} | {"zzz": 0}, source="p.yaml")


@pytest.fixture(scope="module")
def small_rwnn():
    from llm_planner.graph import rwnn_torch

    _, gm, graph, example = rwnn_torch.build_rwnn("rwnn-ws-2x6", seed=0, channels=8, image_size=16, dtype="fp32")
    x = rg.make_batch(example, 2, seed=1)
    with torch.no_grad():
        return gm, graph, x, gm(x)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_assignment_splits_into_a_dag_that_computes_the_model(small_rwnn, data):
    gm, graph, x, expected = small_rwnn
    assignment = {t.name: data.draw(st.integers(0, 2), label=t.name) for t in graph.tasks}
    split = rg.split_graph(gm, assignment)
    stage_of = {n: i for i, s in enumerate(split.stages) for n in s.nodes}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(split.stages)))
    for i, s in enumerate(split.stages):
        assert all(assignment[n] == s.owner for n in s.nodes)
        for name in s.inputs:
            if name in stage_of:
                assert split.stages[stage_of[name]].level < s.level
                quotient.add_edge(stage_of[name], i)
    assert nx.is_directed_acyclic_graph(quotient)
    with torch.no_grad():
        assert torch.allclose(rg.run_split_locally(gm, split, x), expected, atol=1e-6)


def test_rank_stats_keep_the_first_stop():
    """A graph run stops its clock before gathering its outputs; the rank's later stop must not move it."""
    import time

    from llm_planner.runtime.run_report import RankStats

    stats = RankStats(rank=0, device="localhost/cpu-core:0", torch_device="cpu")
    stats.start()
    stats.stop()
    first = stats.total_s
    time.sleep(0.01)
    stats.stop()
    assert stats.total_s == first


def test_ranks_spin_while_waiting_only_when_their_host_has_a_core_for_each():
    from llm_planner.runtime.comm import spins_while_waiting
    from llm_planner.runtime.rank import ranks_on_host
    from llm_planner.runtime.table import RankEntry, RankTable, RunSpec

    hosts = ["a", "a", "b", "a"]
    table = RankTable(
        ranks=tuple(
            RankEntry(
                rank=i, device=f"n/cpu:{i}", node="n", hostname=h, device_type="cpu", gpu_index=None, tasks={"0": ["t"]}
            )
            for i, h in enumerate(hosts)
        ),
        run=RunSpec(plan_path="p.yaml", workload="graph", workdir=".", report_path="r.json", timeout_s=1.0),
    )
    assert spins_while_waiting(ranks_on_host=2, cores=2) and spins_while_waiting(ranks_on_host=1, cores=16)
    assert not spins_while_waiting(ranks_on_host=4, cores=2)
    assert (ranks_on_host(table, "a"), ranks_on_host(table, "b"), ranks_on_host(table, "c")) == (3, 1, 0)
