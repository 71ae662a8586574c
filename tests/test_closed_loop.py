"""The closed-loop benchmark simulation (llm_planner.serving.closed_loop) by hand on small instances,
on a replica, and through `score --closed-loop`."""

from __future__ import annotations

import json

import pytest
from conftest import SPECS
from serving_fixtures import workload

from llm_planner.cli.main import main
from llm_planner.serving.closed_loop import closed_loop
from llm_planner.serving.context import ServingOptions, build_context
from llm_planner.serving.layout import Segment
from llm_planner.serving.score import closed_loop_of

FOUR_GPUS = str(SPECS / "four-gpus.yaml")
REPLICA = "1 x server/a100-80g"


def test_one_request_at_a_time_with_a_fixed_iteration():
    """C = 1, every iteration 10 ms: the prompt's iteration yields the first token (TTFT 10 ms), three
    decode iterations the other three (TPOT 10 ms), 40 ms a request."""
    got = closed_loop(
        lambda d, q: 0.010, concurrency=1, prompt_len=10, output_len=4, token_budget=100, chunked_prefill=True
    )
    assert (got.requests, got.iterations) == (3, 12)
    assert got.ttft_s == pytest.approx(0.010) and got.tpot_s == pytest.approx(0.010)
    assert got.tokens_per_s == pytest.approx(3 * 4 / 0.120)


def test_a_prompt_longer_than_the_budget_goes_in_chunks():
    """Budget 4, prompt 10, iteration 1 s + 1 s a prompt token: chunks of 4, 4, 2 (5 + 5 + 3 s) yield
    the first token at 13 s, one decode iteration (1 s) the second; each request takes 14 s."""
    got = closed_loop(
        lambda d, q: 1.0 + q, concurrency=1, prompt_len=10, output_len=2, token_budget=4, chunked_prefill=True, rounds=2
    )
    assert got.iterations == 8
    assert (got.ttft_s, got.tpot_s) == pytest.approx((13.0, 1.0))
    assert got.tokens_per_s == pytest.approx(2 * 2 / 28.0)


def test_whole_prompts_wait_for_room_and_decodes_count_in_the_budget():
    """Budget 15, prompts of 10 whole, iteration 1 s + 0.1 s a prompt token: the second prompt does
    not fit beside the first (10 + 10 > 15) and goes next, beside the first's decode (1 + 10 <= 15):
    first tokens at 2 and 4 s, ends at 4 and 6 s; TTFT (2 + 4) / 2, TPOT 2 s each."""
    got = closed_loop(
        lambda d, q: 1.0 + 0.1 * q,
        concurrency=2,
        prompt_len=10,
        output_len=2,
        token_budget=15,
        chunked_prefill=False,
        rounds=1,
    )
    assert (got.ttft_s, got.tpot_s) == pytest.approx((3.0, 2.0))
    assert got.tokens_per_s == pytest.approx(4 / 6.0)


def test_a_whole_prompt_over_the_budget_goes_alone():
    got = closed_loop(
        lambda d, q: 1.0, concurrency=1, prompt_len=50, output_len=1, token_budget=8, chunked_prefill=False
    )
    assert (got.ttft_s, got.requests, got.iterations) == (1.0, 3, 3)


def test_a_burst_of_prompts_lands_in_the_ttft_not_the_tpot():
    """Four requests of long prompts and whole prefill in one iteration (budget 1000): each round's
    prompts run in one 10 s iteration, then 9 decode iterations of 1 s. TTFT is the burst's 10 s,
    TPOT the decode iteration's 1 s, where the steady state would spread the prompts' time over the
    TPOT of every sequence."""
    got = closed_loop(
        lambda d, q: 1.0 if q == 0 else 10.0,
        concurrency=4,
        prompt_len=200,
        output_len=10,
        token_budget=1000,
        chunked_prefill=False,
    )
    assert (got.ttft_s, got.tpot_s) == pytest.approx((10.0, 1.0))
    assert got.tokens_per_s == pytest.approx(4 * 10 / 19.0)


