"""Argument types of the command line: a value out of range is refused by argparse with the
flag's name and exit status 2, before any work starts."""

from __future__ import annotations

import argparse
import math


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text!r}")
    return value


def share(text: str) -> float:
    """A finite number from 0 to 1."""
    value = _number(text)
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


def count(text: str) -> int:
    """A whole number of at least 0 (0: the default's choice)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
