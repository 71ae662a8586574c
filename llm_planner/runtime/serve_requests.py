"""The requests a served plan answers, and which replica answers each (the front end).

Pure data, no torch and no mpi4py: the launcher checks the load with it, the first stage of every
replica draws its requests from it.

Request i of a run is a pure function of (seed, i):

    shape        one of the plan's request shapes (prompt_len, output_len), drawn by weight
    prompt ids   prompt_len token ids, uniform in [0, vocab), from Random((seed, i))
    arrival      closed loop: none (admitted as soon as its replica has a free slot);
                 open loop at rate R: t_i = t_{i-1} + Exp(R) from Random((seed, "arrivals")),
                 a Poisson process of R requests/s over the whole cluster

and the front end routes request i to a replica by the plan's shares (each replica's predicted
tokens/s over the total): smooth weighted round-robin (nginx's rule: every request adds each
replica's share to its credit, the largest credit takes the request and pays 1), so after n
requests every replica has taken within one request of n times its share. Every replica's first
stage computes the same stream and takes the requests routed to it in order: no rank waits on a
front-end process, and a run is reproducible from its seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Request:
    index: int  # the request's number in the run (over all replicas)
    prompt: tuple[int, ...]
    output_len: int
    arrival_s: float | None  # seconds after the run's start (open loop); None: closed loop


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    """What the front end sends: request shapes with weights, the vocabulary, the seed and the rate."""

    shapes: tuple[tuple[int, int, float], ...]  # (prompt_len, output_len, weight)
    vocab_size: int
    seed: int
    request_rate: float | None = None  # requests/s over the cluster (open loop); None: closed loop


class Router:
    """Smooth weighted round-robin over the replicas' shares (module docstring)."""

    def __init__(self, shares: list[float] | tuple[float, ...]):
        if not shares or min(shares) <= 0:
            raise ValueError(f"replica shares must be positive, got {list(shares)}")
        total = sum(shares)
        self.weights = [s / total for s in shares]
        self.credit = [0.0] * len(shares)

    def next(self) -> int:
        self.credit = [c + w for c, w in zip(self.credit, self.weights)]
        best = max(range(len(self.credit)), key=lambda r: (self.credit[r], -r))
        self.credit[best] -= 1.0
        return best


def route(shares: list[float] | tuple[float, ...], count: int) -> list[int]:
    """The replica of each of the first `count` requests."""
    router = Router(shares)
    return [router.next() for _ in range(count)]


class RequestStream:
    """Request i of the run (module docstring), made on demand and in order."""

    def __init__(self, load: LoadSpec):
        self.load = load
        self._weights = [w for _, _, w in load.shapes]
        self._arrivals: list[float] = []
        self._clock = random.Random(f"{load.seed}/arrivals")

    def request(self, i: int) -> Request:
        rng = random.Random(f"{self.load.seed}/{i}")
        prompt_len, output_len, _ = rng.choices(self.load.shapes, weights=self._weights)[0]
        prompt = tuple(rng.randrange(self.load.vocab_size) for _ in range(prompt_len))
        return Request(index=i, prompt=prompt, output_len=output_len, arrival_s=self.arrival_s(i))

    def arrival_s(self, i: int) -> float | None:
        rate = self.load.request_rate
        if rate is None:
            return None
        while len(self._arrivals) <= i:
            last = self._arrivals[-1] if self._arrivals else 0.0
            self._arrivals.append(last - math.log(1.0 - self._clock.random()) / rate)
        return self._arrivals[i]


class ReplicaQueue:
    """The requests routed to one replica, in order, up to `max_requests` over the run (None: no limit);
    with `member_weights`, those of one data-parallel member of the replica: the replica's requests
    spread over its members by the same smooth weighted round-robin, each member weighted by its
    slots (as an engine's data-parallel front end keeps its ranks equally full)."""

    def __init__(
        self,
        stream: RequestStream,
        shares: list[float],
        replica: int,
        max_requests: int | None,
        *,
        member: int = 0,
        member_weights: tuple[float, ...] = (1.0,),
    ):
        if not 0 <= member < len(member_weights):
            raise ValueError(f"member {member} of {len(member_weights)}")
        self.stream, self.replica, self.max_requests, self.member = stream, replica, max_requests, member
        self._router = Router(shares)
        self._members = Router(member_weights)  # which member takes each request routed to the replica
        self._next = 0  # the next request index the front end routes
        self._head: Request | None = None
        self.exhausted = False

    def peek(self) -> Request | None:
        """The next request of this replica (None once the run has routed all it may)."""
        while self._head is None and not self.exhausted:
            if self.max_requests is not None and self._next >= self.max_requests:
                self.exhausted = True
                break
            index, self._next = self._next, self._next + 1
            if self._router.next() == self.replica and self._members.next() == self.member:
                self._head = self.stream.request(index)
        return self._head

    def pop(self) -> Request:
        head = self.peek()
        assert head is not None
        self._head = None
        return head
