"""Shell scripts that start a serving plan's engines (llm_planner.export.serving): one script for
every host, run there as `bash SCRIPT [HOST]`; it starts what that host runs.

- vLLM: an engine on one host is one `vllm serve` with CUDA_VISIBLE_DEVICES naming its GPUs in
  pipeline order. An engine on several hosts is a Ray cluster (vLLM's documented multi-node
  form): the first stage's host is the head (`ray start --head`, then `vllm serve` with
  --distributed-executor-backend ray once every GPU has joined), the other hosts join it
  (`ray start --address`).
- SGLang: one `python -m sglang.launch_server` per engine and host, with --nnodes, --node-rank
  and --dist-init-addr (the first stage's host) when the engine spans hosts, and
  --enable-mixed-chunk: the plan prices an iteration as the running decodes and a prompt chunk
  together (vLLM's chunked prefill), which SGLang runs only with it (without, a prompt chunk runs in
  an iteration of its own and the decodes wait for it).
- An engine with data-parallel attention that moves tokens with DeepEP (`dpa<k>-deepep`): vLLM
  `--all2all-backend deepep_low_latency`; SGLang `--moe-a2a-backend deepep --deepep-mode auto`
  (normal kernels for prompt batches, low-latency ones for decodes) with
  SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK room for a rank's decode batch.
- A plan with EPLB (`--eplb R`): its data-parallel engines rebalance their experts, vLLM
  `--enable-eplb --eplb-config '{"num_redundant_experts": R}'`, SGLang `--enable-eplb
  --ep-num-redundant-experts R`.

Every script starts with the load balancer's weights: engine e gets the share
tokens_per_s(e) / total of the requests (a table, and an nginx upstream block).
"""

from __future__ import annotations

import json
import shlex

from llm_planner.cost.dp_attention import DEEPEP_MAX_RANK_DECODES
from llm_planner.export.engine_args import (
    DIST_INIT_PORT,
    PORT_STEP,
    SGLANG_PORT,
    VLLM_MASTER_PORT,
    VLLM_PORT,
    ServingExportError,
    assign_ports,
    past_limit,
    ray_ports,
)
from llm_planner.export.routers import ROUTER_LABEL, router_start
from llm_planner.export.serving import (
    ENGINE_VERSIONS,
    EnginePlan,
    ServingExport,
    layer_partition,
)
from llm_planner.export.vllm_ray import vllm_ip_ties
from llm_planner.serving.engines import TITLES

DEEPEP_SGLANG_TOKENS = 128  # SGLang's default SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK


def _q(value: object) -> str:
    return shlex.quote(str(value))


def _comment(text: str) -> str:
    return " ".join(str(text).split())  # names from files never break a comment line


def _fraction(value: float) -> str:
    """A memory fraction rounded down to 3 decimals (never above the plan's usable share)."""
    return f"{int(value * 1000) / 1000:g}"


def _group(e: EnginePlan) -> str:
    """The header's tp column: the degree, or dpK for K ranks of data-parallel attention."""
    return f"dp{e.tensor_parallel}" if e.data_parallel_attention else str(e.tensor_parallel)


