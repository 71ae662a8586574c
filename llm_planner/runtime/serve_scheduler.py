"""Continuous batching with chunked prefill: the first stage's scheduler of one served replica.

Pure Python, no torch and no mpi4py (unit-tested on its own). The replica holds C sequences in
flight in C KV-cache slots (every stage preallocates them at the plan's context), cut into m
micro-batches: slot s belongs to micro-batch s mod m, so their sizes differ by at most one, as
the planner's replica model assumes (llm_planner.serving.replica). A micro-batch's iteration
walks every stage once; the scheduler builds it when the micro-batch's previous iteration has
come back with its tokens:

1. admission: each free slot of the micro-batch takes the next request routed to the replica
   that has arrived (llm_planner.runtime.serve_requests), unless the run is closing;
2. decodes first: every sequence of the micro-batch whose prompt is done feeds its last token;
3. prompt chunks: the sequences still in prefill, oldest first, each the rest of its prompt or
   what is left of the token budget (`max_batched_tokens` per iteration, decodes included),
   until the budget is spent (Sarathi-Serve's chunked prefill, vLLM's scheduler order).

The last stage samples a token for each decode and for each chunk that ends its prompt; a
sequence that has its `output_len` tokens is finished and frees its slot, which the next
admitted request reuses. Decodes never exceed the budget (a sequence starts decoding only after
its prompt fit beside the decodes before it), so a budget below the micro-batch's sequences holds
the others' prompts back until slots free up.
Requests generate exactly their output_len tokens (end-of-sequence ids do not stop them: the
load is the plan's workload, as serving benchmarks run it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_planner.runtime.serve_requests import ReplicaQueue, Request


class ServeError(ValueError):
    """A request or operating point the served replica cannot take; the message says why."""


@dataclass(frozen=True)
class Entry:
    """One sequence's part of an iteration: its slot, the position of its first token, its tokens,
    and whether the last stage samples a token after its last one."""

    slot: int
    start: int
    tokens: int
    sample: bool


@dataclass(frozen=True, kw_only=True)
class Iteration:
    micro_batch: int
    entries: tuple[Entry, ...]
    token_ids: tuple[int, ...]  # the entries' input ids, concatenated in entry order
    decodes: int  # the first `decodes` entries are decodes, the others prompt chunks

    @property
    def decode_only(self) -> bool:
        return self.decodes == len(self.entries)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Sequence:
    request: Request
    slot: int
    admitted_s: float
    prefilled: int = 0  # prompt tokens whose KV cache the stages hold
    generated: list[int] = field(default_factory=list)
    token_s: list[float] = field(default_factory=list)  # when each output token reached the first stage

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt)

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prompt_len


class Scheduler:
    def __init__(
        self, *, concurrency: int, micro_batches: int, max_batched_tokens: int, context_len: int, queue: ReplicaQueue
    ):
        if not 1 <= micro_batches <= concurrency:
            raise ServeError(f"micro-batches {micro_batches} must be from 1 to the concurrency {concurrency}")
        if max_batched_tokens < 1 or context_len < 1:
            raise ServeError("the token budget and the context must be at least one token")
        self.concurrency, self.micro_batches = concurrency, micro_batches
        self.budget, self.context_len, self.queue = max_batched_tokens, context_len, queue
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        self.order = 0  # admissions so far: prompt chunks go oldest first
        self._admitted: dict[int, int] = {}  # slot -> admission number
        self.finished: list[Sequence] = []
        self.closing = False  # no more admissions (the run's duration is over)

    def slots(self, micro_batch: int) -> list[int]:
        return list(range(micro_batch, self.concurrency, self.micro_batches))

    def _admit(self, micro_batch: int, now_s: float) -> None:
        for slot in self.slots(micro_batch):
            if slot in self.running or self.closing:
                continue
            head = self.queue.peek()
            if head is None or (head.arrival_s is not None and head.arrival_s > now_s):
                return
            request = self.queue.pop()
            need = len(request.prompt) + request.output_len
            if need > self.context_len:
                raise ServeError(
                    f"request {request.index}: {len(request.prompt)} prompt + {request.output_len} output tokens "
                    f"= {need} exceed the plan's context of {self.context_len} tokens per sequence"
                )
            self.running[slot] = Sequence(request=request, slot=slot, admitted_s=now_s)
            self._admitted[slot], self.order = self.order, self.order + 1

    def next_iteration(self, micro_batch: int, now_s: float) -> Iteration | None:
        """The micro-batch's next iteration (module docstring); None when it has nothing to run."""
        self._admit(micro_batch, now_s)
        mine = [self.running[s] for s in self.slots(micro_batch) if s in self.running]
        entries, ids = [], []
        for seq in mine:
            if not seq.in_prefill:
                entries.append(Entry(seq.slot, seq.prompt_len + len(seq.generated) - 1, 1, True))
                ids.append(seq.generated[-1])
        decodes = len(entries)
        left = self.budget - decodes
        for seq in sorted((s for s in mine if s.in_prefill), key=lambda s: self._admitted[s.slot]):
            if left <= 0:
                break
            n = min(seq.prompt_len - seq.prefilled, left)
            entries.append(Entry(seq.slot, seq.prefilled, n, seq.prefilled + n == seq.prompt_len))
            ids += seq.request.prompt[seq.prefilled : seq.prefilled + n]
            seq.prefilled += n
            left -= n
        if not entries:
            return None
        return Iteration(micro_batch=micro_batch, entries=tuple(entries), token_ids=tuple(ids), decodes=decodes)

    def apply_tokens(self, iteration: Iteration, tokens: list[int], now_s: float) -> list[Sequence]:
        """The sampled tokens (one per sampling entry, in order) of an iteration back at the first stage;
        returns the sequences this finished (their slots are free again)."""
        sampled = [e for e in iteration.entries if e.sample]
        if len(tokens) != len(sampled):
            raise ServeError(f"{len(tokens)} tokens came back for {len(sampled)} sequences that sample one")
        done = []
        for entry, token in zip(sampled, tokens):
            seq = self.running[entry.slot]
            seq.generated.append(int(token))
            seq.token_s.append(now_s)
            if len(seq.generated) == seq.request.output_len:
                done.append(self.running.pop(entry.slot))
                del self._admitted[entry.slot]
        self.finished += done
        return done

    def waiting_for_arrival(self, now_s: float) -> float | None:
        """When the next request arrives, if none is running and it has not arrived yet; else None."""
        head = None if self.closing else self.queue.peek()
        if self.running or head is None or head.arrival_s is None or head.arrival_s <= now_s:
            return None
        return head.arrival_s

    @property
    def done(self) -> bool:
        """Nothing running and nothing more to admit."""
        return not self.running and (self.closing or self.queue.peek() is None)
