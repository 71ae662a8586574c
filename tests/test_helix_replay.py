"""The replay of Helix's engine (llm_planner.helix.replay): its arithmetic and batching by hand,
one query's trip on a machine by hand, the feeder's fullest layer, Helix's length files read as
data only, and plan-helix printing the replay beside its estimate."""

from __future__ import annotations

import heapq
import pickle
from collections import deque

import pytest
from test_helix_flow import A100, RANGES
from test_helix_plan import write_tables

from llm_planner.cli.main import main
from llm_planner.cost.serving_profile import LayerTable
from llm_planner.helix.engine import EngineTables
from llm_planner.helix.flow import SINK, SOURCE
from llm_planner.helix.inputs import HelixError
from llm_planner.helix.lengths import Lengths, find_helix_lengths, load_helix_lengths
from llm_planner.helix.model_card import model_card_path
from llm_planner.helix.plan import helix_candidates, load_inputs, plan_helix
from llm_planner.helix.replay import (
    Hop,
    ReplayGraph,
    ReplayMachine,
    _batch_end,
    _interpolate,
    _Machine,
    _Query,
    _Request,
    _Run,
    _take_batch,
    _uniform_bounds,
    replay,
)
from llm_planner.helix.replayed import REPLAY_SHARE, plan_by_replay, replay_plan

DECODE = LayerTable(sizes=(0, 2, 8), seconds=(0.0, 2e-3, 5e-3))
PROMPT = LayerTable(sizes=(0, 100, 1000), seconds=(0.0, 10e-3, 40e-3))
ACT = 1000.0


def _table(blocks: int = 1000, limit: int = 4, prompts: int = 1) -> EngineTables:
    return EngineTables(
        name="x", decode=DECODE, kv_blocks={2: blocks}, decode_limit={2: limit}, max_layers=2,
        prompt_requests={2: prompts},
    )  # fmt: skip


def _machine(**kw) -> ReplayMachine:
    return ReplayMachine(table=_table(**kw), prompt=PROMPT, first=0, layers=2)


def test_interpolation_as_helix():
    assert _interpolate(DECODE, 2, "t") == 2e-3  # a point: its value, exactly
    assert _interpolate(DECODE, 5, "t") == pytest.approx(3.5e-3)  # halfway between 2 and 8
    assert _interpolate(DECODE, 1, "t") == pytest.approx(1e-3)
    with pytest.raises(HelixError, match="t: a batch of 9 tokens is outside its rows 0..8"):
        _interpolate(DECODE, 9, "t")


def test_batch_time_by_hand():
    """Two layers; a lone decode is charged twice, the first layer adds the host's copy."""
    spec = _machine()
    query = _Query(prompt=100, output=5)
    lone = [_Request(query, False, 0.0)]
    host = 3 * ACT
    first = 2 * 1e-3 + host / 4e9 + host / 5e9
    assert _batch_end(spec, lone, 10.0, host) == pytest.approx(10.0 + first + 2e-3)
    mixed = [_Request(query, True, 0.0), _Request(query, False, 0.0), _Request(query, False, 0.0)]
    layer = 10e-3 + 2e-3  # prompt(100) + decode(2)
    assert _batch_end(spec, mixed, 0.0, 0.0) == pytest.approx(2 * layer)


def test_batch_takes_fifo_within_limits():
    """Prompt limit 1 (2,048 tokens), decode limit 2 with 2,000 tokens of context: later requests
    that fit are taken past one that does not."""
    machine = _Machine(_machine(limit=2, prompts=1))
    long_query, short_query = _Query(prompt=1500, output=9), _Query(prompt=200, output=9)
    long_query.made = 1
    waiting = [
        _Request(_Query(prompt=300, output=9), True, 0.0),  # a prompt: taken
        _Request(_Query(prompt=400, output=9), True, 0.0),  # a second prompt: over the limit of 1
        _Request(long_query, False, 0.0),  # 1,501 tokens of context: taken
        _Request(_Query(prompt=600, output=9), False, 0.0),  # 1,501 + 600 > 2,000: left
        _Request(short_query, False, 0.0),  # 1,501 + 200: taken (the second decode)
    ]
    machine.queue = deque(waiting)
    batch = _take_batch(machine)
    assert batch == [waiting[0], waiting[2], waiting[4]]
    assert list(machine.queue) == [waiting[1], waiting[3]]


