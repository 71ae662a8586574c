"""The front end of a plan's engines (`export --router`), started by `bash SCRIPT --router` on the
machine that takes the requests.

- nginx (the default): the script's header gives an upstream block with each engine's weight, its
  share tokens_per_s(e) / total: each engine then runs at the operating point the plan predicts.
  Nothing is started.
- sglang-router (`--to sglang`): `python -m sglang_router.launch_router`; vllm-router (`--to
  vllm`): `vllm-router`. Their flags are those of the releases in ROUTER_VERSIONS
  (tests/data/engine_flags, read from their wheels by benchmarks/engine_flags.py). Neither takes a
  weight per worker (their policies: random, round_robin, cache_aware, power_of_two and others, none
  weighted), so the script asks for the least loaded worker: cache_aware balances by load whenever
  `max_load - min_load > --balance-abs-threshold` and `max_load > min_load *
  --balance-rel-threshold`, so thresholds 0 and 1 send each request to the worker with the fewest
  requests in flight whenever their loads differ. Each engine keeps its own cap, the plan's
  sequences in flight (--max-num-seqs / --max-running-requests); the router's
  --max-concurrent-requests is their sum, so requests past what the plan holds wait at the router.
  Least-loaded routing shares requests by how fast each engine finishes them, not by the plan's
  weights: engines of unequal caps may run off the plan's operating point (nginx's weights do not).
"""

from __future__ import annotations

import shlex

from llm_planner.export.engine_args import ServingExportError

ROUTERS = ("nginx", "sglang-router", "vllm-router")
ROUTER_FOR = {"sglang-router": "sglang", "vllm-router": "vllm"}  # the engines each router fronts
# The router releases the scripts are written for (tests/data/engine_flags/NAME-VERSION.txt).
ROUTER_VERSIONS = {"sglang_router": "0.3.2", "vllm_router": "0.1.17"}
ROUTER_PORT = 9000  # where the router listens (no engine's port: engine_args)
ROUTER_LABEL = "--router"  # the script's argument that starts the router (no host name starts with "-")


def check_router(router: str, framework: str) -> None:
    """ServingExportError naming --router when it does not front `framework`'s engines."""
    if router not in ROUTERS:
        raise ServingExportError(f"--router {router!r}: choose one of {', '.join(ROUTERS)}")
    if router in ROUTER_FOR and ROUTER_FOR[router] != framework:
        raise ServingExportError(
            f"--router {router} fronts {ROUTER_FOR[router]} engines, not --to {framework}'s (use nginx, or "
            f"{next(r for r, f in ROUTER_FOR.items() if f == framework)})"
        )


def router_command(router: str, urls: list[str], max_in_flight: int) -> list[str]:
    """The router's command line, its words quoted (module docstring)."""
    program = {
        "sglang-router": ["python3", "-m", "sglang_router.launch_router"],
        "vllm-router": ["vllm-router"],
    }[router]
    return [
        *program,
        "--host",
        "0.0.0.0",
        "--port",
        str(ROUTER_PORT),
        "--worker-urls",
        *(shlex.quote(u) for u in urls),
        "--policy",
        "cache_aware",
        "--balance-abs-threshold",
        "0",
        "--balance-rel-threshold",
        "1",
        "--max-concurrent-requests",
        str(max_in_flight),
    ]


def router_start(router: str, engines, ports: dict[str, int]) -> tuple[str, list[str]] | None:
    """A comment and the router's command in front of every engine's API (its first stage's host),
    None for nginx. `engines`: the export's EnginePlans."""
    if router == "nginx":
        return None
    urls = [f"http://{e.hosts[0]}:{ports[e.name]}" for e in engines]
    total = sum(e.concurrency for e in engines)
    about = (
        f"# {router} {ROUTER_VERSIONS[router.replace('-', '_')]} on port {ROUTER_PORT}: each request to the "
        f"least loaded of {len(urls)} engine(s), at most {total} in flight (the engines' caps added up)"
    )
    return about, [*router_command(router, urls, total), f"> {router}.log 2>&1 &"]
