"""The command-line flags and environment variables of a vLLM, SGLang (or Ray) wheel, read with `ast`
(the engine is never imported or run), as the sorted list tests/data/engine_flags/NAME-VERSION.txt
that tests/test_engine_flags.py checks the exported scripts against.

    pip download --no-deps --no-binary :none: vllm==X -d /tmp/w
    python benchmarks/engine_flags.py /tmp/w/vllm-X-*.whl [-o tests/data/engine_flags]

What counts as a flag (how the pinned releases define them):

- vLLM: every string literal starting with `--` given to an `add_argument` call in
  vllm/engine/arg_utils.py, vllm/entrypoints/common/cli_args.py and vllm/entrypoints/cli/serve.py
  (`vllm serve`'s options, not the other subcommands'); plus the fields of the classes there with an
  `add_cli_args` that registers `--{field name with - for _}` for each field (the frontend's
  `--host`, `--port`, `--headless`, ...), and of their base classes in the same file.
- SGLang: string literals given to `add_argument` in sglang/srt/server_args.py; plus every field
  of sglang/srt/arg_groups/fields/*.py annotated `A[T, "help"]` or `A[T, Arg(...)]` (not
  `no_cli=True`): `--{field with - for _}` or Arg's `cli_name`, and its `aliases`.

- Ray (`ray start` in vLLM's Ray mode): the `click.option` literals of ray/scripts/scripts.py
  (every `ray` subcommand's options; the ports of `ray start` among them).
- The routers (sglang-router's `python -m sglang_router.launch_router`, vllm-router's
  `vllm-router`): the `add_argument` literals of PACKAGE/router_args.py, `f"--{prefix}name"` read
  as `--name` (their launch_router registers them without the prefix).

Environment variables: every string literal in the package that is a whole `VLLM_...` /
`SGLANG_...` / `RAY_...` name (what the engine's source can read). Each list starts with a header line
`# ENGINE VERSION sha256 SHA256 (WHEEL)`; then `--flag` lines, then `env NAME` lines.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
import zipfile
from pathlib import Path

# Where `vllm serve`'s options are defined (the engine's, the frontend's, serve's own).
VLLM_SERVE_ARGS = ("vllm/engine/arg_utils.py", "vllm/entrypoints/common/cli_args.py", "vllm/entrypoints/cli/serve.py")
ROUTERS = ("sglang_router", "vllm_router")  # their launch_router's options: RouterArgs.add_cli_args
ENV_NAME = re.compile(r"^(VLLM|SGLANG|RAY)_[A-Z0-9_]+$")


def _strings(nodes) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def add_argument_flags(tree: ast.AST, method: str = "add_argument") -> set[str]:
    """The `--` literals among the positional arguments of every `*.add_argument(...)` call (Ray's
    CLI: `click.option(...)`); an f-string `f"--{prefix}name"` (the routers') as its launcher
    gives it, with an empty prefix."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
            names = _strings(node.args) + [s for s in map(_unprefixed, node.args) if s is not None]
            out |= {s for s in names if s.startswith("--")}
    return out


def _unprefixed(node: ast.expr) -> str | None:
    """f"--{prefix}name" as "--name" (the routers' launch_router passes use_router_prefix=False)."""
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            parts.append(value.value)
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) and value.value.id == "prefix":
            continue
        else:
            return None
    return "".join(parts)


def _field_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fields(cls: ast.ClassDef) -> list[str]:
    return [
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and not s.target.id.startswith("_")
    ]


def dataclass_cli_flags(tree: ast.Module) -> set[str]:
    """vLLM: the fields of a class with `add_cli_args` registering one flag per field, and of the
    classes deriving from it in the same file (BaseFrontendArgs -> FrontendArgs)."""
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    registering = {
        name
        for name, c in classes.items()
        if any(isinstance(f, ast.FunctionDef) and f.name == "add_cli_args" for f in c.body)
        and "replace('_', '-')" in ast.unparse(c).replace('"', "'")
    }
    changed = True
    while changed:  # subclasses inherit the registration
        changed = False
        for name, c in classes.items():
            if name not in registering and any(isinstance(b, ast.Name) and b.id in registering for b in c.bases):
                registering.add(name)
                changed = True
    return {_field_flag(f) for name in registering for f in _fields(classes[name])}


def _arg_meta(annotation: ast.expr) -> ast.expr | None:
    """The metadata of `A[T, meta]` (a string or an `Arg(...)` call), None for other annotations."""
    if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)):
        return None
    if annotation.value.id not in ("A", "Annotated") or not isinstance(annotation.slice, ast.Tuple):
        return None
    elts = annotation.slice.elts
    return elts[1] if len(elts) > 1 else None


def annotated_field_flags(tree: ast.Module) -> set[str]:
    """SGLang: the flags `add_cli_args_from_dataclass` makes of `A[T, ...]` fields."""
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        meta = _arg_meta(node.annotation)
        if meta is None:
            continue
        names = [_field_flag(node.target.id)]
        if isinstance(meta, ast.Call):
            kw = {k.arg: k.value for k in meta.keywords}
            if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
                continue
            if isinstance(kw.get("cli_name"), ast.Constant):
                names = [kw["cli_name"].value]
            if isinstance(kw.get("aliases"), ast.List):
                names += _strings(kw["aliases"].elts)
        elif not (isinstance(meta, ast.Constant) or isinstance(meta, ast.BinOp | ast.JoinedStr)):
            continue
        out |= set(names)
    return out


def env_names(tree: ast.AST) -> set[str]:
    return {s for s in _strings(ast.walk(tree)) if ENV_NAME.match(s)}


def _parse(wheel: zipfile.ZipFile, name: str) -> ast.Module | None:
    try:
        return ast.parse(wheel.read(name).decode("utf-8", "replace"), filename=name)
    except SyntaxError:
        return None


def engine_facts(path: Path) -> tuple[str, str, set[str], set[str]]:
    """(engine, version, flags, environment variables) of a vLLM or SGLang wheel."""
    engine, version = path.name.split("-")[:2]
    if engine not in ("vllm", "sglang", "ray", *ROUTERS):
        raise SystemExit(f"{path}: not a vllm, sglang, ray, sglang_router or vllm_router wheel")
    flags: set[str] = set()
    envs: set[str] = set()
    with zipfile.ZipFile(path) as wheel:
        for name in wheel.namelist():
            if not name.endswith(".py") or not name.startswith(f"{engine}/"):
                continue
            tree = _parse(wheel, name)
            if tree is None:
                continue
            envs |= env_names(tree)
            if engine == "vllm" and name in VLLM_SERVE_ARGS:
                flags |= add_argument_flags(tree) | dataclass_cli_flags(tree)
            elif engine == "sglang" and name == "sglang/srt/server_args.py":
                flags |= add_argument_flags(tree)
            elif engine == "sglang" and name.startswith("sglang/srt/arg_groups/fields/"):
                flags |= annotated_field_flags(tree)
            elif engine == "ray" and name == "ray/scripts/scripts.py":
                flags |= add_argument_flags(tree, "option")
            elif engine in ROUTERS and name == f"{engine}/router_args.py":
                flags |= add_argument_flags(tree)
    return engine, version, flags, envs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=Path("tests/data/engine_flags"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.wheel:
        engine, version, flags, envs = engine_facts(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines = [
            f"# {engine} {version} sha256 {digest} ({path.name})",
            *sorted(flags),
            *(f"env {e}" for e in sorted(envs)),
        ]
        target = args.out / f"{engine}-{version}.txt"
        target.write_text("\n".join(lines) + "\n")
        print(f"{target}: {len(flags)} flags, {len(envs)} environment variables", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
