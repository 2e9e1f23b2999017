"""The package's import graph points one way: no cycles, and the engine loads no parser, data, models or torch."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import asyncfl

PACKAGE = Path(asyncfl.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = ("asyncfl",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    return {id(node) for block in ast.walk(tree) if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)}


def import_graph() -> dict[str, set[str]]:
    """Module -> asyncfl modules it imports anywhere (module level or inside functions; not for type checking).

    ``from package import name`` counts as importing ``package.name`` when that is a module. A module's own
    parent packages are not counted (Python runs them first whatever the module imports).
    """
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_blocks(tree)
        targets = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("asyncfl"):
                targets.add(node.module)
                targets |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("asyncfl")}
        own_parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {t for t in targets if t in modules and t != name and t not in own_parents}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_importing_the_engine_loads_no_run_config_parser_data_models_or_torch():
    code = ("import sys, asyncfl.server_app.engine; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('asyncfl.config', 'asyncfl.data', "
            "'asyncfl.models', 'asyncfl.client_app'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_the_engine_names_no_clock():
    """Clock behaviour lives in server_app/clock.py; the engine asks its Clock object."""
    source = (PACKAGE / "server_app" / "engine.py").read_text()
    tree = ast.parse(source)
    literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    assert not literals & {"virtual", "wall"}


def test_the_names_ides_see_are_the_public_names_loaded_on_first_use_less_the_registrys_methods():
    """The methods are named once, by the registry (a new one touches its own module only); every other public name
    is also listed for type checkers."""
    from asyncfl.strategies.registry import class_modules

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
    seen = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    methods = class_modules()
    assert not set(seen) & set(methods)
    assert seen == {name: module for name, module in asyncfl._PUBLIC.items() if name not in methods}


def test_no_module_reads_the_engines_private_names():
    """The engine's state is its EngineState; what other modules do with an engine goes through public names
    (resume, journal), not a mixin reaching into its privates."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "engine.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bengine\._[a-z]", line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}")
    assert offenders == []


@pytest.mark.parametrize("module, most", [("server_app/engine.py", 450), ("strategies/base.py", 200)])
def test_the_engine_and_the_strategy_interface_stay_small(module, most):
    """One reply, one straight path: the loop and the reply path; the method interface apart from pacing, hooks
    and state (issue 41)."""
    assert len((PACKAGE / module).read_text().splitlines()) < most


def test_no_function_of_the_server_side_runtime_is_over_60_lines():
    """Issue 58: fewer layers, not bigger functions; a reader follows each step of the reply path in one screen."""
    import ast

    long = []
    for path in sorted((PACKAGE / "server_app").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