def test_the_budget_decides_whether_the_bursts_persist():
    """Four 200-token prompts whole, iteration 1 s + 10 ms a prompt token. Budget 1000: the burst runs
    in one 9 s iteration, the four end together and every round's TTFT is the burst's. Budget 410: two
    prompts an iteration (the second pair beside the first's two decodes, 402 tokens), first tokens
    at 5 and 10 s (TTFT 7.5 s); the pairs end an iteration apart, and each next pair runs in one 5 s
    iteration of its own: round 2's TTFT is 5 s, so two rounds average 6.25 s."""

    def run(budget: int, rounds: int):
        return closed_loop(
            lambda d, q: 1.0 + 0.01 * q,
            concurrency=4,
            prompt_len=200,
            output_len=10,
            token_budget=budget,
            chunked_prefill=False,
            rounds=rounds,
        )

    assert [run(1000, r).ttft_s for r in (1, 2, 3)] == pytest.approx([9.0, 9.0, 9.0])
    assert [run(410, r).ttft_s for r in (1, 2)] == pytest.approx([7.5, 6.25])


def test_a_front_end_passes_requests_on_one_at_a_time():
    """Two requests sent at once through a front end of 0.5 s a request, iteration 1 s, 2 tokens each:
    they reach the engine at 0.5 and 1 s. The engine idles to 0.5 s and starts the first (first token
    1.5 s), the second beside its decode (2.5 s), then decodes the second alone to 3.5 s, the first's
    next request still at the front end. TTFT (1.5 + 2.5) / 2, TPOT 1 s, 4 tokens in 3.5 s; with no
    front end both run in the first iteration and end at 2 s."""
    args = {"concurrency": 2, "prompt_len": 10, "output_len": 2, "token_budget": 100, "chunked_prefill": False}
    got = closed_loop(lambda d, q: 1.0, rounds=1, front_end_s=0.5, **args)
    assert (got.ttft_s, got.tpot_s, got.tokens_per_s, got.iterations) == pytest.approx((2.0, 1.0, 4 / 3.5, 3))
    direct = closed_loop(lambda d, q: 1.0, rounds=1, **args)
    assert (direct.ttft_s, direct.tokens_per_s) == pytest.approx((1.0, 2.0))


def test_a_front_end_spreads_a_burst_into_cohorts():
    """100 requests of 200 tokens under a 16,384-token budget, an iteration 8 ms + 40 us a decode + 24
    us a prompt token: straight in, each round's prompts come as a burst (81 in one iteration, 19 in
    the next) and the TTFT is about a burst's (0.37 s); through a front end of 4 ms a request they reach the engine over
    0.4 s, each iteration takes those there by its start, the later ones wait less for the prompts
    ahead of them (0.23 s), and prompts now share iterations with decodes (the TPOT rises)."""

    def run(front_end_s: float):
        return closed_loop(
            lambda d, q: 0.008 + 4e-5 * d + 2.4e-5 * q,
            concurrency=100,
            prompt_len=200,
            output_len=200,
            token_budget=16384,
            chunked_prefill=False,
            front_end_s=front_end_s,
        )

    burst, spread = run(0.0), run(0.004)
    assert burst.ttft_s == pytest.approx(0.366, abs=0.001) and spread.ttft_s == pytest.approx(0.234, abs=0.001)
    assert spread.tpot_s > burst.tpot_s and spread.iterations > burst.iterations


def test_past_the_memory_cap_requests_wait_in_the_engine_queue():
    """Four requests sent at once, room for two (max_running 2), iteration 1 s, 3 tokens each: two run
    (first tokens at 1 s, ends at 3 s); the other two wait and start as those end (first tokens at 4
    s, TTFT 4 s; ends at 6 s). TTFT (1 + 1 + 4 + 4) / 4, TPOT 1 s, 12 tokens in 6 s."""
    got = closed_loop(
        lambda d, q: 1.0,
        concurrency=4,
        prompt_len=10,
        output_len=3,
        token_budget=1000,
        chunked_prefill=False,
        rounds=1,
        max_running=2,
    )
    assert (got.ttft_s, got.tpot_s, got.tokens_per_s) == pytest.approx((2.5, 1.0, 2.0))
    assert (got.iterations, got.max_running) == (6, 2)
    free = closed_loop(
        lambda d, q: 1.0, concurrency=4, prompt_len=10, output_len=3, token_budget=1000, chunked_prefill=False
    )
    assert free.max_running == 4 and free.ttft_s == pytest.approx(1.0)


