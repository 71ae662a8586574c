"""Planning for Helix's engine (llm_planner.helix.engine, llm_planner.helix.plan; docs/helix.md):
its tables read from Helix's model files, the steady-state model by hand, the search over its
family, the layout it writes and its errors. Hand-written files in Helix's structure."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_helix import write_helix

from llm_planner.cli.main import main
from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.engine import (
    BLOCK_TOKENS,
    EXPECTED_OUTPUT,
    FEED_HWM,
    EngineTables,
    Network,
    Stage,
    estimate,
    load_engine_tables,
    queries_in_flight,
    stage_round_s,
)
from llm_planner.helix.inputs import HelixError, load_helix_cluster
from llm_planner.helix.layout_file import read_helix_layout
from llm_planner.helix.plan import HelixInputs, order_stages, plan_helix
from llm_planner.helix.search import Kind, best_stages, choices, count_layouts

# tables by layers held, as Helix writes them in <model>_<type>.py (the rest of that file is code we never run)
MODEL_PY = {
    "a100": "blocks = 1\nvllm_num_blocks_dict: Dict[int, int] = {{{kv}}}\ndecode_max_tokens_dict = {{{limit}}}\n",
    "t4": "vllm_num_blocks_dict: Dict[int, int] = {{{kv}}}\ndecode_max_tokens_dict: Dict[int, int] = {{{limit}}}\n",
}
KV = {
    "a100": {1: 4000, 2: 1800, 3: 1100, 4: 800, 5: 600, 6: 480, 7: 400, 8: 330},
    "t4": {1: 900, 2: 400, 3: 250, 4: 160},
}
LIMIT = {"a100": {layers: 10 for layers in KV["a100"]}, "t4": {layers: 8 for layers in KV["t4"]}}
NET = Network(latency_s=1e-3, bw_bytes_per_s=1e9, activation_bytes=1536)


def _pairs(table: dict[int, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in table.items())


def write_tables(tmp_path: Path) -> Path:
    cluster = write_helix(tmp_path)
    for kind, text in MODEL_PY.items():
        source = text.format(kv=_pairs(KV[kind]), limit=_pairs(LIMIT[kind]))
        (tmp_path / "llama2_70b" / kind / f"llama2_70b_{kind}.py").write_text(source)
    return cluster


def tables(tmp_path: Path) -> dict[str, EngineTables]:
    write_tables(tmp_path)
    return {kind: load_engine_tables(tmp_path / "llama2_70b", kind.upper()) for kind in KV}


def test_tables_read_from_helix_files(tmp_path):
    t = tables(tmp_path)
    assert t["a100"].kv_blocks == KV["a100"] and t["t4"].decode_limit == LIMIT["t4"]
    assert t["a100"].max_layers == 8 and t["t4"].max_layers == 4
    assert t["a100"].decode_s(3) == pytest.approx(1.25e-3)  # between rows 2 (1.0 ms) and 4 (1.5 ms)
    with pytest.raises(HelixError, match="past its table"):
        t["t4"].decode_s(9)


@pytest.mark.parametrize(
    "source, problem",
    [
        ("decode_max_tokens_dict = {1: 8}\n", "vllm_num_blocks_dict: missing"),
        ("vllm_num_blocks_dict = {1: 9, 3: 4}\ndecode_max_tokens_dict = {1: 8, 3: 8}\n", "for layers 1, 2, ..."),
        ("vllm_num_blocks_dict = {1: 'x'}\ndecode_max_tokens_dict = {1: 8}\n", "expected {layers: positive int}"),
        ("vllm_num_blocks_dict = {1: 9}\ndecode_max_tokens_dict = {1: 8, 2: 8}\n", "list different layers"),
        ("vllm_num_blocks_dict = {1: 9\n", "not valid Python"),
        ("vllm_num_blocks_dict = {[1]: 2}\ndecode_max_tokens_dict = {1: 8}\n", "expected {layers: positive int}"),
        ("vllm_num_blocks_dict = {1: 9}\nvllm_num_blocks_dict = {1: 8}\n", "assigned more than once (line 2)"),
        ("vllm_num_blocks_dict += {1: 9}\ndecode_max_tokens_dict = {1: 8}\n", "vllm_num_blocks_dict: missing"),
        ("vllm_num_blocks_dict = {1: 9}\ndecode_max_tokens_dict = {1: 50}\n", "a batch of 50 is past"),
    ],
)
def test_bad_table_files_name_file_and_field(tmp_path, source, problem):
    write_tables(tmp_path)
    path = tmp_path / "llama2_70b" / "t4" / "llama2_70b_t4.py"
    path.write_text(source)
    with pytest.raises(HelixError, match=re.escape(problem)) as info:
        load_engine_tables(tmp_path / "llama2_70b", "T4")
    assert str(path) in str(info.value)


def test_decode_table_from_batch_zero(tmp_path):
    write_tables(tmp_path)
    (tmp_path / "llama2_70b" / "t4" / "decode_bs2time.csv").write_text("4,1.0\n8,9.0\n")
    with pytest.raises(HelixError, match="the first row must be batch 0"):
        load_engine_tables(tmp_path / "llama2_70b", "T4")


def test_queries_in_flight_by_hand(tmp_path):
    t = tables(tmp_path)
    stages = [Stage("t4", 2, 3), Stage("a100", 1, 6)]
    # per stage: width x 16 tokens x blocks, over prompt + 240 tokens a query, 80% of the fullest
    by_hand = FEED_HWM * min(2 * BLOCK_TOKENS * 250, 1 * BLOCK_TOKENS * 480) / (100 + EXPECTED_OUTPUT)
    assert queries_in_flight(stages, t, prompt_len=100) == pytest.approx(by_hand)


def test_stage_round_by_hand(tmp_path):
    t = tables(tmp_path)
    # 26 queries over a width of 2: 13 each, one full batch of 8 (6.0 ms) and one of 5 (4.0 + 2 x 1/6 ms)
    # per layer, plus the bunch's first request alone twice (2 x 4.0 ms); 3 layers; then the hop out
    batches = 6.0e-3 + (4.0e-3 + 2.0e-3 * 3 / 6)
    by_hand = 3 * (batches + 2 * 2.0e-3) + 1e-3 + 13 * (1536 + 2) / 1e9
    assert stage_round_s(Stage("t4", 2, 3), t["t4"], 26, NET) == pytest.approx(by_hand)
    stages = [Stage("t4", 2, 3), Stage("a100", 1, 6)]
    est = estimate(stages, t, 100, NET)
    q = est.queries
    assert est.round_s == pytest.approx(1e-3 + sum(stage_round_s(s, t[s.kind], q, NET) for s in stages))
    assert est.tokens_per_s == pytest.approx(q / est.round_s)


def family(kinds: list[Kind], num_layers: int):
    """Every layout of the family, by brute force: each split of the layers, each type's choice."""
    per_kind = [
        [()] if n == 0 else [c.stages(k.name, n) for c in choices(k, n)] for k in kinds for n in range(num_layers + 1)
    ]
    width = num_layers + 1
    for split in itertools.product(range(width), repeat=len(kinds)):
        if sum(split) != num_layers:
            continue
        for parts in itertools.product(*(per_kind[i * width + n] for i, n in enumerate(split))):
            if any(parts):
                yield tuple(s for part in parts for s in part)