def _header(export: ServingExport, ports: dict[str, int], title: str) -> list[str]:
    lines = [
        "#!/usr/bin/env bash",
        f"# {title} of the serving plan {_comment(export.plan_path)} "
        f"(written by `llm-planner export --to {export.framework}`),",
        f"# written for {TITLES[export.framework]} {ENGINE_VERSIONS[export.framework]} (its flags and environment "
        "variables; other releases may name them otherwise).",
        f"# Model {_comment(export.model)} (--dtype {_comment(export.dtype)}: {_comment(export.dtype_note)}), "
        f"{len(export.engines)} engine(s); "
        "the plan predicts "
        f"{export.tokens_per_s:,.0f} output tokens/s at TPOT <= {export.tpot_slo_s * 1e3:g} ms.",
        "#",
        "# Run it on every host named below: bash THIS_SCRIPT [HOST]  (HOST defaults to `hostname`).",
        "# Set MODEL to the checkpoint to serve (a Hugging Face id or a directory) when it is not the plan's name.",
        "# GPU numbers are CUDA ordinals in PCI bus order: the node's GPU kinds in the cluster spec's order.",
        f"# Longest sequence (prompt + output): {export.max_model_len} tokens (the model's limit is "
        f"{export.model_limit}; export --max-model-len sets it).",
        "# KV cache: the tokens the plan holds per engine (KV tokens below). Tokens per iteration: the plan's",
        "# budget (plan --max-batched-tokens), which its TTFT and concurrency assumed. tp: the tensor-parallel",
        "# degree, or dpK: K ranks of data-parallel attention (each its own scheduler and a K-th of the KV).",
        "#",
        f"# {'engine':<7} {'endpoint':<24} {'tp':>3} {'pp':>3}  {'layers/stage':<16} {'max seqs':>8} "
        f"{'KV tokens':>9} {'tokens/s':>10} {'share':>6}  hosts (stages)",
    ]
    for e in export.engines:
        hosts = ", ".join(f"{h} ({','.join(map(str, e.host_stages(h)))})" for h in e.hosts)
        endpoint = f"{e.hosts[0]}:{ports[e.name]}"
        lines.append(
            f"# {e.name:<7} {_comment(endpoint):<24} {_group(e):>3} {e.pipeline_parallel:>3}  "
            f"{','.join(map(str, e.layers)):<16} {e.concurrency:>8} {export.kv[e.name].tokens * e.ranks:>9} "
            f"{e.tokens_per_s:>10,.0f} {export.share(e):>6.1%}  "
            f"{_comment(hosts)}"
        )
    lines += [
        "#",
        "# Load balancer: send each engine its share of the requests (its tokens/s over the total), e.g. nginx:",
        f"#   upstream llm_planner_{export.framework} {{",
    ]
    lines += [
        f"#       server {_comment(e.hosts[0])}:{ports[e.name]} weight={max(1, round(export.share(e) * 1000))};"
        for e in export.engines
    ]
    lines += [
        "#   }",
        "",
        "set -euo pipefail",
        f'MODEL="${{MODEL:-}}"; [ -n "$MODEL" ] || MODEL={_q(export.model)}',
        'HOST="${1:-$(hostname)}"',
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
    ]
    env = past_limit(export.framework, export.max_model_len, export.model_limit)
    if env is not None:
        lines += [
            f"# The plan's requests pass the model's context limit of {export.model_limit} tokens: the engine takes",
            "# them only when told to (the model was not trained on positions that far).",
            f"export {env[0]}={env[1]}",
        ]
    return [*lines, ""]


def _script(
    export: ServingExport,
    ports: dict[str, int],
    title: str,
    blocks: dict[str, list[str]],
    helpers: list[str],
    router: str = "nginx",
) -> str:
    lines = _header(export, ports, title) + helpers + ['case "$HOST" in']
    start = router_start(router, export.engines, ports)
    if start is not None:
        lines[lines.index("set -euo pipefail") : lines.index("set -euo pipefail")] = [
            f"# Front end: bash THIS_SCRIPT {ROUTER_LABEL} starts {router} on this machine (docs/serving.md).",
            "",
        ]
        blocks = {**blocks, ROUTER_LABEL: [start[0], _wrap(start[1], ""), ""]}
    for host, body in blocks.items():
        lines.append(f"  {_q(host)})")
        lines += [f"    {line}" if line else "" for entry in body[:-1] for line in entry.split("\n")]
        lines.append("    ;;")
    known = " ".join(blocks)
    lines += [
        "  *)",
        f'    echo "host $HOST runs no engine of this plan (hosts: "{_q(known)}")" >&2',  # names quoted: never run
        "    exit 2",
        "    ;;",
        "esac",
        "wait",
        "",
    ]
    return "\n".join(lines)


def _stages(stages: list[int]) -> str:
    return ("stage " if len(stages) == 1 else "stages ") + ",".join(map(str, stages))


def _wrap(words: list[str], indent: str, width: int = 100) -> str:
    """A command over several lines: flags stay with their values, lines end in a backslash."""
    lines, line = [], ""
    for word in words:
        if line and word.startswith("--") and len(line) + len(word) > width:
            lines.append(line + " \\")
            line = indent + "    "
        line += ("" if not line or line.endswith(" ") else " ") + word
    return "\n".join(lines + [line])


def _env(pairs: list[tuple[str, str | None]]) -> str:
    return " ".join(f"{k}={_q(v)}" for k, v in pairs if v is not None)


_WAIT_RAY = [
    "wait_for_ray_gpus() {  # ADDRESS GPUS: wait until the Ray cluster at ADDRESS has GPUS GPUs",
    '  until python3 -c \'import ray, sys; ray.init(address=sys.argv[1], logging_level="ERROR"); '
    'sys.exit(ray.cluster_resources().get("GPU", 0) < float(sys.argv[2]))\' "$1" "$2"; do sleep 5; done',
    "}",
    "",
]


