"""The served replica's scheduler and front end, without torch or MPI: slots freed and reused, the
token budget, chunked prefill (decodes first), micro-batches, arrivals, and routing by shares."""

from __future__ import annotations

import pytest

from llm_planner.runtime.serve_dp import member_budget, member_slots
from llm_planner.runtime.serve_requests import LoadSpec, ReplicaQueue, RequestStream, route
from llm_planner.runtime.serve_scheduler import Entry, Scheduler, ServeError


def _scheduler(*, shapes=((6, 3, 1.0),), concurrency=2, micro_batches=1, budget=4, context=16, requests=5, rate=None):
    load = LoadSpec(shapes=shapes, vocab_size=50, seed=3, request_rate=rate)
    queue = ReplicaQueue(RequestStream(load), [1.0], 0, requests)
    return Scheduler(
        concurrency=concurrency,
        micro_batches=micro_batches,
        max_batched_tokens=budget,
        context_len=context,
        queue=queue,
    )


def _serve(sched: Scheduler, steps: int = 1000) -> list:
    """Run the scheduler to the end, answering every sampled token with 7; the iterations it built."""
    out = []
    for _ in range(steps):
        if sched.done:
            return out
        for j in range(sched.micro_batches):
            it = sched.next_iteration(j, 0.0)
            if it is not None:
                out.append(it)
                sched.apply_tokens(it, [7] * sum(e.sample for e in it.entries), 0.0)
    raise AssertionError("the scheduler did not finish")


def test_chunked_prefill_within_the_budget_then_decodes_first():
    sched = _scheduler(concurrency=2, budget=4)
    its = _serve(sched)
    # two prompts of 6 under a budget of 4: chunks 4 | 2 + 2 (the second prompt starts) | decode + 4 ...
    first = its[0]
    assert first.entries == (Entry(0, 0, 4, False),)
    assert its[1].entries == (Entry(0, 4, 2, True), Entry(1, 0, 2, False))
    assert its[2].entries[0] == Entry(0, 6, 1, True)  # the decode comes first
    assert its[2].entries[1] == Entry(1, 2, 3, False)  # the rest of the budget to the prompt
    assert all(it.num_tokens <= 4 for it in its)
    assert all(it.entries[: it.decodes] == tuple(e for e in it.entries if e.tokens == 1 and e.start >= 6) for it in its)


def test_finished_sequences_free_their_slots_for_the_next_requests():
    sched = _scheduler(concurrency=2, budget=16, requests=5)
    its = _serve(sched)
    assert sorted(s.request.index for s in sched.finished) == [0, 1, 2, 3, 4]
    assert all(len(s.generated) == 3 for s in sched.finished)
    slots = [s.slot for s in sorted(sched.finished, key=lambda s: s.request.index)]
    assert slots == [0, 1, 0, 1, 0]  # each new request takes a freed slot
    starts = [e for it in its for e in it.entries if e.start == 0]
    assert len(starts) == 5  # a reused slot is written from position 0
    assert not sched.running


def test_micro_batches_take_every_mth_slot():
    sched = _scheduler(concurrency=5, micro_batches=2, budget=64, requests=5)
    assert sched.slots(0) == [0, 2, 4] and sched.slots(1) == [1, 3]
    it0, it1 = sched.next_iteration(0, 0.0), sched.next_iteration(1, 0.0)
    assert [e.slot for e in it0.entries] == [0, 2, 4]
    assert [e.slot for e in it1.entries] == [1, 3]


def test_a_budget_below_the_concurrency_holds_prompts_back_until_decodes_finish():
    sched = _scheduler(shapes=((1, 4, 1.0),), concurrency=3, budget=2, requests=3)
    its = _serve(sched)
    assert max(it.num_tokens for it in its) == 2
    third = next(i for i, it in enumerate(its) if any(e.slot == 2 and e.start == 0 for e in it.entries))
    assert len([s for s in sched.finished if s.request.index < 2]) == 2
    assert all(e.slot != 2 for it in its[:third] for e in it.entries)
    assert sorted(s.request.index for s in sched.finished) == [0, 1, 2]