def test_choices_one_width_near_equal_counts(tmp_path):
    kind = Kind("t4", 4, tables(tmp_path)["t4"])  # at most 4 layers a machine
    got = [c.stages("t4", 6) for c in choices(kind, 6)]
    for stages in got:
        assert sum(s.layers for s in stages) == 6
        assert len({s.width for s in stages}) == 1 and len(stages) * stages[0].width <= 4
        assert max(s.layers for s in stages) - min(s.layers for s in stages) <= 1 and stages[0].layers <= 4
    # width 1 with 2, 3 or 4 stages; width 2 with 2 stages
    assert sorted((len(s), s[0].width) for s in got) == [(2, 1), (2, 2), (3, 1), (4, 1)]
    assert choices(kind, 17) == []


def test_order_puts_the_slowest_at_both_ends(tmp_path):
    t = tables(tmp_path)
    stages = (Stage("a100", 1, 4), Stage("t4", 1, 2), Stage("a100", 1, 4), Stage("t4", 1, 2))
    assert [s.kind for s in order_stages(stages, t)] == ["t4", "a100", "a100", "t4"]


def test_plan_is_the_best_of_its_family(tmp_path):
    cluster_path = write_tables(tmp_path)
    t = tables(tmp_path)
    cluster = load_helix_cluster(cluster_path)  # 1 A100, 2 T4
    inputs = HelixInputs(cluster=cluster, tables=t, num_layers=10, network=NET)
    plan = plan_helix(inputs, prompt_len=100)
    kinds = [Kind("a100", 1, t["a100"]), Kind("t4", 2, t["t4"])]
    values = [estimate(list(stages), t, 100, NET).tokens_per_s for stages in family(kinds, 10)]
    assert len(values) == count_layouts(kinds, 10) <= plan.layouts  # plus one chain per type (test_helix_chains)
    assert plan.estimate.tokens_per_s >= max(values) * (1 - 1e-12)
    if len(plan.chain_sizes) == 1:
        assert plan.estimate.tokens_per_s == pytest.approx(max(values))
    ranges = read_helix_layout(plan.layout_text(inputs))
    assert sum(s.layers for s in plan.stages) == 10
    assert sorted(ranges) == sorted(n for nodes in plan.machines for n in nodes)


