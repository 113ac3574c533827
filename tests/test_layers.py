"""The package's layers run one way (docs/design.md, "Layers, one way"), checked from the source.

Every import statement in tangram_opt is read with ``ast`` — at module level and inside functions,
where lazy imports hide — and mapped to the layer of the module it names. The rules:

1. a module imports its own layer and the layers below it, never one above (no upward imports,
   hence no import cycles between layers);
2. the formulations and the multi-pipeline level see only candidate tables: they neither import
   ``tangram_opt.cost`` nor read a ``.cost`` attribute (a context's cost model);
3. a MIP module (positional, aggregated, sequence) is imported by the formulations, the search and
   the analysis helpers only: the shared problem types live in formulations/problem.py;
4. module-level imports (not the lazy ones inside functions, nor ``TYPE_CHECKING`` ones) form no
   cycle at all, inside a layer included;
5. every module has a layer (a new one is placed in :data:`LAYERS` on purpose).

The second half feeds the checker the violations issue 28 found in the old flat planner, rebuilt
in the new layout, and shows that each one is reported.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import tangram_opt

PACKAGE_DIR = Path(tangram_opt.__file__).resolve().parent

#: lowest first; a module belongs to the layer of its longest matching prefix ("=name": that module only)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("units and errors", ("tangram_opt.units", "tangram_opt.errors")),
    # the package root ("=": this module only) imports errors and specs; everything else it names
    # lazily, by string
    ("specs", ("tangram_opt.specs", "=tangram_opt")),
    ("cost model and solver backends", ("tangram_opt.cost", "tangram_opt.solvers")),
    ("expert placement", ("tangram_opt.experts",)),
    ("plan space, islands, plans", ("=tangram_opt.planner", "tangram_opt.planner.space", "tangram_opt.planner.islands",
                                    "tangram_opt.planner.plan", "tangram_opt.planner.plan_summary")),
    ("candidate tables", ("tangram_opt.planner.candidates",)),
    ("formulations", ("tangram_opt.planner.formulations",)),
    ("planning context", ("tangram_opt.planner.context", "tangram_opt.planner.assemble",
                          "tangram_opt.planner.diagnose")),
    ("baselines and the multi-pipeline level", ("tangram_opt.baselines", "tangram_opt.planner.multi_pipeline")),
    ("search", ("tangram_opt.planner.search",)),
    ("consumers", ("tangram_opt.sim", "tangram_opt.export", "tangram_opt.show", "tangram_opt.analysis",
                   "tangram_opt.testing", "tangram_opt.profiling", "tangram_opt.calibrate", "tangram_opt.costing",
                   "tangram_opt.sweeps")),
    ("command line", ("tangram_opt.cli", "tangram_opt.__main__")),
)
#: modules that see only candidate tables (rule 2)
TABLES_ONLY = ("tangram_opt.planner.formulations", "tangram_opt.planner.multi_pipeline")
#: the MIP modules and who may import them (rule 3)
MIP_MODULES = ("tangram_opt.planner.formulations.positional", "tangram_opt.planner.formulations.aggregated",
               "tangram_opt.planner.formulations.aggregated_rows", "tangram_opt.planner.formulations.stage_sequence")
MIP_IMPORTERS = ("tangram_opt.planner.formulations", "tangram_opt.planner.search", "tangram_opt.analysis",
                 "tangram_opt.testing")


def _matches(module: str, prefix: str) -> bool:
    if prefix.startswith("="):
        return module == prefix[1:]
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for rank, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if _matches(module, p) and (best is None or len(p) > best[0]):
                best = (len(p), rank)
    return None if best is None else best[1]


def package_sources(directory: Path = PACKAGE_DIR) -> dict[str, tuple[str, bool]]:
    """Module name -> (source, is a package ``__init__``) for every module of the package."""
    out = {}
    for f in sorted(directory.rglob("*.py")):
        parts = list(f.relative_to(directory.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f.read_text(encoding="utf-8"), is_pkg)
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers of the statements under ``if TYPE_CHECKING:`` (annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def imports_of(module: str, source: str, is_pkg: bool, modules: set[str]) -> list[tuple[int, str, bool, bool]]:
    """(line, imported module, at module level, for type checking only) of every tangram_opt import
    in ``source``; a name imported from a package is the submodule when one has that name."""
    tree = ast.parse(source)
    guarded = _type_checking_lines(tree)
    top = {id(n) for n in tree.body}
    package = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[:len(anchor) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in dict.fromkeys(targets):
            if _matches(t, "tangram_opt"):
                out.append((node.lineno, t, id(node) in top, node.lineno in guarded))
    return out


def _reads_cost(source: str) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute) and n.attr == "cost"]


def violations(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Every breach of the rules in ``sources`` (module name -> (source, is a package))."""
    modules = set(sources)
    out: list[str] = []
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, (source, is_pkg) in sorted(sources.items()):
        rank = layer_of(module)
        if rank is None:
            out.append(f"{module} has no layer: add it to LAYERS in tests/test_layers.py")
            continue
        for line, target, at_top, type_only in imports_of(module, source, is_pkg, modules):
            to = layer_of(target)
            if to is not None and to > rank:
                out.append(f"{module}:{line} imports {target}: upward, from layer '{LAYERS[rank][0]}' to "
                           f"'{LAYERS[to][0]}'")
            if any(_matches(module, p) for p in TABLES_ONLY) and _matches(target, "tangram_opt.cost"):
                out.append(f"{module}:{line} imports the cost model ({target}): formulations see candidate tables only")
            if any(_matches(target, p) for p in MIP_MODULES) and not any(_matches(module, p) for p in MIP_IMPORTERS):
                out.append(f"{module}:{line} imports the MIP module {target}: shared problem types are in "
                           "tangram_opt.planner.formulations.problem")
            if at_top and not type_only and target in modules and target != module:
                edges[module].add(target)
        if any(_matches(module, p) for p in TABLES_ONLY):
            out += [f"{module}:{line} reads a cost model (.cost): formulations see candidate tables only"
                    for line in _reads_cost(source)]
    out += _cycles(edges)
    return out