def _dtype_args(export: ServingExport) -> list[str]:
    """The formats the engine runs in; and, for a decoder planned without its checkpoint's vision
    encoder, the flag that keeps the engine from loading it (vLLM's and SGLang's alike)."""
    args = ["--dtype", _q(export.dtype)]
    if export.quantization:
        args += ["--quantization", _q(export.quantization)]
    if export.kv_cache_dtype:
        args += ["--kv-cache-dtype", _q(export.kv_cache_dtype)]
    if export.language_model_only:
        args.append("--language-model-only")
    return args


def _vllm_parallel(export: ServingExport, e: EnginePlan) -> list[str]:
    """vLLM's parallel sizes: tensor and pipeline, or data-parallel attention with the experts
    split over the ranks (each rank its own scheduler: max-num-seqs and the token budget per rank),
    its all-to-all where it is not vLLM's default, and EPLB where the plan asks for it."""
    if e.data_parallel_attention:
        backend = ["--all2all-backend", _q(e.all2all)] if e.all2all == "deepep_low_latency" else []
        if export.eplb is not None:
            backend += ["--enable-eplb", "--eplb-config", _q(json.dumps({"num_redundant_experts": export.eplb}))]
        return [
            "--tensor-parallel-size",
            "1",
            "--data-parallel-size",
            _q(e.tensor_parallel),
            "--enable-expert-parallel",
        ] + backend
    return ["--tensor-parallel-size", _q(e.tensor_parallel), "--pipeline-parallel-size", _q(e.pipeline_parallel)]