def _one_machine_graph(blocks: int) -> ReplayGraph:
    node = "compute_node_2"
    hops = {
        SOURCE: {node: Hop(flow=100.0, bw=1e6, latency_s=1e-3, token_bytes=2)},
        node: {SINK: Hop(flow=100.0, bw=1e6, latency_s=2e-3, token_bytes=2)},
    }
    return ReplayGraph(machines={node: _machine(blocks=blocks)}, hops=hops, activation_bytes=ACT)


def test_one_query_trip_by_hand():
    """Room for one query only: 19 of the 20 opening queries find no machine under 85% of its
    expected KV and are dropped; the one left decodes alone, so every decode's trip is the links'
    latency and bytes plus one lone decode over both layers with one token's host copy."""
    # capacity 16 x 30 blocks x 2 layers = 960 token-layers; a query expects (100 + 240) x 2 = 680 of them
    found = replay(_one_machine_graph(blocks=30), Lengths((100,), (50,), source="test"), warm_up_s=0, window_s=5)
    assert found.dropped >= 19  # and each query the feeder adds while the first one runs
    lone = 2 * 1e-3 + ACT / 4e9 + ACT / 5e9 + 2 * 1e-3
    trip = (1e-3 + 2 / 1e6) + lone + (2e-3 + 2 / 1e6)
    assert found.trip_s == pytest.approx(trip)
    assert 0.5 < found.queries <= 1.0  # one at a time, each replaced 0.1 s after it ends


def test_feeder_reads_the_fullest_layer_over_its_machines():
    """Helix's feeder sums each layer's expected use over the machines holding it."""
    graph = _one_machine_graph(blocks=1000)
    other = ReplayMachine(table=_table(blocks=3000), prompt=PROMPT, first=0, layers=2)
    graph = ReplayGraph(machines={**graph.machines, "compute_node_3": other}, hops=graph.hops, activation_bytes=ACT)
    run = _Run(graph, (100.0, 50.0), 0.0, 1.0, 0)
    run.machines["compute_node_2"].kv_free = 0  # full
    # layer 0 and 1: (32,000 / 2) used of (32,000 + 96,000) / 2 -> 0.25, not the first machine's 1.0
    assert run._fullest_layer() == pytest.approx(0.25)


def test_uniform_lengths_keep_the_mean_within_helix_prompts():
    """Without Helix's trace, lengths are drawn uniformly with the means given, prompts within Helix's
    2,048 tokens; a mean no such draw can have is refused."""
    assert _uniform_bounds(100.0, 2048) == (1, 199)
    assert _uniform_bounds(1500.0, 2048) == (952, 2048)
    with pytest.raises(HelixError, match="a mean of 3000 tokens cannot be drawn within 1..2,048"):
        _uniform_bounds(3000.0, 2048)


def test_lengths_read_as_data_only(tmp_path):
    folder = tmp_path / "simulator" / "trace_generator" / "length_data"
    folder.mkdir(parents=True)
    (folder / "azure_conv_input.pkl").write_bytes(pickle.dumps([10, 20, 30]))
    (folder / "azure_conv_output.pkl").write_bytes(pickle.dumps([5, 6, 7]))
    assert find_helix_lengths(tmp_path / "simulator" / "model_manager" / "llama2_70b") == folder.resolve()
    lengths = load_helix_lengths(folder)
    assert lengths.prompts == (10, 20, 30) and lengths.means == (20.0, 6.0)
    (folder / "azure_conv_output.pkl").write_bytes(pickle.dumps([5, 6]))
    with pytest.raises(HelixError, match="holds 3 lengths"):
        load_helix_lengths(folder)
    (folder / "azure_conv_output.pkl").write_bytes(pickle.dumps(print))  # a reference to code: refused, not run
    with pytest.raises(HelixError, match="azure_conv_output.pkl: not a pickled list"):
        load_helix_lengths(folder)
    (folder / "azure_conv_output.pkl").write_bytes(pickle.dumps([5, "6", 7]))
    with pytest.raises(HelixError, match="expected a list of 1 to"):
        load_helix_lengths(folder)


