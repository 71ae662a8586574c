"""Numbers in readable units for tables and messages, and text printed as it is.

Every value the command line prints may come from a file, so text is printed literally:
`LiteralConsole` reads no rich markup (`[red]`, `[/]`) and no emoji codes in strings, and
writes control characters (escape sequences, bell, carriage return, bidirectional overrides)
as escapes; styles are given as `styled(...)` Text, never as markup inside a string.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

# C0 and C1 controls but newline and tab, DEL, and the bidirectional embeddings, overrides and isolates
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"}
_ESCAPES.update({c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})
QUOTE_CHARS = 80  # the longest quoted value in a message; longer ones are cut


def printable(text: str) -> str:
    """`text` with control characters written as escapes (`\\x1b`); newlines and tabs kept."""
    return text.translate(_ESCAPES)


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """The repr of a value for a message, cut to `limit` characters (a 1 MB name is not quoted whole)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class LiteralConsole(Console):
    """A rich console that prints strings literally (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs.update(markup=False, emoji=False)
        return super().render_str(printable(text), **kwargs)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text of plain parts and (text, style) pairs, each printed literally: `styled(("valid", "green"), ": ...")`."""
    return Text.assemble(*((printable(p[0]), p[1]) if isinstance(p, tuple) else printable(p) for p in parts))


def significant(value: float, digits: int) -> str:
    """`value` to `digits` significant digits, never in exponent form: 999.7 to 3 digits is "1,000",
    not "1e+03"; from 1,000 up the whole number, thousands grouped."""
    text = f"{value:.{digits}g}"
    return f"{value:,.0f}" if abs(float(text)) >= 1000 else text


_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit (name, seconds in one) a column of times is printed in: the largest that `seconds`
    (the column's reference value) fills at least once."""
    for unit, scale in _TIME_UNITS[:-1]:
        if abs(seconds) >= scale:
            return unit, scale
    return _TIME_UNITS[-1]


def fmt_s(seconds: float) -> str:
    """Seconds in a readable unit."""
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return str(seconds)
    unit, scale = time_unit(seconds)
    return f"{significant(seconds / scale, 4)} {unit}"


def fmt_time(seconds: float, file_units: bool = False) -> str:
    """Seconds in a readable unit; or, for a workload file's times, which state no unit, the plain number."""
    return f"{seconds:.4g}" if file_units else fmt_s(seconds)


def has_file_units(graph) -> bool:
    """Whether the graph's times are a workload file's, in the file's own (unstated) unit."""
    return "workload_format" in graph.meta_dict()


def fmt_bytes(num: float) -> str:
    """Bytes in the largest binary unit they fill, to 3 significant digits: 347 MiB, 1,000 MiB (not
    1e+03 MiB: a value stays in its unit up to 1,023), 20.1 GiB."""
    if num == float("inf"):
        return "unlimited"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num >= scale:
            return f"{significant(num / scale, 3)} {unit}"
    return f"{num:,.0f} B"
