"""The design's layering: core modules import without torch and without mpi4py; no import
circle anywhere in llm_planner; no module imports from a layer above its own.

The import graph is read with `ast` from every module of the package: imports at the top,
inside functions and under TYPE_CHECKING alike, relative imports resolved. Importing a.b.c
also runs the __init__ of a and a.b, so a module depends on its parent packages too (a
package __init__ that re-exported a submodule's names would close a circle there).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "llm_planner"

CORE = [
    "llm_planner.core.spec",
    "llm_planner.graph.ir",
    "llm_planner.graph.models",
    "llm_planner.cost.roofline",
    "llm_planner.placement.problem",
    "llm_planner.placement.schedule",
    "llm_planner.placement.solve",
    "llm_planner.placement.bounds.combined",
    "llm_planner.placement.baselines.baseline_set",
    "llm_planner.placement.milp.milp",
    "llm_planner.placement.split.tp",
    "llm_planner.core.plan",
    "llm_planner.placement.verify",
    "llm_planner.placement.inputs",
    "llm_planner.cli.main",
]

# Lowest first: a module may import from its own layer and those before it. "x.*" names the
# package x and everything in it; an exact name wins over a pattern, a longer pattern over a shorter.
P = "llm_planner"


def _names(*names: str) -> list[str]:
    return [f"{P}.{n}" if n else P for n in names]


LAYERS: list[tuple[str, list[str], str]] = [
    (
        "utilities",
        _names("", "core", "core.units", "core.fmt", "core.fileio", "core.atomic", "core.procs", "core.names")
        + _names("core.timing", "core.gap"),
        "formatting, units, file writing, process lifetime (signals, parent death), the host-name rule, a "
        "command's timings and the gap and status of a plan against its bound, that every layer may use",
    ),
    (
        "inputs",
        _names("core.spec", "core.spec_fields", "core.spec_kinds", "core.spec_links", "core.catalog")
        + _names("core.tensor_groups")
        + _names("core.constants", "core.precision", "graph", "graph.ir"),
        "the cluster spec, the GPU catalog it may name, the task-graph IR: plain data that everything above reads",
    ),
    (
        "graph builders",
        _names("graph.*"),
        "task graphs of models (analytic decoders, fx, randomly wired networks, workload files)",
    ),
    (
        "cost",
        _names("cost.*"),
        "the cost model: rooflines, measured costs, and the measured-profile files they come from",
    ),
    (
        "plan format",
        _names("core.plan", "core.plan_read", "core.plan_paths"),
        "the placement plan file format: solvers produce Plans, so it sits below them",
    ),
    ("mip", _names("mip.*"), "solver backends behind one interface (HiGHS, Gurobi)"),
    (
        "placement base",
        _names("placement", "placement.problem", "placement.schedule", "placement.fit", "placement.options")
        + _names("placement.errors"),
        "the placement problem in numbers, the list scheduler that times an assignment into a Plan, the memory fit",
    ),
    (
        "placement bounds",
        _names("placement.bounds.*"),
        "lower bounds: what every solver and baseline is judged against, and what verify re-derives a plan's from",
    ),
    (
        "placement inputs and checks",
        _names("placement.inputs", "placement.verify", "placement.verify_fields", "placement.verify_sim"),
        "a problem from input files, and the verifier that checks a plan against it (its bound too): below every "
        "solver, so the verifier cannot use one (placement.solve calls it on every plan)",
    ),
    (
        "placement baselines",
        _names("placement.baselines.*", "placement.session"),
        "the heuristics a user would run instead; the MILP starts from them; a solve's session (its baselines, "
        "bound and status, once)",
    ),
    ("placement milp", _names("placement.milp.*"), "the exact MILP"),
    ("placement split", _names("placement.split.*"), "MILP-SPLIT: solves its module subproblems with the exact MILP"),
    (
        "placement solve",
        _names("placement.solve"),
        "solve(problem, options): picks the solver, adds the bound, verifies the plan",
    ),
    (
        "placement flows",
        _names("placement.verify_file", "placement.views", "placement.study"),
        "what commands do with placement plans: re-read and verify a plan file, tables and charts, studies",
    ),
    (
        "serving model",
        _names("serving", "serving.workload", "serving.classes", "serving.layer_time", "serving.tasks", "serving.costs")
        + _names("serving.closed_loop")
        + _names("serving.dp_costs")
        + _names("serving.replica", "serving.inputs", "serving.expert_load")
        + _names("serving.layout", "serving.links", "serving.context", "serving.bound", "serving.bound_batches")
        + _names("serving.bound_space", "serving.bound_cells")
        + _names("serving.bound_prices", "serving.optimistic", "serving.plan_fields", "serving.plan_file")
        + _names("serving.verify_replica", "serving.layout_text", "serving.score", "serving.precision_choice")
        + _names("serving.engines"),
        "serving: the steady-state model of a replica, the upper bound, the plan file and the verifier's own "
        "arithmetic of a replica; below its search",
    ),
    (
        "serving solve",
        _names("serving.fleet", "serving.baselines", "serving.search", "serving.assign", "serving.aside")
        + _names("serving.api", "serving.verify_claims", "serving.verify"),
        "serving: the baselines, the layout search and the fleet MILP (over the MILP backends), devices; the plan "
        "file's check (it re-runs the baselines)",
    ),
    ("helix", _names("helix.*"), "Helix's files in and out, its engine's model and a layout search for it"),
    ("export", _names("export.*"), "plans written for other frameworks: Megatron-style configs, vLLM, SGLang"),
    ("measure", _names("measure.*"), "run observations, measured against predicted, fitting a spec"),
    (
        "runtime",
        _names("runtime.*"),
        "a rank's share of the model under MPI (plan_schedule, table and decoder_tasks are torch-free)",
    ),
    ("launch", _names("launch.*"), "start ranks with mpiexec: the plan's, or the profiling ranks'"),
    ("commands", _names("cli.*"), "the command line: parses arguments, calls the layers, prints"),
]


def module_files(package_dir: Path) -> dict[str, Path]:
    """Module name -> file, for every module of the package in `package_dir`."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def explicit_imports(name: str, path: Path, modules: dict[str, Path], tree: ast.AST | None = None) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (or in `tree`, a part of it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    root = name.split(".")[0]
    out = set()
    for node in ast.walk(tree or ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                source = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules and target.split(".")[0] == root:
                target = target.rpartition(".")[0]  # a name from a module, or `import a.b.c` of a non-module
            if target in modules and target != name:
                out.add(target)
    return out


def import_graph(package_dir: Path) -> tuple[nx.DiGraph, dict[str, set[str]]]:
    """The import graph, parent-package edges included, and the explicit imports alone."""
    modules = module_files(package_dir)
    explicit = {name: explicit_imports(name, path, modules) for name, path in modules.items()}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, targets in explicit.items():
        graph.add_edges_from((name, t) for t in targets)
        parent = name.rpartition(".")[0]
        while parent:
            graph.add_edge(name, parent)
            parent = parent.rpartition(".")[0]
    return graph, explicit


def circles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def layer_of(name: str, layers=LAYERS) -> int | None:
    best, best_len = None, -1
    for index, (_, names, _) in enumerate(layers):
        for pattern in names:
            if pattern == name:
                return index
            prefix = pattern[:-2] if pattern.endswith(".*") else None
            if prefix and (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def upward_imports(explicit: dict[str, set[str]], layers=LAYERS) -> list[str]:
    out = []
    for name, targets in sorted(explicit.items()):
        for target in sorted(targets):
            low, high = layer_of(name, layers), layer_of(target, layers)
            if high > low:
                out.append(f"{name} ({layers[low][0]}) imports {target} ({layers[high][0]})")
    return out


def test_core_imports_without_torch_or_mpi():
    code = (
        "import sys, importlib\n"
        f"for m in {CORE!r}: importlib.import_module(m)\n"
        "bad = [m for m in ('torch', 'mpi4py', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_no_import_circle():
    found = circles(import_graph(PACKAGE_DIR)[0])
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_has_a_layer():
    missing = [name for name in module_files(PACKAGE_DIR) if layer_of(name) is None]
    assert not missing, f"modules in no layer of LAYERS: {missing}"


def test_no_import_from_a_higher_layer():
    bad = upward_imports(import_graph(PACKAGE_DIR)[1])
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_the_checks_see_lazy_relative_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from pkg.sub import high  # lazy, upward, and a circle\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "high.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..low import f\n"
    )
    graph, explicit = import_graph(pkg)
    assert circles(graph) == [["pkg.low", "pkg.sub.high"]]
    layers = [("low", ["pkg", "pkg.low"], ""), ("high", ["pkg.sub.*"], "")]
    assert upward_imports(explicit, layers) == ["pkg.low (low) imports pkg.sub.high (high)"]
    (pkg / "low.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.high import f\n")  # a re-export closes a circle
    assert circles(import_graph(pkg)[0]) == [["pkg.sub", "pkg.sub.high"]]


# The folders directly under llm_planner, lowest first: a folder imports only from folders before it.
# Subfolders belong to their folder; inside one, LAYERS orders the modules. The planners (PLANNERS) sit
# side by side: none imports another.
FOLDERS: list[tuple[str, str]] = [
    ("llm_planner.core", "units, file I/O, processes, the cluster spec, the placement plan file"),
    ("llm_planner.graph", "task graphs: the IR and the builders of model graphs"),
    ("llm_planner.cost", "the cost model and the measured tables it reads"),
    ("llm_planner.mip", "solver backends"),
    ("llm_planner.placement", "the placement planner: problem, bounds, baselines, MILP, MILP-SPLIT, verifier"),
    ("llm_planner.serving", "the serving planner: its model, bounds, plan file, verifier and search"),
    ("llm_planner.helix", "planning for Helix's engine, Helix's files in and out"),
    ("llm_planner.export", "plans written for other frameworks"),
    ("llm_planner.measure", "measured against predicted, calibration"),
    ("llm_planner.runtime", "a rank's share of the model under MPI (torch)"),
    ("llm_planner.launch", "starting ranks with mpiexec: a plan's, or the profiling job's"),
    ("llm_planner.cli", "the command line"),
]
PLANNERS = ["llm_planner.placement", "llm_planner.serving", "llm_planner.helix"]
# The layers of the placement solvers (problem to solve api, inputs and checks aside): none reaches a loader.
SOLVER_LAYERS = (
    [n for n, *_ in LAYERS].index("placement base"),
    [n for n, *_ in LAYERS].index("placement solve"),
)

# What a solver may never reach, even through other modules: the loaders of input files (the cluster and
# plan readers are one function each in spec and plan, beside the data they read).
LOADERS = [
    "llm_planner.placement.inputs",
    "llm_planner.placement.verify_file",
    "llm_planner.cost.profile",
    "llm_planner.graph.workloads",
]

# Imports that may stay inside a function: those of heavy optional packages (planning never imports torch).
HEAVY = ("torch", "transformers", "safetensors", "mpi4py", "gurobipy", "matplotlib")


def folder_of(name: str) -> str:
    """The folder directly under the package that holds `name`; a top-level module is its own."""
    return ".".join(name.split(".")[:2])


def folder_imports(explicit: dict[str, set[str]]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for name, targets in explicit.items():
        graph.add_node(folder_of(name))
        graph.add_edges_from((folder_of(name), folder_of(t)) for t in targets if folder_of(t) != folder_of(name))
    return graph


def upward_folder_imports(explicit: dict[str, set[str]], folders=FOLDERS) -> list[str]:
    rank = {name: index for index, (name, _) in enumerate(folders)}
    out = []
    for name, targets in sorted(explicit.items()):
        for target in sorted(targets):
            low, high = rank.get(folder_of(name)), rank.get(folder_of(target))
            if low is not None and high is not None and high > low:
                out.append(f"{name} ({folder_of(name)}) imports {target} ({folder_of(target)})")
    return out


def heavy_reach(explicit: dict[str, set[str]]) -> set[str]:
    """Modules that import a heavy package at their top, directly or through another module."""
    graph = nx.DiGraph((a, t) for a, ts in top_level_imports(PACKAGE_DIR).items() for t in ts)
    direct = {name for name, path in module_files(PACKAGE_DIR).items() if _top_heavy(path)}
    return direct | {a for a in graph if any(d in direct for d in nx.descendants(graph, a))}


def _top_heavy(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n.split(".")[0] in HEAVY for n in names):
            return True
    return False


def top_level_imports(package_dir: Path) -> dict[str, set[str]]:
    """explicit_imports, counting only the statements at the top of each module."""
    modules = module_files(package_dir)
    out = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        top = ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
        out[name] = explicit_imports(name, path, modules, tree=top)
    return out


def function_level_imports(package_dir: Path) -> list[tuple[str, int, list[str]]]:
    """(module, line, imported names) of every import statement inside a function."""
    out = []
    for name, path in module_files(package_dir).items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        out.append((name, node.lineno, [a.name for a in node.names]))
                    elif isinstance(node, ast.ImportFrom):  # `from a import b` imports a, and a.b when a module
                        module = node.module or ""
                        out.append((name, node.lineno, [module, *(f"{module}.{a.name}" for a in node.names)]))
    return out


def test_every_folder_has_a_layer():
    folders = {folder_of(name) for name, path in module_files(PACKAGE_DIR).items() if path.name == "__init__.py"}
    missing = sorted(folders - {name for name, _ in FOLDERS} - {"llm_planner"})
    assert not missing, f"folders in no place of FOLDERS: {missing}"


def test_no_import_from_a_higher_folder_and_no_circle_between_folders():
    explicit = import_graph(PACKAGE_DIR)[1]
    bad = upward_folder_imports(explicit)
    assert not bad, "imports from a higher folder:\n" + "\n".join(bad)
    found = circles(folder_imports(explicit))
    assert not found, "circles between folders: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_solver_reaches_a_file_loader():
    graph = import_graph(PACKAGE_DIR)[0]
    solvers = [
        name for name in graph if layer_of(name) is not None and SOLVER_LAYERS[0] <= layer_of(name) <= SOLVER_LAYERS[1]
    ]
    solvers = [name for name in solvers if name not in LOADERS and not name.startswith("llm_planner.placement.verify")]
    bad = sorted({(s, loader) for s in solvers for loader in LOADERS if loader in nx.descendants(graph, s)})
    assert not bad, "solver modules that reach a file loader: " + ", ".join(f"{s} -> {loader}" for s, loader in bad)


def planner_imports(explicit: dict[str, set[str]], planners=PLANNERS) -> list[str]:
    """Imports from one planner's folder into another's."""
    return [
        f"{name} imports {target}"
        for name, targets in sorted(explicit.items())
        for target in sorted(targets)
        if folder_of(name) in planners and folder_of(target) in planners and folder_of(name) != folder_of(target)
    ]


def test_planners_never_import_one_another():
    bad = planner_imports(import_graph(PACKAGE_DIR)[1])
    assert not bad, "planners import one another:\n" + "\n".join(bad)
    assert planner_imports({"llm_planner.helix.plan": {"llm_planner.serving.context"}}) == [
        "llm_planner.helix.plan imports llm_planner.serving.context"
    ]


def test_the_top_level_holds_a_handful_of_modules():
    top = [p.name for p in PACKAGE_DIR.glob("*.py")]
    assert len(top) <= 5, f"modules at the top of the package: {sorted(top)}"


def test_function_level_imports_only_for_heavy_optional_packages():
    explicit = import_graph(PACKAGE_DIR)[1]
    heavy = heavy_reach(explicit)
    bad = [
        f"{name}:{line} imports {', '.join(names)} inside a function"
        for name, line, names in function_level_imports(PACKAGE_DIR)
        if not any(n.split(".")[0] in HEAVY or n in heavy for n in names)
    ]
    assert not bad, "move these to the top of their module:\n" + "\n".join(bad)


def test_the_folder_checks_fail_on_an_upward_import_a_loader_and_a_lazy_light_import(tmp_path):
    explicit = {
        "llm_planner.graph.ir": {"llm_planner.placement.solve"},
        "llm_planner.placement.solve": {"llm_planner.graph.ir"},
    }
    assert upward_folder_imports(explicit) == [
        "llm_planner.graph.ir (llm_planner.graph) imports llm_planner.placement.solve (llm_planner.placement)"
    ]
    assert circles(folder_imports(explicit)) == [["llm_planner.graph", "llm_planner.placement"]]
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    import json\n    import torch\n")
    assert function_level_imports(pkg) == [("pkg.a", 2, ["json"]), ("pkg.a", 3, ["torch"])]
    assert [names for *_, names in function_level_imports(pkg)] == [["json"], ["torch"]]