def _write_statistics(folder) -> None:
    """Helix's routing statistics for the fixture's two types, and prompt profiles that reach a full
    prompt batch (2,048 tokens a prompt): with them the replay can run."""
    for gpu, rows in (("a100", "100,2\n200,5\n8192,200"), ("t4", "100,10\n300,40\n8192,1100")):
        (folder / gpu / "prompt_bs2time.csv").write_text(f"0,0\n{rows}\n")
    model_card_path(folder).write_text(
        "class S:\n    def __init__(self, n):\n"
        '        typical_layers_dict = {"A100": 4, "T4": 4}\n'
        "        if n:\n"
        '            typical_layers_dict = {"A100": 8, "T4": 4}\n'
        '        normalized_perf_dict = {"A100": 80, "T4": 12.5}\n'
    )


def test_plan_helix_prints_the_replay(tmp_path, capsys):
    cluster = write_tables(tmp_path)
    _write_statistics(tmp_path / "llama2_70b")
    layout = tmp_path / "layout.ini"
    ranges = {**RANGES, A100: (4, 12)}  # the model's 12 layers
    layout.write_text("[Solution]\n" + "".join(f"{n}={list(range(a, b))}\n" for n, (a, b) in ranges.items()))
    args = ["plan-helix", "--cluster", str(cluster), "--profiles", str(tmp_path / "llama2_70b"), "--model", "gpt2"]
    assert main([*args, "--score", str(layout), "--prompt-len", "100"]) == 0
    out = capsys.readouterr().out
    assert "replayed (Helix's engine" in out and "uniform draws, mean prompt 100" in out
    assert main([*args, "--score", str(layout), "--prompt-len", "100", "--no-replay"]) == 0
    assert "replayed" not in capsys.readouterr().out
    # a prompt profile that stops short of a full prompt batch: not replayed, the file named, the score stands
    (tmp_path / "llama2_70b" / "t4" / "prompt_bs2time.csv").write_text("0,0\n100,10\n300,40\n")
    assert main([*args, "--score", str(layout), "--prompt-len", "100"]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "estimated " in out and "not replayed: t4/prompt_bs2time.csv: its rows stop at 300 tokens" in out


@pytest.mark.heavy  # 6-7 s: CI's test command runs it after the default suite
def test_plan_chosen_by_the_replay_among_the_near_candidates(tmp_path, capsys):
    """plan-helix replays the candidates the routed estimate rates within REPLAY_SHARE of its best
    and keeps the one the replay rates highest; --no-replay keeps the routed choice."""
    cluster = write_tables(tmp_path)
    _write_statistics(tmp_path / "llama2_70b")
    inputs = load_inputs(cluster, None, tmp_path / "llama2_70b", "gpt2")
    candidates = helix_candidates(inputs, 100.0)
    top = max(c.estimate.tokens_per_s for c in candidates)
    near = [c for c in candidates if c.estimate.tokens_per_s >= REPLAY_SHARE * top]
    best = max(replay_plan(c, inputs, 100.0).estimate.tokens_per_s for c in near)
    plan, found = plan_by_replay(inputs, 100.0, "slow-ends", "ignore")
    assert found.estimate.tokens_per_s == best and found.candidates == len(near)
    assert (plan.stages, plan.machines) in [(c.stages, c.machines) for c in near]
    routed = max(candidates, key=lambda c: c.estimate.tokens_per_s)
    assert (plan_helix(inputs, 100.0).stages, plan_helix(inputs, 100.0).machines) == (routed.stages, routed.machines)
    args = ["plan-helix", "--cluster", str(cluster), "--profiles", str(tmp_path / "llama2_70b"), "--model", "gpt2"]
    assert main([*args, "--prompt-len", "100", "-o", str(tmp_path / "plan.ini")]) == 0
    assert f"estimated {best:.1f} decode tokens/s" in capsys.readouterr().out.replace("\n", " ")


def _decode(made: int = 0) -> _Request:
    query = _Query(prompt=100, output=50)
    query.path, query.made = [SOURCE, "compute_node_2", SINK], made
    return _Request(query, False, 0.0)


def test_a_request_arriving_as_a_batch_ends_joins_the_next_one():
    """Helix runs the events of one instant in the order they were made, and a machine starts in an
    event of its own: a request arriving at the instant the machine ends a batch joins the batch it
    starts next, beside what was already waiting."""
    run = _Run(_one_machine_graph(blocks=3000), (100.0, 50.0), 0.0, 10.0, 0)
    machine = run.machines["compute_node_2"]
    running, waiting, arriving = _decode(), _decode(), _decode()
    running.at = waiting.at = 1
    machine.busy, machine.queue = True, deque([waiting])
    run._at(1.0, run._done, "compute_node_2", [running])
    run._at(1.0, run._arrive, "compute_node_2", arriving)
    while run.events[0][0] <= 1.0:
        _, _, action, args = heapq.heappop(run.events)
        run.now = 1.0
        action(*args)
    started = [args[1] for _, _, action, args in run.events if action == run._done]
    assert started == [[waiting, arriving]] and not machine.queue


def test_a_link_sends_one_request_at_a_time():
    """Two requests sent together on one hop: the second leaves when the first one's bytes are out."""
    run = _Run(_one_machine_graph(blocks=3000), (100.0, 50.0), 0.0, 10.0, 0)
    first, second = _decode(), _decode()
    first.at = second.at = 1
    run._queue_send("compute_node_2", first)
    run._queue_send("compute_node_2", second)
    arrivals = sorted(when for when, _, action, _ in run.events if action == run._arrive)
    assert arrivals == pytest.approx([2e-3 + 2 / 1e6, 2e-3 + 2 * (2 / 1e6)])


def test_routing_skips_thin_edges_and_full_machines():
    """Interleaved weighted round robin over the hops, skipping those with under 5% of the node's
    flow and machines a query would take past 85% of their expected KV; none left: dropped."""
    node_a, node_b = "compute_node_2", "compute_node_3"
    hops = {
        SOURCE: {
            node_a: Hop(flow=100.0, bw=1e6, latency_s=1e-3, token_bytes=2),
            node_b: Hop(flow=4.0, bw=1e6, latency_s=1e-3, token_bytes=2),  # under 5% of 104
        },
        node_a: {SINK: Hop(flow=100.0, bw=1e6, latency_s=1e-3, token_bytes=2)},
        node_b: {SINK: Hop(flow=4.0, bw=1e6, latency_s=1e-3, token_bytes=2)},
    }
    graph = ReplayGraph(machines={node_a: _machine(blocks=30), node_b: _machine(blocks=3000)}, hops=hops,
                        activation_bytes=ACT)  # fmt: skip
    run = _Run(graph, (100.0, 50.0), 0.0, 10.0, 0)
    query = _Query(prompt=100, output=5)
    assert run._route(query) and query.path == [SOURCE, node_a, SINK]  # node_b's hop is too thin
    assert run.machines[node_a].kv_free == 16 * 30 * 2 - 340 * 2
    assert not run._route(_Query(prompt=100, output=5))  # node_a cannot take a second query; node_b is masked
    assert run.loads[SOURCE][node_a] == pytest.approx(100 / 100.0)  # the dropped query's load taken back
