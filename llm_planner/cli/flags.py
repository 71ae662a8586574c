"""Which flags of `plan` the user gave, and whether they apply to the chosen --objective.

A flag that only one kind of objective reads (--batch, --solver, --export for latency and
throughput; --tpot-slo, --max-stages for serving) has for its argparse default a `Default`, the
value it stands for: a flag still holding one was not given, whatever its value, and one given
under an objective that does not read it is refused, naming the flag and the objective, rather
than silently ignored. `fill_defaults` then puts the values in place for the handlers.
"""

from __future__ import annotations

import argparse

PLACEMENT = ("latency", "throughput")
SERVING = ("serving",)

# Flags of `plan` that only some objectives read: given under another, refused.
PLACEMENT_FLAGS = (
    "--graph",
    "--phase",
    "--seq-len",
    "--granularity",
    "--seed",
    "--batch",
    "--max-shards",
    "--solver",
    "--solver-backend",
    "--allow-backend-fallback",
    "--gap",
    "--threads",
    "--symmetry",
    "--workers",
    "--export",
    "--export-file",
)
SERVING_FLAGS = (
    "--prompt-len",
    "--output-len",
    "--workload",
    "--tpot-slo",
    "--ttft-slo",
    "--allow-cpu",
    "--exportable",
    "--max-classes-per-replica",
    "--max-stages",
    "--max-micro-batches",
    "--max-batched-tokens",
    "--expert-imbalance",
    "--expert-load",
    "--eplb",
    "--no-dp-attention",
    "--deepep",
    "--serving-solver",
    "--weights",
    "--kv-cache-dtype",
    "--allow-weights",
    "--allow-kv-cache-dtype",
)


class FlagError(ValueError):
    """A flag given where it does not apply; the message names it."""


class Default:
    """The default of a flag, told apart from the same value given by the user."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:  # help's %(default)s reads as the value itself
        return repr(self.value)


def restrict(parser: argparse.ArgumentParser, flags: tuple[str, ...], objectives: tuple[str, ...]) -> None:
    """Mark `flags` of `parser` as read only under `objectives` (each flag's default becomes a Default)."""
    table = dict(parser.get_default("_applies") or {})
    for action in parser._actions:
        flag = next((s for s in action.option_strings if s in flags), None)
        if flag is None:
            continue
        if not isinstance(action.default, Default):
            action.default = Default(action.default)
        table[action.dest] = (flag, objectives)
    missing = set(flags) - {flag for flag, _ in table.values()}
    assert not missing, f"no such flags: {sorted(missing)}"
    parser.set_defaults(_applies=table)


def restrict_plan(parser: argparse.ArgumentParser) -> None:
    """The objectives each flag of `plan` is read under."""
    restrict(parser, PLACEMENT_FLAGS, PLACEMENT)
    restrict(parser, ("--contiguous",), ("throughput",))
    restrict(parser, SERVING_FLAGS, SERVING)


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the user gave the flag of `dest` (one of a restricted flag's, or one whose default is None)."""
    value = getattr(args, dest)
    return not isinstance(value, Default) and value is not None


def check_objective(args: argparse.Namespace) -> None:
    """FlagError naming the first flag given that the chosen objective does not read."""
    for dest, (flag, objectives) in (getattr(args, "_applies", None) or {}).items():
        if args.objective not in objectives and given(args, dest):
            raise FlagError(
                f"{flag} does not apply to --objective {args.objective}: it is a flag of "
                f"--objective {' and '.join(objectives)}"
            )


def fill_defaults(args: argparse.Namespace) -> None:
    """Every flag not given takes the value its Default stands for."""
    for dest, value in vars(args).items():
        if isinstance(value, Default):
            setattr(args, dest, value.value)
