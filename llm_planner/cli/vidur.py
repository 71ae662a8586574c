"""`llm-planner import vidur`: Vidur's operator profiles (a checkout of microsoft/vidur) -> our
serving profile, version 2 (llm_planner.cost.vidur; docs/serving.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from rich.console import Console

from llm_planner.core.atomic import check_writable, write_atomic
from llm_planner.core.spec_fields import SpecError, as_safe_name
from llm_planner.cost.serving_profile import parse_serving_profile
from llm_planner.cost.vidur import VidurError, vidur_profile_yaml


def add_vidur_parser(formats) -> None:
    """Register `import vidur` on the `import` command's subparsers."""
    v = formats.add_parser(
        "vidur", help="Vidur's operator profiles (mlp.csv, all_reduce.csv) as a serving profile (serving-profile/2)"
    )
    v.add_argument("dir", help="a checkout of microsoft/vidur (its data/profiling folder is read)")
    v.add_argument("--gpu", required=True, help="Vidur's GPU folder: a100, h100, a40 (data/profiling/compute/<gpu>)")
    v.add_argument("--model", required=True, help="Vidur's model folder, e.g. meta-llama/Meta-Llama-3-8B")
    v.add_argument("-o", "--output", required=True, help="serving profile YAML to write")
    v.add_argument("--kind", help="the cluster spec's device kind the profile is for (default: the --gpu name)")


def _check_outside_profiles(output: str, checkout: str) -> None:
    """-o must not name a file of the profiling folder the command reads: writing there would destroy
    one of Vidur's tables."""
    out, read = Path(output), Path(checkout) / "data" / "profiling"
    if out.exists() and read.is_dir() and out.resolve().is_relative_to(read.resolve()):
        raise VidurError(
            f"{output}: is inside {read}, the folder of Vidur's tables this command reads: writing there "
            "would destroy one; name a file outside it"
        )


def cmd_import_vidur(args: argparse.Namespace, console: Console) -> int:
    if args.kind is not None:
        try:
            as_safe_name(args.kind)
        except ValueError as exc:
            raise VidurError(f"--kind: {exc}") from None
    _check_outside_profiles(args.output, args.dir)
    check_writable(args.output)
    text = vidur_profile_yaml(args.dir, args.gpu, args.model, kind=args.kind)
    try:
        profile = parse_serving_profile(yaml.safe_load(text), source=args.output)  # what we write must load
    except SpecError as exc:
        raise VidurError(f"{args.dir}: the profile read from Vidur's files does not load: {exc}") from None
    write_atomic(args.output, text)
    entry = profile.kinds[0]
    degrees = ", ".join(
        f"tp {t.degree} ({len(t.linear.sizes)} token counts" + (", all-reduce)" if t.all_reduce else ")")
        for t in entry.degrees
    )
    console.print(f"wrote {args.output}: device kind {entry.kind}: {degrees}; {profile.source.split('; ', 1)[1]}")
    return 0
