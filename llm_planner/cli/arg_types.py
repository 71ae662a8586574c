"""Argument types of the command line: a value out of range is refused by argparse with the
flag's name and exit status 2, before any work starts."""

from __future__ import annotations

import argparse
import math

from llm_planner.cost.eplb import MAX_REDUNDANT
from llm_planner.serving.workload import MOST_BUDGET, MOST_TOKENS


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text!r}")
    return value


def front_end_seconds(text: str) -> float:
    """A finite number of seconds from 0 to below an hour (a front end's time per request)."""
    value = _number(text)
    if not (math.isfinite(value) and 0 <= value < 3600):
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to below 3600, got {text!r}")
    return value


def imbalance(text: str) -> float:
    """A finite number of at least 1 (an MoE layer's busiest expert's rows over the mean)."""
    value = _number(text)
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 1 (1: uniform routing), got {text!r}")
    return value


def share(text: str) -> float:
    """A finite number from 0 to below 1 (a relative gap: 1 would accept any plan)."""
    value = _number(text)
    if not (math.isfinite(value) and 0 <= value < 1):
        raise argparse.ArgumentTypeError(f"must be a number from 0 to below 1, got {text!r}")
    return value


def ascii_int(text: str) -> int | None:
    """A whole number written in ASCII digits (spaces around it allowed), else None: int() also reads
    "1_6" and other scripts' digits, which no one means as a count."""
    text = text.strip()
    digits = text.removeprefix("-")
    return int(text) if digits.isascii() and digits.isdigit() else None


def ascii_ints(text: str) -> tuple[int, ...]:
    """The comma-separated whole numbers of `text` (ascii_int each), or () where any is not one."""
    parts = [ascii_int(s) for s in text.split(",")]
    return () if None in parts else tuple(parts)


def whole(low: int, high: int):
    """The argparse type of a whole number from `low` to `high` (a count where 0 would mean nothing,
    or a size past which the planner's work or a solver's integers would overflow)."""

    def parse(text: str) -> int:
        value = ascii_int(text)
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low:,} to {high:,}, got {text!r}")
        return value

    parse.__name__ = f"whole number from {low} to {high}"
    return parse


count = whole(0, 1024)  # processes or threads; 0: the default's choice
positive = whole(1, 2**20)  # a batch, shards, stages, micro-batches
tokens = whole(1, MOST_TOKENS)  # a prompt, an output or a context, in tokens
budget = whole(1, MOST_BUDGET)  # the tokens one engine iteration may carry (plan, score and calibrate alike)
seed = whole(0, 2**32 - 1)
redundant_experts = whole(0, MAX_REDUNDANT)  # EPLB's redundant experts (DeepSeek-V3 serves 256 experts with 32)


def names_of(known: tuple[str, ...], what: str):
    """The argparse type of a comma-separated list of `known` names (at least one, each once)."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
        unknown = [n for n in names if n not in known] or (["(none given)"] if not names else [])
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")
        return names

    parse.__name__ = f"list of {what} names"
    return parse


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def layer_counts(text: str) -> tuple[int, ...]:
    """A comma-separated list of whole numbers of at least 1 (layers of each pipeline stage)."""
    values = ascii_ints(text)
    if not values or any(not 1 <= v <= 2**20 for v in values):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated whole numbers of at least 1, one per stage (e.g. 16,16), got {text!r}"
        )
    return values


def increasing(low: int, high: int, least: int = 1):
    """The argparse type of a comma-separated list of at least `least` whole numbers from `low` to
    `high`, strictly increasing (the sizes of a table's points)."""

    def parse(text: str) -> tuple[int, ...]:
        values = ascii_ints(text)
        ok = len(values) >= least and all(low <= v <= high for v in values)
        if not ok or any(a >= b for a, b in zip(values, values[1:])):
            raise argparse.ArgumentTypeError(
                f"must be at least {least} comma-separated whole numbers from {low:,} to {high:,}, "
                f"increasing, got {text!r}"
            )
        return values

    parse.__name__ = f"increasing list of whole numbers from {low} to {high}"
    return parse