def test_a_prompt_in_chunks_keeps_its_room():
    """Room for one, budget 4, prompts of 6 in chunks: the second request waits for the first to end,
    then runs its chunks alone. Iteration 1 s: first tokens at 2 s and 5 s (TTFT 3.5 s), ends at 3 and 6 s."""
    got = closed_loop(
        lambda d, q: 1.0,
        concurrency=2,
        prompt_len=6,
        output_len=2,
        token_budget=4,
        chunked_prefill=True,
        rounds=1,
        max_running=1,
    )
    assert (got.ttft_s, got.tpot_s, got.tokens_per_s) == pytest.approx((3.5, 1.0, 4 / 6))


def test_no_more_sequences_run_than_the_budget_has_tokens():
    """Budget 1: one sequence at a time, 16,384 sent at once. Iterations of 1 ms: request k has its
    first token at 2k + 1 ms and ends 1 ms later, so TTFT is the mean of 2k + 1 over k (16.384 s), TPOT
    1 ms, 1,000 tokens/s; the waiting queue of requests all there is walked once an iteration, not
    once a request (seconds, not minutes)."""
    got = closed_loop(
        lambda d, q: 1e-3, concurrency=16384, prompt_len=1, output_len=2, token_budget=1, chunked_prefill=True, rounds=1
    )
    assert (got.max_running, got.requests) == (1, 16384)
    assert (got.ttft_s, got.tpot_s, got.tokens_per_s) == pytest.approx((16.384, 1e-3, 1000.0))


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"prompt_len": 0},
        {"output_len": 0},
        {"token_budget": 0},
        {"max_running": 0},
        {"front_end_s": -1.0},
    ],
)
def test_an_empty_loop_is_refused(bad):
    args = {"concurrency": 1, "prompt_len": 1, "output_len": 1, "token_budget": 1, "chunked_prefill": True, **bad}
    with pytest.raises(ValueError, match="at least one"):
        closed_loop(lambda d, q: 1.0, **args)


def test_on_a_replica_a_pure_decode_iteration_is_the_decode_step():
    """ReplicaModel.iteration_s with no prompt tokens is the model's decode step; a closed loop of
    one request whose prompt is one token decodes at it."""
    ctx = build_context(FOUR_GPUS, "gpt2", workload(1, 64), "fp16", ServingOptions())
    model = ctx.replica((Segment("server/a100-80g", 1, 1),))
    assert model.iteration_s((12,), 16, 0.0) == pytest.approx(model.decode_step_s((12,), 16, 1), rel=1e-12)
    got = closed_loop_of(ctx, model, (12,), 1)
    assert got.tpot_s == pytest.approx(model.iteration_s((12,), 1, 0.0), rel=1e-12)
    assert got.ttft_s == pytest.approx(model.iteration_s((12,), 0, 1.0), rel=1e-12)


