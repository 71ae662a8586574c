"""The hops of Helix's own simulator cluster file (docs/helix.md, "Routing as Helix routes").

Helix's layout tools write, beside a layout, the simulator cluster file its simulator reads
(`layout_llama70b/ilp/simulator_cluster.ini`): the machines that hold layers and the directed
links a request may take, `[Links] names=[...]` and one section per link with `in`, `out`,
`bandwidth`. They may leave out hops the layout allows (Helix's cluster42 and 3cluster24 layouts
lack 8 and 2), and Helix routes over the file's links only, in its order. `simulator_hops` reads
them, so a layout can be routed over exactly Helix's graph; values are read as
`<number> * <unit>`, the list of names as a literal, nothing is run.
"""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

from llm_planner.core.fileio import read_text
from llm_planner.helix.inputs import HelixError, parse_helix_value


def simulator_hops(path: str | Path) -> dict[tuple[str, str], float]:
    """(from, to) -> bandwidth in bytes/s of every link of a simulator cluster file, in its order;
    ends are Helix node names, "source" or "sink". HelixError naming the file and the field."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(read_text(path, HelixError), source=str(path))
        names = ast.literal_eval(parser["Links"]["names"].strip())
    except (configparser.Error, KeyError) as exc:
        raise HelixError(f"{path}: [Links] names: missing or unreadable ({type(exc).__name__})") from None
    except (ValueError, SyntaxError):
        raise HelixError(f"{path}: [Links] names: expected a list of link names written as a literal") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise HelixError(f"{path}: [Links] names: expected a list of link names")
    hops = {}
    for name in names:
        if not parser.has_section(name):
            raise HelixError(f"{path}: [Links] names lists {name!r}, which has no section")
        section = parser[name]
        try:
            hops[(section["in"].strip(), section["out"].strip())] = parse_helix_value(section["bandwidth"])
        except KeyError as exc:
            raise HelixError(f"{path}: [{name}]: missing {exc.args[0]}") from None
        except ValueError as exc:
            raise HelixError(f"{path}: [{name}] bandwidth: {exc}") from None
    return hops
