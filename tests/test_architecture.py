"""The package keeps its shape: imports flow one way (no cycle), files and functions stay small enough to read."""

import ast
from pathlib import Path

from .conftest import REPO

PACKAGE = REPO / "study"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The study modules a module imports at run time, lazily inside functions too (not under TYPE_CHECKING)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("study"):
            for a in node.names:  # `from study.tasks import sudoku` names a module; `... import TASKS` does not
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: imports(ast.parse(p.read_text()), set(files)) - {m} for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := dfs(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := dfs(m)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "study.tasks.loader" in graph["study.config.loading"]  # the walk sees lazy imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_a_planted_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_is_longer_than_400_lines():
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, long


def test_no_function_is_longer_than_60_lines():
    long = {}
    for p in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}:{node.name}"] = n
    assert not long, long


def test_store_schemas_come_from_the_row_definitions():
    import dataclasses

    from study.rows import ROWS
    from study.store import SCHEMAS

    for table, cls in ROWS.items():
        assert SCHEMAS[table].names[2:] == [f.name for f in dataclasses.fields(cls)], table