@st.composite
def engine_kinds(draw):
    """Two or three machine types with drawn profiles, KV tables (blocks falling with the layers
    held) and decode limits."""
    kinds = []
    for i in range(draw(st.integers(2, 3))):
        top = draw(st.integers(1, 4))
        steps = draw(st.lists(st.floats(0.1, 5.0), min_size=3, max_size=3))
        decode = LayerTable(
            sizes=(0, 1, 8, 32), seconds=(0.0, steps[0] * 1e-3, (steps[0] + steps[1]) * 1e-3, sum(steps) * 1e-3)
        )
        blocks = sorted(draw(st.lists(st.integers(5, 400), min_size=top, max_size=top)), reverse=True)
        limit = draw(st.integers(1, 32))
        table = EngineTables(
            name=f"k{i}",
            decode=decode,
            kv_blocks={layers: b for layers, b in enumerate(blocks, start=1)},
            decode_limit={layers: limit for layers in range(1, top + 1)},
            max_layers=top,
        )
        kinds.append(Kind(f"k{i}", draw(st.integers(1, 4)), table))
    return kinds


@settings(max_examples=40, deadline=None)
@given(kinds=engine_kinds(), num_layers=st.integers(1, 7), prompt_len=st.floats(1.0, 200.0))
def test_search_equals_brute_force(kinds, num_layers, prompt_len):
    t = {k.name: k.table for k in kinds}
    values = [estimate(list(s), t, prompt_len, NET).tokens_per_s for s in family(kinds, num_layers)]
    found = best_stages(kinds, num_layers, prompt_len, NET)
    assert count_layouts(kinds, num_layers) == len(values)
    if not values:
        assert found is None
        return
    assert estimate(list(found), t, prompt_len, NET).tokens_per_s == pytest.approx(max(values), rel=1e-9)


