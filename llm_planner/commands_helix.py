"""`llm-planner import helix`: a Helix cluster file and its layer profiles -> our cluster spec
and serving profile (llm_planner.helix_import; docs/helix.md)."""

from __future__ import annotations

import argparse

import yaml
from rich.console import Console

from llm_planner.atomic import check_writable, write_atomic
from llm_planner.commands import UserError
from llm_planner.helix_import import cluster_spec_yaml, device_helix_names, load_helix_cluster, serving_profile_yaml
from llm_planner.serving_profile import parse_serving_profile
from llm_planner.spec import parse_cluster


def add_import_parser(sub) -> None:
    """Register `import helix` on the CLI's subparsers."""
    p = sub.add_parser("import", help="convert another planner's cluster files into our cluster spec")
    formats = p.add_subparsers(
        dest="import_format",
        required=True,
        help="the file format to import (helix: Helix's cluster .ini and layer profiles)",
    )
    h = formats.add_parser("helix", help="a Helix (ASPLOS'25) cluster .ini and its per-layer profiles")
    h.add_argument("--cluster", required=True, help="Helix cluster file (e.g. config/cluster24.ini)")
    h.add_argument(
        "--machine-profiles", help="Helix machine profile file (default: machine_profiles.ini beside --cluster)"
    )
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


def cmd_import(args: argparse.Namespace, console: Console) -> int:

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
