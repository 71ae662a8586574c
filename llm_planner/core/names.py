"""Host names that leave the planner for another program: a shell script, a hostfile or an mpiexec
command line. One rule, used by the spec loader
(llm_planner.core.spec_fields), the serving exporters (llm_planner.export) and the launcher's hostfile
(llm_planner.launch).

A host is a host name (RFC 1123: dot-separated labels of 1 to 63 letters, digits and inner hyphens,
253 characters in all, an optional final dot) or an IPv4 or IPv6 address. None of these holds a quote,
a space, a `$`, a backtick or a newline: a host that passes `check_host` cannot break the line it is
written on, and the writers quote it anyway (shlex.quote) where it reaches a shell.
"""

from __future__ import annotations

import ipaddress
import re

from llm_planner.core.fmt import quote

_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def hostname_problem(name: str) -> str | None:
    """What makes `name` neither a host name (RFC 1123: dot-separated labels of 1 to 63 letters,
    digits and inner hyphens, 253 characters in all) nor an IPv4 or IPv6 address; None if it is one."""
    if not isinstance(name, str):
        return f"expected a string, got {quote(name)}"
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        pass
    if len(name) > 253:
        return f"{quote(name)} is longer than 253 characters"
    for label in (name[:-1] if name.endswith(".") else name).split("."):
        if not _LABEL.fullmatch(label):
            why = (
                "starts or ends with '-'"
                if label[:1] == "-" or label[-1:] == "-"
                else "is empty or longer than 63 characters"
                if not 0 < len(label) <= 63
                else "holds a character other than a letter, a digit or '-'"
            )
            return (
                f"{quote(name)} is not a host name or an address: the label {quote(label)} {why} "
                "(RFC 1123: letters, digits and inner hyphens, labels joined by dots)"
            )
    return None


def check_host(value: str, where: str, error: type[Exception] = ValueError) -> str:
    """`value` when it is a host name or an address (hostname_problem); else `error` naming `where`
    (the file and field the value came from) and what is wrong."""
    problem = hostname_problem(value)
    if problem is not None:
        raise error(f"{where}: {problem}")
    return value