def test_score_closed_loop_json_and_table(capsys):
    argv = ["score", "--cluster", FOUR_GPUS, "--model", "gpt2", "--replica", REPLICA, "--concurrency", "32"]
    argv += ["--prompt-len", "512", "--output-len", "64", "--closed-loop"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    loop = got["closed_loop"]
    assert set(loop) == {"tpot_s", "tokens_per_s", "ttft_s", "requests", "iterations", "max_running", "front_end_s"}
    assert (loop["requests"], loop["max_running"]) == (96, 32)
    assert loop["ttft_s"] > got["ttft_s"] and loop["tpot_s"] < got["tpot_s"]  # the burst's prompts wait together
    assert main(argv) == 0
    assert "closed loop (96 requests, all 32 sent at once" in capsys.readouterr().out


def test_one_output_token_has_no_tpot(capsys):
    """With one output token a request there is no time between tokens: the loop's TPOT is null in
    the JSON and said so in the text, where its TTFT and tokens/s stand."""
    argv = ["score", "--cluster", FOUR_GPUS, "--model", "gpt2", "--replica", REPLICA, "--concurrency", "8"]
    argv += ["--prompt-len", "512", "--output-len", "1", "--closed-loop"]
    assert main([*argv, "--json"]) == 0
    loop = json.loads(capsys.readouterr().out)["closed_loop"]
    assert loop["tpot_s"] is None and loop["ttft_s"] > 0 and loop["tokens_per_s"] > 0
    assert main(argv) == 0
    assert "TPOT none (one output token a request)" in " ".join(capsys.readouterr().out.split())


def test_score_closed_loop_past_memory_queues_what_memory_cannot_hold(capsys):
    """Llama-2 7B on one A100 80GB holds 30 contexts of 4,000 tokens: the steady state is refused at 64
    (naming --closed-loop), the closed loop runs 30 at a time and the other 34 wait, so its TTFT is
    most of a request's time while its TPOT is the 30's."""
    argv = ["score", "--cluster", FOUR_GPUS, "--model", "llama2-7b", "--replica", REPLICA, "--concurrency", "64"]
    argv += ["--prompt-len", "2000", "--output-len", "2000"]
    assert main(argv) == 2
    assert "or --closed-loop for what an engine does" in capsys.readouterr().err
    assert main([*argv, "--closed-loop", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    loop = got["closed_loop"]
    assert (got["concurrency"], got["admitted"], loop["max_running"]) == (64, 30, 30)
    assert loop["ttft_s"] > 1000 * loop["tpot_s"] and loop["tpot_s"] == pytest.approx(got["tpot_s"], rel=0.05)
    assert main([*argv, "--concurrency", "30", "--closed-loop", "--json"]) == 0  # 30 fit: nothing queues
    alone = json.loads(capsys.readouterr().out)
    assert (alone["admitted"], alone["closed_loop"]["max_running"]) == (30, 30)
    assert main([*argv, "--concurrency", "31", "--closed-loop"]) == 0
    assert "31 sent, 30 in flight" in capsys.readouterr().out.replace("\n", " ")


def test_score_closed_loop_through_a_front_end(capsys):
    """`--front-end-s` reaches the simulation (the JSON states it, the TTFT of one request grows by it)
    and applies to --closed-loop only; a negative time is refused by argparse."""
    argv = ["score", "--cluster", FOUR_GPUS, "--model", "gpt2", "--replica", REPLICA, "--concurrency", "1"]
    argv += ["--prompt-len", "64", "--output-len", "16", "--closed-loop", "--json"]
    loops = []
    for extra in ([], ["--front-end-s", "0.004"]):
        assert main([*argv, *extra]) == 0
        loops.append(json.loads(capsys.readouterr().out)["closed_loop"])
    assert (loops[0]["front_end_s"], loops[1]["front_end_s"]) == (0.0, 0.004)
    assert loops[1]["ttft_s"] == pytest.approx(loops[0]["ttft_s"] + 0.004, rel=1e-9)
    assert main([a for a in argv if a != "--closed-loop"] + ["--front-end-s", "0.004"]) == 2
    assert "--front-end-s: the front end's time is simulated in a closed loop" in capsys.readouterr().err
    assert main([*argv, "--front-end-s", "-1"]) == 2
    assert "--front-end-s: must be a number of seconds from 0" in capsys.readouterr().err


def test_score_closed_loop_refuses_micro_batches_and_several_shapes(tmp_path, capsys):
    argv = ["score", "--cluster", FOUR_GPUS, "--model", "gpt2", "--replica", REPLICA, "--concurrency", "8"]
    assert main([*argv, "--prompt-len", "64", "--output-len", "64", "--closed-loop", "--micro-batches", "2"]) == 2
    assert "--closed-loop runs one micro-batch" in capsys.readouterr().err
    shapes = tmp_path / "w.yaml"
    shapes.write_text("requests:\n  - {prompt_len: 64, output_len: 32}\n  - {prompt_len: 128, output_len: 64}\n")
    assert main([*argv, "--workload", str(shapes), "--closed-loop"]) == 2
    assert "one shape; the workload has 2" in capsys.readouterr().err
