"""`llm-planner import helix`: a Helix cluster file and its layer profiles -> our cluster spec
and serving profile (llm_planner.helix.inputs; `import vidur`: llm_planner.cli.vidur);
`llm-planner plan-helix`: a layout for Helix's
engine, written as Helix's layout file (llm_planner.helix.plan). docs/helix.md."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from llm_planner.cli.commands import UserError
from llm_planner.cli.vidur import add_vidur_parser, cmd_import_vidur
from llm_planner.core.atomic import check_writable, write_atomic
from llm_planner.core.spec import parse_cluster
from llm_planner.cost.serving_profile import parse_serving_profile
from llm_planner.helix.inputs import HelixError, device_helix_names, load_helix_cluster, serving_profile_yaml
from llm_planner.helix.plan import ORDERS, REGION_MODES, load_inputs, plan_helix, read_checked_layout, score_ranges
from llm_planner.helix.replayed import plan_by_replay, replay_layout
from llm_planner.helix.simulator_file import simulator_hops
from llm_planner.helix.spec_yaml import cluster_spec_yaml
from llm_planner.serving.workload import MOST_TOKENS


def add_import_parser(sub) -> None:
    """Register `import helix` on the CLI's subparsers."""
    p = sub.add_parser("import", help="convert another planner's cluster files or profiles into our formats")
    formats = p.add_subparsers(
        dest="import_format",
        required=True,
        help="the file format to import (helix: Helix's cluster .ini and layer profiles; vidur: Vidur's "
        "operator profiles)",
    )
    h = formats.add_parser("helix", help="a Helix (ASPLOS'25) cluster .ini and its per-layer profiles")
    _add_cluster_args(h)
    h.add_argument(
        "--profiles",
        help="folder of Helix's per-machine-type layer profiles, <type>/decode_bs2time.csv "
        "and prompt_bs2time.csv (e.g. simulator/model_manager/llama2_70b); read and checked, "
        "written as a serving profile by --profile-out",
    )
    h.add_argument("-o", "--output", required=True, help="cluster spec YAML to write")
    h.add_argument("--profile-out", help="serving profile YAML to write from --profiles")
    h.add_argument("--model", help="model name in the serving profile (default: the --profiles folder's name, _ -> -)")
    h.add_argument("--name", help="cluster name (default: the cluster file's stem)")
    add_vidur_parser(formats)


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, help="Helix cluster file (e.g. config/cluster24.ini)")
    p.add_argument(
        "--machine-profiles", help="Helix machine profile file (default: machine_profiles.ini beside --cluster)"
    )


def add_plan_helix_parser(sub) -> None:
    """Register `plan-helix` on the CLI's subparsers."""
    p = sub.add_parser(
        "plan-helix", help="a layout for Helix's engine (its cluster and model files), written as its layout file"
    )
    _add_cluster_args(p)
    p.add_argument(
        "--profiles",
        required=True,
        help="Helix's model manager folder of the model: <type>/decode_bs2time.csv and <type>/<model>_<type>.py "
        "(e.g. simulator/model_manager/llama2_70b)",
    )
    p.add_argument("--model", help="model preset (default: the --profiles folder's name, _ -> -)")
    p.add_argument(
        "--prompt-len",
        type=float,
        default=763.0,
        help="mean prompt tokens (default: 763, the Azure Conversation trace of Helix's offline runs)",
    )
    p.add_argument(
        "--order",
        choices=ORDERS,
        default="slow-ends",
        help="route order of the stages: slowest at both ends, or fastest first (default: slow-ends)",
    )
    p.add_argument(
        "--regions",
        choices=REGION_MODES,
        default="ignore",
        help="geo clusters: ignore regions (every hop the slowest link; default) or route one chain over the "
        "best set of regions (measured worse under Helix's simulator on 3cluster24, docs/helix.md)",
    )
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument(
        "-o",
        "--output",
        help="Helix layout file to write (its [Solution] format); a plan of several chains writes one Helix "
        "deployment per chain instead: OUTPUT's stem + -<k>.ini (layout) and -<k>.cluster.ini (the chain's "
        "machines as their own cluster file)",
    )
    out.add_argument("--score", help="a Helix layout file to estimate instead of planning one (writes nothing)")
    p.add_argument(
        "--no-replay",
        action="store_true",
        help="skip the replay of Helix's engine over its window (llm_planner.helix.replay; seconds a deployment) "
        "that chooses among the candidates the routed estimate rates near its best and checks the estimate",
    )
    p.add_argument(
        "--simulator-cluster",
        help="with --score: Helix's own simulator cluster file for the layout, whose links (its layout tools may "
        "leave out hops the layout allows) the estimate routes over",
    )


def cmd_plan_helix(args: argparse.Namespace, console: Console) -> int:
    if not (math.isfinite(args.prompt_len) and 1 <= args.prompt_len <= MOST_TOKENS):
        raise UserError(
            f"--prompt-len: must be a number of tokens from 1 to {MOST_TOKENS:,}, got {args.prompt_len:g}", exit_code=2
        )
    if args.output:
        check_writable(args.output)
    inputs = load_inputs(args.cluster, args.machine_profiles, args.profiles, args.model)
    if args.simulator_cluster and not args.score:
        raise UserError("--simulator-cluster: only with --score (a layout's own simulator cluster file)", exit_code=2)
    if args.score:
        return _score(inputs, args, console)
    plan, replayed = _plan(inputs, args)
    written = _write_plan(plan, inputs, Path(args.output))
    console.print(_stage_table(plan.stages, plan.machines, plan.chain_of()))
    console.print(
        f"wrote {', '.join(written)}: {len(plan.chain_sizes or (1,))} chain(s), {len(plan.stages)} stages on "
        f"{sum(s.width for s in plan.stages)} machines; "
        f"{_said(plan.estimate)}; {plan.layouts} layouts in {plan.solve_s:.1f} s"
    )
    if not args.no_replay:
        _print_replayed(console, replayed)
    return 0


