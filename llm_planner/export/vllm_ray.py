"""How vLLM's Ray executor ranks an engine's GPUs over its hosts (`export --vllm-multinode ray`),
and the check that every pipeline stage then runs on GPUs of the kind the plan gave it."""

from __future__ import annotations

from typing import Any

from llm_planner.export.engine_args import ServingExportError

EnginePlan = Any  # llm_planner.export.serving.EnginePlan (which imports this module)


def vllm_host_order(engine: EnginePlan) -> list[str]:
    """The hosts in the order vLLM's Ray executor ranks their GPUs: the head (the driver's host)
    first, then the others by their number of the engine's GPUs, fewer first (ties: by IP
    address, which the spec does not know; kept here in pipeline order)."""
    return [engine.hosts[0], *sorted(engine.hosts[1:], key=lambda h: len(engine.host_gpus(h)))]


def _host_kinds(engine: EnginePlan, host: str) -> list[str]:
    """The kind of each of the engine's GPUs on the host, in ascending GPU order (vLLM's within a host)."""
    return [kind for _, kind in sorted((g, st.kind) for st in engine.stages if st.host == host for g in st.gpus)]


def vllm_ip_ties(engine: EnginePlan) -> bool:
    """Whether hosts after the head hold as many GPUs but of different kinds: their order, hence
    which of them runs which stages, then depends on their IP addresses."""
    rest = engine.hosts[1:]
    return any(
        len(engine.host_gpus(a)) == len(engine.host_gpus(b)) and _host_kinds(engine, a) != _host_kinds(engine, b)
        for i, a in enumerate(rest)
        for b in rest[i + 1 :]
    )


def check_vllm_ray_hosts(label: str, engine: EnginePlan) -> None:
    """vLLM's Ray executor gives rank r the r-th GPU of `vllm_host_order` and stage s the ranks
    s*t .. (s+1)*t - 1: every stage must land on GPUs of the kind the plan gave it (which host
    of that kind runs it does not change the plan's memory or time)."""
    planned = [st.kind for st in engine.stages for _ in st.gpus]
    ranked = [kind for host in vllm_host_order(engine) for kind in _host_kinds(engine, host)]
    for rank, (want, got) in enumerate(zip(planned, ranked)):
        if want != got:
            s = rank // engine.tensor_parallel
            raise ServingExportError(
                f"{label}: stage {s} ({want} on host {engine.stages[s].host!r}) would run on {got} GPUs: "
                "vLLM's Ray executor ranks the head's GPUs first, then the other hosts' by their GPU count "
                "(fewer first), each host's in ascending order, and this plan's pipeline is in another order "
                "(export with --vllm-multinode native, which runs every plan made with --exportable vllm)"
            )