def _vllm_args(export: ServingExport, e: EnginePlan, port: int) -> list[str]:
    budget = -(-export.batched_tokens[e.name] // e.ranks)  # a rank's share
    if e.rank_concurrency > budget:  # vllm/config/scheduler.py refuses it at start
        raise ServingExportError(
            f"engine {e.name}: --max-num-seqs {e.rank_concurrency} above --max-num-batched-tokens "
            f"{budget}, which vLLM refuses: plan with --exportable vllm (it keeps a replica's "
            "sequences within the token budget) or a larger --max-batched-tokens, or export to SGLang"
        )
    return [
        "vllm",
        "serve",
        '"$MODEL"',
        "--host",
        "0.0.0.0",
        "--port",
        _q(port),
        *_vllm_parallel(export, e),
        "--max-num-seqs",
        _q(e.rank_concurrency),
        "--max-model-len",
        _q(export.max_model_len),
        "--kv-cache-memory-bytes",
        _q(export.kv[e.name].gpu_bytes),
        "--max-num-batched-tokens",
        _q(budget),
        *_dtype_args(export),
    ]


def _about(e: EnginePlan) -> str:
    return f"# engine {e.name} (replica {e.replica} copy {e.copy}, {_comment(e.pattern)}):"


def _vllm_native(export: ServingExport, e: EnginePlan, args: list[str], master_port: int) -> dict[str, list[str]]:
    """vLLM's own multi-node mode: node k runs ranks k*L .. (k+1)*L - 1; the head serves the API,
    the others run headless workers. Every host sets the layer partition (each worker reads it)."""
    part, head, out = layer_partition(e, export.num_layers), e.hosts[0], {}
    for k, host in enumerate(e.hosts):
        env = _env([("CUDA_VISIBLE_DEVICES", ",".join(map(str, e.host_gpus(host)))), ("VLLM_PP_LAYER_PARTITION", part)])
        multi = ["--nnodes", _q(len(e.hosts)), "--node-rank", _q(k)]
        multi += ["--master-addr", _q(head), "--master-port", _q(master_port)] + (["--headless"] if k else [])
        here = f"{_stages(e.host_stages(host))} of {e.pipeline_parallel} here, node rank {k}"
        role = "serves the API" if k == 0 else f"headless, joins {_comment(head)}"
        out[host] = [
            f"{_about(e)} {here}, {role}",
            _wrap([env, *args, *multi, f"> {_q(f'vllm-{e.name}-{k}.log')} 2>&1 &"], ""),
            "",
        ]
    return out


def _vllm_data_parallel(export: ServingExport, e: EnginePlan, args: list[str], rpc_port: int) -> dict[str, list[str]]:
    """vLLM's data-parallel ranks over several hosts (one stage of dpaK over whole servers): the
    head runs the first host's ranks and serves the API, every other host its ranks headless from
    its start rank, all joining the head's data-parallel address."""
    head, out, start = e.hosts[0], {}, 0
    for k, host in enumerate(e.hosts):
        gpus = e.host_gpus(host)
        env = _env([("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus)))])
        multi = ["--data-parallel-size-local", _q(len(gpus)), "--data-parallel-address", _q(head)]
        multi += ["--data-parallel-rpc-port", _q(rpc_port)]
        multi += ["--headless", "--data-parallel-start-rank", _q(start)] if k else []
        role = "serves the API" if k == 0 else f"headless, joins {_comment(head)}"
        out[host] = [
            f"{_about(e)} data-parallel ranks {start}..{start + len(gpus) - 1} here, {role}",
            _wrap([env, *args, *multi, f"> {_q(f'vllm-{e.name}-{k}.log')} 2>&1 &"], ""),
            "",
        ]
        start += len(gpus)
    return out


def _vllm_ray(export: ServingExport, e: EnginePlan, args: list[str], k: int) -> dict[str, list[str]]:
    """vLLM over Ray: the first stage's host is the head; the k-th Ray cluster on its hosts takes the
    k-th block of ports (engine_args.ray_ports)."""
    part, head, out = layer_partition(e, export.num_layers), e.hosts[0], {}
    head_flags = ray_ports(k, head=True)
    address = f"{head}:{head_flags[0].split('=')[1]}"
    for i, host in enumerate(e.hosts):
        gpus = e.host_gpus(host)
        visible = _env([("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus)))])
        here = f"{_stages(e.host_stages(host))} of {e.pipeline_parallel} here"
        if i == 0:
            others = "; ".join(f"{h}: {_stages(e.host_stages(h))}" for h in e.hosts[1:])
            env = _env([("RAY_ADDRESS", address), ("VLLM_PP_LAYER_PARTITION", part)])
            ties = vllm_ip_ties(e)
            out[host] = [
                f"{_about(e)} Ray head, {here} ({_comment(others)}); ray start as in Ray {ENGINE_VERSIONS['ray']}",
                *(
                    [
                        "# vLLM ranks the hosts after the head by GPU count, then IP address: give the hosts with "
                        "as many GPUs IP addresses in pipeline order"
                    ]
                    if ties
                    else []
                ),
                _wrap([f"( {visible} ray start --head", *head_flags, f"--num-gpus={_q(len(gpus))}"], "  "),
                f"  wait_for_ray_gpus {_q(address)} {_q(e.tensor_parallel * e.pipeline_parallel)}",
                _wrap(
                    [
                        f"  {env} exec",
                        *args,
                        "--distributed-executor-backend",
                        "ray",
                        f") > {_q(f'vllm-{e.name}.log')} 2>&1 &",
                    ],
                    "  ",
                ),
                "",
            ]
        else:
            start = [f"( until {visible} ray start --address={_q(address)}", *ray_ports(k, head=False)]
            out[host] = [
                f"{_about(e)} {here}; joins the Ray cluster of {_comment(head)}",
                _wrap(
                    [
                        *start,
                        f"--num-gpus={_q(len(gpus))};",
                        "do sleep 5; done )",
                        f"> {_q(f'ray-{e.name}.log')} 2>&1 &",
                    ],
                    "  ",
                ),
                "",
            ]
    return out


def vllm_script(export: ServingExport, router: str = "nginx") -> str:
    """The vLLM engines as a shell script (module docstring)."""
    ports = assign_ports(export.engines, VLLM_PORT, PORT_STEP)
    spanning = tuple(e for e in export.engines if len(e.hosts) > 1)
    ray = export.multinode == "ray"
    masters = assign_ports(spanning, 0 if ray else VLLM_MASTER_PORT, 1 if ray else PORT_STEP)
    blocks: dict[str, list[str]] = {}
    for e in export.engines:
        args = _vllm_args(export, e, ports[e.name])
        if len(e.hosts) == 1:
            env = _env(
                [
                    ("CUDA_VISIBLE_DEVICES", ",".join(map(str, e.host_gpus(e.hosts[0])))),
                    ("VLLM_PP_LAYER_PARTITION", layer_partition(e, export.num_layers)),
                ]
            )
            body = [f"{_about(e)} all {e.pipeline_parallel} stage(s) here", _wrap([env, *args, _log(e)], ""), ""]
            blocks.setdefault(e.hosts[0], []).extend(body)
            continue
        multi_node = _vllm_data_parallel if e.data_parallel_attention else (_vllm_ray if ray else _vllm_native)
        per_host = multi_node(export, e, args, masters[e.name])
        for host, body in per_host.items():
            blocks.setdefault(host, []).extend(body)
    return _script(export, ports, "vLLM engines", blocks, _WAIT_RAY if ray and spanning else [], router)


def _log(e: EnginePlan) -> str:
    return f"> {_q(f'vllm-{e.name}.log')} 2>&1 &"


def _sglang_args(export: ServingExport, e: EnginePlan, port: int) -> list[str]:
    args = ["python3", "-m", "sglang.launch_server", "--model-path", '"$MODEL"', "--host", "0.0.0.0"]
    args += ["--port", _q(port), "--tp-size", _q(e.tensor_parallel)]
    if e.data_parallel_attention:  # SGLang divides the requests and the prefill chunk over the dp ranks itself
        k = _q(e.tensor_parallel)
        args += ["--dp-size", k, "--enable-dp-attention", "--ep-size", k]
        if e.all2all == "deepep_low_latency":  # DeepEP: normal kernels for prompts, low-latency for decodes
            args += ["--moe-a2a-backend", "deepep", "--deepep-mode", "auto"]
        if export.eplb is not None:
            args += ["--enable-eplb", "--ep-num-redundant-experts", _q(export.eplb)]
    if e.pipeline_parallel > 1:
        args += ["--pp-size", _q(e.pipeline_parallel)]
    return [
        *args,
        "--max-running-requests",  # SGLang gives each data-parallel rank a k-th of it
        _q(e.rank_concurrency * e.ranks),
        "--mem-fraction-static",
        _q(_fraction(e.mem_fraction)),
        "--max-total-tokens",
        _q(export.kv[e.name].tokens),
        "--chunked-prefill-size",
        _q(export.batched_tokens[e.name]),
        "--enable-mixed-chunk",  # decodes ride in the prompt chunk's iteration, as the plan priced it
        "--context-length",
        _q(export.max_model_len),
        *_dtype_args(export),
    ]


def _deepep_env(e: EnginePlan) -> list[tuple[str, str | None]]:
    """SGLang's low-latency DeepEP buffer: room for a rank's whole decode batch (at least SGLang's 128)."""
    if not e.data_parallel_attention or e.all2all != "deepep_low_latency":
        return []
    if e.rank_concurrency > DEEPEP_MAX_RANK_DECODES:  # the search never plans it (serving.replica.within_budget)
        raise ServingExportError(
            f"engine {e.name}: {e.rank_concurrency} sequences a rank exceed the {DEEPEP_MAX_RANK_DECODES} decodes a "
            "rank SGLang's DeepEP low-latency buffer takes (plan without --deepep)"
        )
    return [("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", str(max(DEEPEP_SGLANG_TOKENS, e.rank_concurrency)))]


def sglang_script(export: ServingExport, router: str = "nginx") -> str:
    """The SGLang engines as a shell script (module docstring)."""
    ports = assign_ports(export.engines, SGLANG_PORT, PORT_STEP)
    dist_ports = assign_ports(tuple(e for e in export.engines if len(e.hosts) > 1), DIST_INIT_PORT, PORT_STEP)
    blocks: dict[str, list[str]] = {}
    for e in export.engines:
        part = layer_partition(e, export.num_layers)
        args = _sglang_args(export, e, ports[e.name])
        note = (
            [
                "# uneven layers: SGLang reads SGLANG_PP_LAYER_PARTITION in get_pp_indices (an SGLang without it "
                "splits evenly)"
            ]
            if part
            else []
        )
        for k, host in enumerate(e.hosts):
            env = _env(
                [("CUDA_VISIBLE_DEVICES", ",".join(map(str, e.host_gpus(host)))), ("SGLANG_PP_LAYER_PARTITION", part)]
                + _deepep_env(e)
            )
            multi = []
            if len(e.hosts) > 1:
                multi = ["--nnodes", _q(len(e.hosts)), "--node-rank", _q(k)]
                multi += ["--dist-init-addr", _q(f"{e.hosts[0]}:{dist_ports[e.name]}")]
            where = f"{_stages(e.host_stages(host))} of {e.pipeline_parallel} here" + (
                f", node rank {k}" if multi else ""
            )
            line = _wrap([env, *args, *multi, f"> {_q(f'sglang-{e.name}-{k}.log')} 2>&1 &"], "")
            blocks.setdefault(host, []).extend([f"{_about(e)} {where}", *note, line, ""])
    return _script(export, ports, "SGLang engines", blocks, [], router)
