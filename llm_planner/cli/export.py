"""CLI handler of `llm-planner export PLAN --to vllm|sglang|megatron`: a serving plan as the
commands (or parallel sizes) of a serving framework (llm_planner.export.serving)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from llm_planner.cli.commands import UserError, progress
from llm_planner.cli.serving import check_serving_verified
from llm_planner.core.atomic import check_not_an_input, check_writable, write_atomic
from llm_planner.core.fileio import parse_document, read_text
from llm_planner.core.fmt import styled
from llm_planner.core.spec import load_cluster
from llm_planner.export.engine_args import PORT_STEP, SGLANG_PORT, VLLM_PORT, assign_ports
from llm_planner.export.routers import ROUTERS, check_router
from llm_planner.export.serving import FRAMEWORKS, VLLM_MULTINODE, ServingExportError, build_engines
from llm_planner.export.serving_json import engines_config, megatron_config
from llm_planner.export.serving_scripts import sglang_script, vllm_script
from llm_planner.helix.engine import load_engine_tables
from llm_planner.helix.inputs import device_helix_names, load_helix_cluster
from llm_planner.helix.layout_file import LayoutError, helix_layout
from llm_planner.helix.model_card import load_model_card
from llm_planner.helix.rules import check_helix_layout
from llm_planner.serving.inputs import decoder_config
from llm_planner.serving.plan_file import checked_input, checked_model, is_serving_plan, load_serving_plan


def add_export_parser(sub) -> None:

    p = sub.add_parser(
        "export", help="a serving plan as the launch commands of vLLM or SGLang, or Megatron-LM's parallel sizes"
    )
    p.add_argument("plan", help="serving plan file written by `plan --objective serving`")
    p.add_argument(
        "--to",
        required=True,
        choices=(*FRAMEWORKS, "helix"),
        help="vllm / sglang: a shell script starting every engine (one per replica copy) on its hosts, with the "
        "load balancer's weights; megatron: tensor, pipeline and data parallel sizes per pattern (JSON); "
        "helix: Helix's layout file (each machine's layer range; needs --helix-cluster and --helix-profiles)",
    )
    p.add_argument(
        "--helix-cluster",
        default=None,
        help="--to helix: the Helix cluster .ini the plan's cluster was imported from (maps devices to its nodes)",
    )
    p.add_argument(
        "--helix-profiles",
        default=None,
        help="--to helix: Helix's model manager folder of the plan's model (e.g. simulator/model_manager/"
        "llama2_70b): each machine type's max_num_layers, which the layout must respect",
    )
    p.add_argument(
        "--format",
        choices=("script", "json"),
        default=None,
        help="script (default for vllm and sglang) or json (the engines as data; megatron's only form)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="vllm / sglang: the longest sequence (prompt + output tokens) the engines accept (default: the "
        "model's context limit, or the KV cache an engine holds when that is less); refused above either",
    )
    p.add_argument(
        "--vllm-multinode",
        choices=VLLM_MULTINODE,
        default=None,
        help="vllm: how an engine spans hosts: native (vLLM's --nnodes/--node-rank/--master-addr, --headless "
        "workers; default) or ray (a Ray cluster per engine)",
    )
    p.add_argument(
        "--router",
        choices=ROUTERS,
        default=None,
        help="vllm / sglang scripts: the front end `bash SCRIPT --router` starts: nginx (default: an upstream "
        "block with the plan's weights in the script's header, nothing started), sglang-router (--to sglang) or "
        "vllm-router (--to vllm): least-loaded routing, the engines' caps added up as its limit",
    )
    p.add_argument("-o", "--output", default=None, help="file to write (default, or -: standard output)")


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    if args.output == "-":  # the usual name for standard output
        args.output = None
    _check_engine_options(args)
    if args.to == "helix":
        return _export_helix(args, console)
    fmt = args.format or ("json" if args.to == "megatron" else "script")
    if args.to == "megatron" and fmt == "script":
        raise UserError("--to megatron writes JSON (parallel sizes per pattern); drop --format script", exit_code=2)
    if not is_serving_plan(args.plan):
        text = read_text(args.plan, ServingExportError)  # one that cannot be read or parsed says so, not
        parse_document(text, args.plan, ServingExportError, as_json=False)  # "not a serving plan"
        raise UserError(
            f"{args.plan}: not a serving plan (`plan --objective serving` writes one); `plan --export` "
            "writes the parallel sizes of other plans",
            exit_code=2,
        )
    if args.output is not None:
        check_writable(args.output, ServingExportError)
    plan = load_serving_plan(args.plan)
    if args.output is not None:
        inputs = {"plan": args.plan, **{f"inputs.{k}": plan.input_path(k) for k in ("cluster", "profile")}}
        check_not_an_input(args.output, inputs, ServingExportError)
    cluster_path = checked_input(plan, "cluster")  # its hash checked on the bytes, before it is parsed
    assert cluster_path is not None  # plan_fields requires inputs.cluster
    check_model_layers(plan)
    export = build_engines(  # the framework's rules, then verify's
        plan, load_cluster(cluster_path), args.to, max_len=args.max_model_len, multinode=args.vllm_multinode or "native"
    )
    with progress(console, "verifying the plan before exporting it..."):
        check_serving_verified(plan, f"no {args.to} {fmt} written")
    if args.to == "megatron":
        text = json.dumps(megatron_config(export), indent=2) + "\n"
    elif fmt == "json":
        ports = assign_ports(export.engines, VLLM_PORT if args.to == "vllm" else SGLANG_PORT, PORT_STEP)
        text = json.dumps(engines_config(export, ports), indent=2) + "\n"
    else:
        router = args.router or "nginx"
        text = vllm_script(export, router) if args.to == "vllm" else sglang_script(export, router)
    if args.output is None:
        console.file.write(text)
        console.file.flush()
        return 0
    write_atomic(args.output, text, ServingExportError)
    console.print(
        styled(f"{args.to} {fmt} for {len(export.engines)} engine(s) written to ", (str(args.output), "bold"))
    )
    return 0


def check_model_layers(plan) -> None:
    """model.num_layers and model.dense_layers, which the export writes, are the layers of the model
    the plan names (its config.json's hash checked first)."""
    name = checked_model(plan)
    try:
        config = decoder_config(name)
    except ValueError as exc:
        raise UserError(f"{plan.path}: model.name: {exc}", exit_code=2) from None
    model = plan.data["model"]
    stated = model["num_layers"] + model.get("dense_layers", 0)  # the stages' layers and the dense first ones
    if config.num_layers != stated:
        raise UserError(
            f"{plan.path}: model.num_layers: {model['num_layers']} (and dense_layers {model.get('dense_layers', 0)}), "
            f"but {name} has {config.num_layers} layers ({config.first_dense_layers} of them dense first layers)",
            exit_code=2,
        )


def _check_engine_options(args: argparse.Namespace) -> None:
    """Options of the engines' scripts are refused for targets that would ignore them."""
    if args.max_model_len is not None and args.to not in ("vllm", "sglang"):
        raise UserError(f"--max-model-len applies to --to vllm or sglang, not --to {args.to}", exit_code=2)
    if args.vllm_multinode is not None and args.to != "vllm":
        raise UserError(f"--vllm-multinode applies to --to vllm, not --to {args.to}", exit_code=2)
    if args.router is not None and (args.to not in ("vllm", "sglang") or args.format == "json"):
        raise UserError(f"--router applies to the scripts of --to vllm or sglang, not --to {args.to}", exit_code=2)
    if args.router is not None:
        check_router(args.router, args.to)
    helix = [f for f, v in (("--helix-cluster", args.helix_cluster), ("--helix-profiles", args.helix_profiles)) if v]
    if helix and args.to != "helix":
        raise UserError(f"{', '.join(helix)} applies to --to helix, not --to {args.to}", exit_code=2)


def helix_stages(plan) -> list[tuple[str, int, int]]:
    """(device, first layer, end layer) of every stage of every copy of a serving plan."""
    out = []
    for rep in plan.replicas:
        for copy in rep["devices"]:
            first = 0
            for devices, layers in zip(copy, rep["layers"]):
                out.append((devices[0], first, first + layers))
                first += layers
    return out


def _export_helix(args: argparse.Namespace, console: Console) -> int:
    """A serving plan as Helix's layout file (docs/helix.md): one contiguous layer range per machine."""

    if args.helix_cluster is None or args.helix_profiles is None:
        raise UserError(
            "--to helix needs --helix-cluster (the Helix .ini the plan's cluster was imported from) and "
            "--helix-profiles (Helix's folder of the model, whose tables say how many layers a machine may hold)",
            exit_code=2,
        )
    plan = load_serving_plan(args.plan)
    check_model_layers(plan)
    if plan.data["model"].get("dense_layers"):
        raise UserError(
            f"{args.plan}: model.dense_layers: Helix's simulator models layers that are all alike; a model with "
            "dense first layers (DeepSeek's) has no Helix layout",
            exit_code=2,
        )
    with progress(console, "verifying the plan before exporting it..."):
        check_serving_verified(plan, "no Helix layout written")
    cluster = load_helix_cluster(args.helix_cluster)
    num_layers = plan.data["model"]["num_layers"]
    card = load_model_card(args.helix_profiles)
    if card is not None and card.num_layers != num_layers:
        raise UserError(
            f"--helix-profiles: {card.source} states {card.num_layers} layers, the plan's model has {num_layers}",
            exit_code=2,
        )
    tables = {t.lower(): load_engine_tables(args.helix_profiles, t) for t in sorted(set(cluster.node_types))}
    names = device_helix_names(cluster)
    try:
        ranges = check_helix_layout(helix_stages(plan), cluster, tables, num_layers, names)
        text = helix_layout([(node, *span) for node, span in ranges.items()], num_layers=num_layers)
    except LayoutError as exc:
        raise UserError(f"{args.plan}: cannot be a Helix layout: {exc}", exit_code=2) from None
    if args.output is None:
        console.file.write(text)
        return 0
    write_atomic(args.output, text, UserError)
    console.print(styled("Helix layout written to ", (str(args.output), "bold")))
    return 0