def _score(inputs, args, console: Console) -> int:
    """--score: the layout's routed estimate, then its replay (the layout and Helix's simulator file read once)."""
    ranges = read_checked_layout(inputs, args.score)
    hops = simulator_hops(args.simulator_cluster) if args.simulator_cluster else None
    stages, machines, sizes, est = score_ranges(inputs, ranges, args.score, args.prompt_len, hops)
    if stages:
        console.print(_stage_table(stages, machines, [i for i, n in enumerate(sizes) for _ in range(n)]))
    how = "" if stages else " (its ranges are not chains of stages: routed by a max flow, docs/helix.md)"
    console.print(f"{args.score}: {_said(est)}{how}")
    if not args.no_replay:
        try:
            _print_replayed(console, replay_layout(inputs, ranges, args.prompt_len, hops))
        except HelixError as exc:
            console.print(f"not replayed: {exc}")
    return 0


def _plan(inputs, args):
    """(plan, Replayed or the reason it was not replayed): chosen by the replay unless --no-replay, or
    by the routed estimate when the replay cannot run."""
    if args.no_replay:
        return plan_helix(inputs, args.prompt_len, order=args.order, regions=args.regions), None
    try:
        return plan_by_replay(inputs, args.prompt_len, args.order, args.regions)
    except HelixError as exc:
        return plan_helix(inputs, args.prompt_len, order=args.order, regions=args.regions), str(exc)


def _print_replayed(console: Console, replayed) -> None:
    if replayed is None:
        console.print("not replayed: the model folder does not state Helix's routing statistics (docs/helix.md)")
        return
    if isinstance(replayed, str):
        console.print(f"not replayed (the plan is the routed estimate's choice): {replayed}")
        return
    chosen = f"; chosen by it among {replayed.candidates} candidates" if replayed.candidates > 1 else ""
    console.print(
        f"replayed (Helix's engine over its 60 s + 600 s window, lengths from {replayed.lengths}): "
        f"{_said(replayed.estimate)}; {replayed.seconds:.1f} s{chosen}"
    )


def _write_plan(plan, inputs, output: Path) -> list[str]:
    """The layout file, or with several chains one deployment (cluster and layout file) per chain."""
    if len(plan.chain_sizes) <= 1:
        write_atomic(output, plan.layout_text(inputs))
        return [str(output)]
    files = []
    for k, (cluster, layout) in enumerate(plan.deployments(inputs)):
        files += [(output.with_name(f"{output.stem}-{k}.cluster.ini"), cluster)]
        files += [(output.with_name(f"{output.stem}-{k}.ini"), layout)]
    for path, _ in files:
        check_writable(path)
    for path, text in files:
        write_atomic(path, text)
    return [str(path) for path, _ in files]


def _said(est) -> str:
    return (
        f"estimated {est.tokens_per_s:.1f} decode tokens/s with {est.queries:.0f} queries in flight "
        f"and {est.round_s * 1e3:.0f} ms a token"
    )


def _stage_table(stages, machines, chain_of) -> Table:
    t = Table(title="stages (route order in each chain)")
    for col in ("chain", "stage", "type", "machines", "layers"):
        t.add_column(col)
    first, chain = 0, 0
    for i, (stage, nodes, c) in enumerate(zip(stages, machines, chain_of)):
        first, chain = (0, c) if c != chain else (first, chain)
        t.add_row(str(c), str(i), stage.kind, ", ".join(nodes), f"{first}-{first + stage.layers - 1}")
        first += stage.layers
    return t


def cmd_import(args: argparse.Namespace, console: Console) -> int:
    if args.import_format == "vidur":
        return cmd_import_vidur(args, console)
    if args.profile_out and not args.profiles:
        raise UserError("--profile-out needs --profiles (the folder of Helix's layer profiles)", exit_code=2)
    for path in filter(None, (args.output, args.profile_out)):
        check_writable(path)
    cluster = load_helix_cluster(args.cluster, args.machine_profiles)
    spec_text = cluster_spec_yaml(cluster, name=args.name)
    spec = parse_cluster(_yaml(spec_text), source=args.output)  # what we write must load
    profile_text = None
    if args.profiles:  # read and checked even without --profile-out: a bad csv is reported either way
        profile_text = serving_profile_yaml(cluster, args.profiles, model=args.model)
        parse_serving_profile(_yaml(profile_text), source=args.profile_out)
    write_atomic(args.output, spec_text)
    console.print(
        f"wrote {args.output}: {len(spec.devices())} devices in {len(spec.nodes)} node templates "
        f"({', '.join(f'{n.count}x {n.name}' for n in spec.nodes)}); "
        f"{len(device_helix_names(cluster))} devices mapped to Helix nodes (listed in its comments)"
    )
    if args.profile_out:
        write_atomic(args.profile_out, profile_text)
        console.print(
            f"wrote {args.profile_out}: layer times of "
            f"{', '.join(sorted({k.kind for k in parse_serving_profile(_yaml(profile_text)).kinds}))}"
        )
    return 0


def _yaml(text: str):

    return yaml.safe_load(text)
