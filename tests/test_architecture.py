"""The package keeps its shape: the folder tree reads the path of data, imports flow one way (from a stage to the
stages below it, never up, never in a cycle, annotations included), files and functions stay small enough to read."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from .conftest import REPO

PACKAGE = REPO / "study"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
# shared leaf helpers at the top of study/ (plugins.py: the entry-point discovery that tasks and config both use);
# everything else lives in its stage's package
MAX_LOOSE_MODULES = 7

# The stages, lowest first: a module may import its own stage and the ones before it, never a later one. Data flows
# spec -> run (Ray) -> trial (train, evaluate at depth) -> store -> analysis; the imports run the other way round
# for the parts each stage builds on (a trial writes through the store; the driver runs trials and reads the spec).
STAGES = [
    "study",  # the loose leaf helpers (errors, console, paths, bounds, metrics, rows) and the package data
    "study.tasks",
    "study.config",
    "study.models",
    "study.evaluate",
    "study.store",
    "study.trial",
    "study.spec",
    "study.run",
    "study.analysis",
    "study.cli",
]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The study modules a module imports: at import time, lazily inside functions and under TYPE_CHECKING alike
    (a name for an annotation is a dependency too)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
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


def stage(module: str) -> int:
    """The index in STAGES of the package a module belongs to (the loose modules are stage 0)."""
    parts = module.split(".")
    name = ".".join(parts[:2]) if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "study"
    return STAGES.index(name)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} imports {n}" for m, ns in sorted(graph.items()) for n in sorted(ns) if stage(n) > stage(m)]


def test_no_stage_imports_a_later_one():
    graph = import_graph()
    assert "study.tasks" in graph["study.config.schema"]  # the walk sees the config's use of the task settings
    assert not upward_imports(graph), "\n".join(upward_imports(graph))


def test_a_planted_upward_import_is_found():
    assert upward_imports({"study.store.scan": {"study.analysis.tables"}}) == [
        "study.store.scan imports study.analysis.tables"]
    assert upward_imports({"study.analysis.tables": {"study.store.scan"}}) == []


def test_every_stage_is_a_package_and_few_modules_stay_loose():
    packages = {f"study.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages - {"study.data"} == set(STAGES[1:])
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_MODULES, loose


def test_config_and_tasks_do_not_import_each_other_and_the_store_needs_neither_nor_torch():
    graph = import_graph()
    assert not [m for m, ns in graph.items() if m.startswith("study.tasks") for n in ns if n.startswith("study.config")]
    code = ("import sys, study.store; print(sorted(m for m in sys.modules if m == 'torch' or "
            "m.startswith(('study.tasks', 'study.config', 'study.models'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_line_is_longer_than_the_ruff_limit():
    limit = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]
    long = [f"{p.relative_to(REPO)}:{i}" for p in PACKAGE.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if len(line) > limit]
    assert not long, long


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


def test_the_cluster_image_runs_the_ray_that_pyproject_pins():
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ray = next(p for p in pins if p.startswith("ray["))
    version = ray.split("==", 1)[1]
    image = next(line for line in (REPO / "Dockerfile").read_text().splitlines() if line.startswith("ARG RAY_IMAGE"))
    assert f"rayproject/ray:{version}-" in image, (ray, image)


# What a reading command may not import: half a second (pandas) to 1.7 s (torch) each at every start on two cores,
# which made `loopstudy status` several times slower than the read it answers.
HEAVY = ("torch", "matplotlib", "pandas", "scipy.stats", "ray")


def test_the_reading_commands_start_without_torch_matplotlib_pandas_or_ray(tmp_path):
    from study.store import Store
    from study.store.layout import spec_file

    from .test_figures import write_study

    store = Store(tmp_path)
    write_study(store, "s", ["a", "b"])
    tiny = (REPO / "tests" / "specs" / "tiny.yaml").read_text()
    store.put_text(spec_file("s"), tiny.replace("name: tiny", "name: s"))
    commands = [["ls"], ["status", "s"], ["table", "depth", "--study", "s", "--all"],
                ["table", "compare", "--study", "s", "--all", "--baseline", "a"],
                ["query", "SELECT count(*) FROM trials"]]
    code = ("import sys; from study.cli import main\n"
            f"for args in {commands!r}: assert main([*args, '--store', {str(tmp_path)!r}]) == 0, args\n"
            f"print(sorted(m for m in sys.modules if m in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
