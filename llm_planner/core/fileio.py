"""Reading JSON and YAML files: the one loader every input file goes through.

A file is refused, with a message that names it (and the path of the field where
there is one, e.g. `nodes[1].devices.a100`), when:
- it is not a regular file (a FIFO, a device, a directory): it is opened without
  blocking and checked before a byte is read, so a FIFO never hangs a command;
- it is larger than MAX_FILE_BYTES, or its bytes are not UTF-8 (a Latin-1 name, a
  UTF-16 file);
- it is not valid JSON (a `.json` file) or YAML (any other file);
- a mapping repeats a key (JSON and YAML would silently keep the last one);
- it nests deeper than MAX_DEPTH, or holds more than MAX_VALUES values, counting
  each use of a YAML alias (an alias bomb expands by reference, then explodes in
  whatever walks it);
- an integer is beyond the range of a float (about 1.8e308; every number the planner
  reads is used as a float somewhere, so this holds for every file);
- with `finite=True` (cluster specs, graph, workload and model config files): a
  number is not finite (`.inf`, `1e999`, NaN).
The limits are listed in docs/inputs.md.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 64 * 2**20  # 64 MiB: a 50,000-task graph file is about 10 MiB
MAX_DEPTH = 32  # nested mappings and lists; our formats need 5
MAX_VALUES = 2_000_000  # scalars, mappings and lists, each alias use counted again

_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


def read_document(path: str | Path, error: type[Exception], *, finite: bool = False) -> Any:
    """Parse a .json file as JSON and anything else as YAML; `error(message)` names the file."""
    return load_document(path, error, finite=finite)[0]


def load_document(path: str | Path, error: type[Exception], *, finite: bool = False) -> tuple[Any, str]:
    """(parsed document, its text) of a file, checked as the module docstring says."""
    text = read_text(path, error)
    return parse_document(text, str(path), error, as_json=Path(path).suffix == ".json", finite=finite), text


def read_bytes(path: str | Path, error: type[Exception]) -> bytes:
    """The bytes of a regular file of at most MAX_FILE_BYTES; `error` naming it otherwise (a FIFO
    or a device is refused before anything is read from it, so it never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # checked before fdopen, which refuses a directory with its own error
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise error(f"{path}: cannot read: not a regular file ({what})")
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise error(f"{path}: larger than {MAX_FILE_BYTES:,} bytes, the limit for an input file")
    return raw


def read_text(path: str | Path, error: type[Exception]) -> str:
    """The file's text (UTF-8, newlines as "\\n"); `error` for an unreadable, too large or non-UTF-8 file."""
    path = Path(path)
    raw = read_bytes(path, error)
    for bom, name in _BOMS.items():
        if raw.startswith(bom):
            raise error(f"{path}: the file is {name} text; save it as UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{path}: line {line}, column {column}: byte 0x{raw[exc.start]:02x} is not UTF-8; save the file as UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def is_version(value: Any, *versions: int) -> bool:
    """Whether a document's `version` is one of `versions`: an integer, not 1.0 or true (which equal 1)."""
    return type(value) is int and value in versions


def dump_yaml(data: Any, *, width: int = 120, flow: bool | None = False) -> str:
    """`data` as YAML text, block style unless `flow` (yaml.safe_dump's output: libyaml's emitter,
    several times faster on a large plan, where PyYAML has it; its pure-Python one otherwise)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, width=width, default_flow_style=flow)


def parse_document(text: str, source: str, error: type[Exception], *, as_json: bool, finite: bool = False) -> Any:
    """Parse `text` (JSON or YAML) and check it; messages start with `source`."""
    duplicates: dict[int, tuple[Any, int | None]] = {}  # id(mapping) -> (repeated key, YAML line)
    try:
        if as_json:
            data = json.loads(
                text, object_pairs_hook=lambda pairs: _json_mapping(pairs, duplicates), parse_int=_int_or_unreadable
            )
        else:
            data = _load_yaml(text, duplicates)
    except json.JSONDecodeError as exc:
        raise error(f"{source}: not valid JSON: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc}") from None
    except _TooDeep as exc:
        raise error(f"{source}: line {exc.line}: nested deeper than the limit of {MAX_DEPTH} levels") from None
    except RecursionError:
        raise error(f"{source}: nested deeper than the limit of {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more than 4,300 digits, a date that does not exist
        raise error(f"{source}: a value cannot be read: {exc}") from None
    _Walk(source, error, duplicates, finite).check(data)
    return data


class _TooDeep(Exception):
    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


class _Unreadable:
    """An integer with more digits than Python converts; the walk names its field."""

    def __init__(self, text: str):
        self.text = text


def _int_or_unreadable(text: str) -> int | _Unreadable:
    try:
        return int(text)
    except ValueError:
        return _Unreadable(text)


def _json_mapping(pairs: list[tuple[str, Any]], duplicates: dict) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out and id(out) not in duplicates:
            duplicates[id(out)] = (key, None)
        out[key] = value
    return out


class _Loader(yaml.SafeLoader):
    """SafeLoader that records repeated keys of a mapping (merge keys `<<` may still be overridden),
    stops composing below MAX_DEPTH (PyYAML's scanner is quadratic in the depth), reads dates as
    the strings they are written as, and leaves too long integers to the walk."""

    duplicates: dict[int, tuple[Any, int | None]]
    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _TooDeep(self.peek_event().start_mark.line + 1)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            return _Unreadable(str(node.value))


def _construct_map(loader: _Loader, node: yaml.MappingNode):
    data: dict = {}
    yield data
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=False)
        try:
            repeated = key in seen
            seen.add(key)
        except TypeError:
            continue  # unhashable: construct_mapping below says so
        if repeated and id(data) not in loader.duplicates:
            loader.duplicates[id(data)] = (key, key_node.start_mark.line + 1)
    data.update(loader.construct_mapping(node))


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_scalar)


def _load_yaml(text: str, duplicates: dict) -> Any:
    loader = _Loader(text)
    loader.duplicates = duplicates
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _Walk:
    """Walks a parsed document once: depth, size, repeated keys and (optionally) finite numbers."""

    def __init__(self, source: str, error: type[Exception], duplicates: dict, finite: bool):
        self.source, self.error, self.duplicates, self.finite = source, error, duplicates, finite
        self.count = 0

    def fail(self, path: str, what: str) -> None:
        path = path if len(path) <= 120 else path[:120] + "..."
        raise self.error(f"{self.source}: {path}: {what}" if path else f"{self.source}: {what}")

    def check(self, data: Any) -> None:
        stack: list[tuple[Any, str, int]] = [(data, "", 0)]
        while stack:
            value, path, depth = stack.pop()
            self.count += 1
            if self.count > MAX_VALUES:
                self.fail(
                    "",
                    f"more than {MAX_VALUES:,} values (YAML aliases counted at each use), the limit for an input file",
                )
            if isinstance(value, dict):
                self._check_mapping(value, path, depth, stack)
            elif isinstance(value, list):
                if depth >= MAX_DEPTH:
                    self.fail(path, f"nested deeper than the limit of {MAX_DEPTH} levels")
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in reversed(list(enumerate(value))))
            elif isinstance(value, _Unreadable):
                self.fail(path, f"an integer of {len(value.text):,} digits, beyond the range of a float")
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                self._check_number(value, path)

    def _check_mapping(self, value: dict, path: str, depth: int, stack: list) -> None:
        if id(value) in self.duplicates:
            key, line = self.duplicates[id(value)]
            at = f" (line {line})" if line else ""
            self.fail(path, f"duplicate key {key!r}{at}: a key may appear once in a mapping")
        if depth >= MAX_DEPTH:
            self.fail(path, f"nested deeper than the limit of {MAX_DEPTH} levels")
        stack.extend(
            (item, f"{path}.{key}" if path else str(key), depth + 1) for key, item in reversed(list(value.items()))
        )

    def _check_number(self, value: int | float, path: str) -> None:
        if isinstance(value, int) and abs(value) > sys.float_info.max:
            self.fail(path, f"an integer of {len(str(abs(value))):,} digits, beyond the range of a float")
        if self.finite and isinstance(value, float) and not math.isfinite(value):
            self.fail(path, f"{value} is not a finite number")