def test_plan_helix_cli_writes_a_layout(tmp_path, capsys):
    cluster = write_tables(tmp_path)
    out = tmp_path / "layout.ini"
    args = ["plan-helix", "--cluster", str(cluster), "--profiles", str(tmp_path / "llama2_70b"), "-o", str(out)]
    assert main([*args, "--model", "gpt2"]) == 0  # 12 layers
    ranges = read_helix_layout(out.read_text())
    assert {end for _, end in ranges.values()} >= {12}
    assert "decode tokens/s" in capsys.readouterr().out
    # LLaMA-2 70B's 80 layers do not fit 8 + 4 + 4
    assert main(args) == 2
    assert "cannot hold the model's 80 layers" in capsys.readouterr().err
    for bad in ("0", "0.5", "inf", "nan", "1e12"):  # 1e12 tokens had planned 0 tokens/s
        assert main([*args, "--model", "gpt2", "--prompt-len", bad]) == 2
        assert "--prompt-len" in capsys.readouterr().err


def test_plan_helix_cli_missing_tables_exit_2(tmp_path, capsys):
    cluster = write_helix(tmp_path)  # csvs only, no <model>_<type>.py
    args = ["plan-helix", "--cluster", str(cluster), "--profiles", str(tmp_path / "llama2_70b"), "--model", "gpt2"]
    assert main([*args, "-o", str(tmp_path / "layout.ini")]) == 2
    err = capsys.readouterr().err
    assert "expected one <model>_<type>.py" in err and "a100" in err


def test_score_reads_a_layout_back_as_stages(tmp_path, capsys):
    cluster = write_tables(tmp_path)
    out = tmp_path / "layout.ini"
    base = ["plan-helix", "--cluster", str(cluster), "--profiles", str(tmp_path / "llama2_70b"), "--model", "gpt2"]
    assert main([*base, "-o", str(out)]) == 0
    planned = capsys.readouterr().out.split("estimated ")[1].split(" decode")[0]
    assert main([*base, "--score", str(out)]) == 0  # the model's value of the layout it wrote
    assert f"estimated {planned} decode" in capsys.readouterr().out
    # what Helix refuses (more layers than its type's max_num_layers, no chain of ranges over the model)
    names = ("compute_node_2", "compute_node_3", "compute_node_4")  # T4, A100, T4
    mixed = "[Solution]\n" + "\n".join(f"{n}={list(range(12))}" for n in names) + "\n"
    gap = f"[Solution]\n{names[0]}={list(range(4))}\n{names[1]}={list(range(5, 12))}\n"
    deep = f"[Solution]\n{names[0]}={list(range(6))}\n{names[1]}={list(range(6, 12))}\n"  # T4 tables stop at 4
    for text, problem in (
        (mixed, "compute_node_2 (T4) holds 12 layers (0-11); Helix lets a machine of its type hold at most 4"),
        (gap, "no chain of ranges covers layers 0..11"),
        (deep, "compute_node_2 (T4) holds 6 layers (0-5); Helix lets a machine of its type hold at most 4"),
        ("[Solution]\n", "no machine holds any layer"),
    ):
        (tmp_path / "bad.ini").write_text(text)
        assert main([*base, "--score", str(tmp_path / "bad.ini")]) == 2
        err = capsys.readouterr().err
        assert problem in err and "bad.ini" in err


def test_fast_first_order(tmp_path):
    t = tables(tmp_path)
    stages = (Stage("t4", 1, 2), Stage("a100", 1, 4), Stage("t4", 1, 2))
    assert [s.kind for s in order_stages(stages, t, "fast-first")] == ["a100", "t4", "t4"]


def test_a_chain_of_one_type_puts_fewer_layers_first_under_either_order(tmp_path):
    t = tables(tmp_path)
    stages = (Stage("t4", 1, 3), Stage("t4", 1, 3), Stage("t4", 1, 2), Stage("t4", 1, 2))
    for order in ("slow-ends", "fast-first"):
        assert [s.layers for s in order_stages(stages, t, order)] == [2, 2, 3, 3]