def _cycles(edges: dict[str, set[str]]) -> list[str]:
    """Module-level import cycles (a package's ``__init__`` importing its own modules is not one)."""
    def parent_of(a: str, b: str) -> bool:
        return b.startswith(a + ".")

    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if parent_of(m, t) or parent_of(t, m):
                continue
            if state.get(t) == 1:
                found.append("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def test_the_package_imports_one_way():
    assert violations(package_sources()) == []


# --- the checker catches what issue 28 found (rebuilt in today's layout) -------------------------
BAD = {
    "the multi-pipeline level prices the sync with the context's cost model (multi.py:256-297)": (
        "tangram_opt.planner.multi_pipeline.templates",
        "def piece_bytes(ctx, node, cfg):\n    return ctx.cost.layer(node, cfg, 'dense').grad_bytes\n",
        "reads a cost model"),
    "a formulation imports the cost model": (
        "tangram_opt.planner.multi_pipeline.templates", "from tangram_opt.cost import StageConfig\n",
        "imports the cost model"),
    "a formulation imports a cost submodule": (
        "tangram_opt.planner.formulations.aggregated", "import tangram_opt.cost.model\n", "imports the cost model"),
    "the multi-pipeline level calls solve (multi.py:537 <-> search.py:319)": (
        "tangram_opt.planner.multi_pipeline.generation",
        "def templates():\n    from tangram_opt.planner.search import solve\n", "upward"),
    "the homogeneous baseline calls solve while the search imports the greedy one (homogeneous.py:209)": (
        "tangram_opt.baselines.homogeneous", "def best():\n    from tangram_opt.planner.search import solve\n",
        "upward"),
    "a plan renders itself with tangram_opt.show (plan.py:239, 245)": (
        "tangram_opt.planner.plan", "def summary(plan):\n    from tangram_opt.show.summary import summary_text\n",
        "upward"),
    "the context imports the positional MIP for PipelineProblem": (
        "tangram_opt.planner.context", "from tangram_opt.planner.formulations.positional import PositionalMIP\n",
        "imports the MIP module"),
    "a baseline imports the positional MIP for StageChoice": (
        "tangram_opt.baselines.greedy", "from tangram_opt.planner.formulations.positional import PositionalMIP\n",
        "imports the MIP module"),
    "a module-level import cycle inside one layer": (
        "tangram_opt.planner.formulations.problem", "from tangram_opt.planner.formulations.bounds import quick_lower_bound\n",
        "import cycle"),
    "a module nobody placed": ("tangram_opt.planner.helpers", "import math\n", "has no layer"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_violation_of_issue_28_is_reported(case):
    module, snippet, expected = BAD[case]
    sources = package_sources()
    source, is_pkg = sources.get(module, ("", False))
    sources[module] = (source + "\n" + snippet, is_pkg)
    found = violations(sources)
    assert found and all(module in v or "import cycle" in v for v in found), found
    assert any(expected in v for v in found), found


# --- one name, one thing --------------------------------------------------------------------------
#: public (not underscore-prefixed) top-level class or function names defined in more than one
#: module, each kept on purpose; any other duplicate fails. Underscore-prefixed helpers are private
#: to their module and may repeat (``__getattr__``/``__dir__`` of lazily importing packages too).
KNOWN_DUPLICATES = {
    # the entry point of each module run with ``python -m`` (command line, solver worker, sweep
    # worker, picture script); never imported by name from two places
    "main": {"tangram_opt.cli", "tangram_opt.solvers.workers", "tangram_opt.sweeps.worker",
             "tangram_opt.show.make_pictures"},
    # the simulator's operation order is its own implementation on purpose: it never sees the
    # planner's model (docs/design.md), and the two agreeing is one of the tests
    "op_order": {"tangram_opt.planner.formulations.pipeline_model", "tangram_opt.sim.simulate"},
}


def top_level_homes(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Public top-level class and function name -> the modules defining it."""
    homes: dict[str, set[str]] = {}
    for module, (source, _) in sources.items():
        for node in ast.parse(source).body:
            if (isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and not node.name.startswith("_")):
                homes.setdefault(node.name, set()).add(module)
    return homes


def test_public_classes_and_functions_have_one_home():
    twice = {name: mods for name, mods in top_level_homes(package_sources()).items() if len(mods) > 1}
    assert twice == KNOWN_DUPLICATES, twice


def test_a_second_class_of_the_same_name_is_reported():
    sources = package_sources()
    source, is_pkg = sources["tangram_opt.experts.placement"]
    sources["tangram_opt.experts.placement"] = (source + "\n\nclass Certificate:\n    pass\n", is_pkg)
    homes = top_level_homes(sources)
    assert homes["Certificate"] == {"tangram_opt.planner.plan", "tangram_opt.experts.placement"}


@pytest.mark.parametrize("module, old, new", [
    ("tangram_opt.experts", "Placement", "ExpertPlacement"),
    ("tangram_opt.experts", "Certificate", "PlacementCertificate"),
    ("tangram_opt.experts", "load_profile", "synthetic_expert_loads"),
    ("tangram_opt.experts.placement", "Placement", "ExpertPlacement"),
    ("tangram_opt.experts.placement", "Certificate", "PlacementCertificate"),
    ("tangram_opt.experts.profiles", "load_profile", "synthetic_expert_loads"),
    ("tangram_opt", "load_profile", "synthetic_expert_loads"),
])
def test_renamed_names_still_work_with_a_warning(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new):
        value = getattr(mod, old)
    assert value is getattr(importlib.import_module("tangram_opt.experts"), new)
    assert old not in getattr(mod, "__all__", ())


# --- a layout a newcomer can read -----------------------------------------------------------------
#: modules over ~600 lines, each one cohesive algorithm (docs/design.md, "Where things are", says why)
LONG_MODULES = {"tangram_opt.cost.model", "tangram_opt.sim.simulate"}
MAX_LINES = 600


def test_no_module_over_600_lines_but_the_named_ones():
    long = {module for module, (source, _) in package_sources().items() if source.count("\n") > MAX_LINES}
    assert long <= LONG_MODULES, f"over {MAX_LINES} lines: {sorted(long - LONG_MODULES)} (split it, or say in " \
                                 "docs/design.md why it is one algorithm and name it in LONG_MODULES)"
    design = (PACKAGE_DIR.parent / "docs" / "design.md").read_text(encoding="utf-8")
    for module in LONG_MODULES:
        assert module.removeprefix("tangram_opt.").replace(".", "/") + ".py" in design, module


def test_every_package_says_what_it_holds_and_its_layer():
    for module, (source, is_pkg) in package_sources().items():
        if is_pkg:
            doc = ast.get_docstring(ast.parse(source)) or ""
            assert len(doc) > 40 and "layer" in doc.lower(), f"{module}/__init__.py: say what it holds and its layer"