def test_a_request_longer_than_the_context_is_refused():
    sched = _scheduler(shapes=((10, 8, 1.0),), context=16)
    with pytest.raises(
        ServeError, match=r"request 0: 10 prompt \+ 8 output tokens = 18 exceed the plan's context of 16"
    ):
        sched.next_iteration(0, 0.0)


def test_open_loop_admits_a_request_once_it_has_arrived():
    sched = _scheduler(rate=10.0, requests=2)
    first = sched.queue.peek().arrival_s
    assert first > 0 and sched.waiting_for_arrival(0.0) == first
    assert sched.next_iteration(0, first / 2) is None
    assert sched.next_iteration(0, first) is not None


def test_tokens_must_match_the_sampling_entries():
    sched = _scheduler(shapes=((2, 2, 1.0),))
    it = sched.next_iteration(0, 0.0)
    with pytest.raises(ServeError, match="3 tokens came back for 2 sequences"):
        sched.apply_tokens(it, [1, 2, 3], 0.0)


def test_routing_follows_the_shares_and_the_stream_is_seeded():
    assert route([3.0, 1.0], 8).count(0) == 6
    assert route([1.0, 1.0, 2.0], 8) == [2, 0, 1, 2, 2, 0, 1, 2]
    load = LoadSpec(shapes=((4, 2, 1.0), (9, 1, 3.0)), vocab_size=10, seed=5, request_rate=2.0)
    a, b = RequestStream(load), RequestStream(load)
    assert [a.request(i) for i in range(20)] == [b.request(i) for i in range(20)]
    assert {len(a.request(i).prompt) for i in range(20)} == {4, 9}
    arrivals = [a.request(i).arrival_s for i in range(20)]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    queues = [ReplicaQueue(RequestStream(load), [1.0, 3.0], r, 8) for r in (0, 1)]
    taken = [[q.pop().index for _ in range(n)] for q, n in zip(queues, (2, 6))]
    assert sorted(taken[0] + taken[1]) == list(range(8))
    assert all(q.peek() is None for q in queues)


def test_closing_stops_admissions_and_lets_the_running_finish():
    sched = _scheduler(concurrency=2, budget=16, requests=None)
    first = sched.next_iteration(0, 0.0)
    sched.apply_tokens(first, [7, 7], 0.0)
    sched.closing = True
    _serve(sched)
    assert sorted(s.request.index for s in sched.finished) == [0, 1] and sched.done


def test_the_members_of_a_data_parallel_replica_take_its_requests_by_their_slots():
    """The replica's requests spread over its members by smooth weighted round-robin on their slots
    (member j of k holds C // k, the first C mod k one more), and each member has a k-th of the token
    budget rounded up."""
    load = LoadSpec(shapes=((4, 2, 1.0),), vocab_size=10, seed=5)
    replica_1 = [i for i, r in enumerate(route([1.0, 1.0], 24)) if r == 1]
    slots = tuple(member_slots(3, 2, j) for j in range(2))
    assert slots == (2, 1)
    members = [ReplicaQueue(RequestStream(load), [1.0, 1.0], 1, 24, member=j, member_weights=slots) for j in range(2)]
    taken = [[q.pop().index for _ in range(n)] for q, n in zip(members, (8, 4))]
    assert all(q.peek() is None for q in members)
    assert sorted(taken[0] + taken[1]) == replica_1
    assert [replica_1.index(i) % 3 for i in taken[1]] == [1] * 4  # every third of the replica's requests
    assert [member_slots(8, 4, j) for j in range(4)] == [2] * 4
    assert member_budget(2048, 3) == 683 and member_budget(8, 2) == 4
    with pytest.raises(ValueError, match="member 2 of 2"):
        ReplicaQueue(RequestStream(load), [1.0], 0, 4, member=2, member_weights=(1.0, 1.0))
