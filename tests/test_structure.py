"""The package's shape: imports point downward (no cycle), modules stay short, tables stay true.

Built from the package's own source with ``ast``: every import of a retryfs module by a
retryfs module, at any depth (an import inside a function counts: hiding a cycle there is
what this test is for). Optional third-party dependencies are not retryfs modules and so are
not in the graph.
"""

import ast
import inspect
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "retryfs"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """``{module: the retryfs modules it imports}``."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                # `from . import budget` imports the submodule, not the package's __init__
                subs = [f"{module}.{alias.name}" for alias in node.names
                        if f"{module}.{alias.name}" in modules]
                targets = subs if subs else [module]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # retryfs.testing.s3.X -> module
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("retryfs"):
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "retryfs.config" in graph["retryfs.arrow.filesystem"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_forwarded_fsspec_methods_are_the_installed_fsspec_ones():
    """The fsspec face's explicit tables against what fsspec really has: a new fsspec method
    must be added to the table (and so retried), a gone one removed."""
    from fsspec.asyn import AsyncFileSystem, async_methods
    from fsspec.spec import AbstractFileSystem

    from retryfs.fsspec.filesystem import _NOT_RETRIED, ASYNC_METHODS, SYNC_METHODS

    public = {name for name, value in vars(AbstractFileSystem).items()
              if not name.startswith("_") and name not in _NOT_RETRIED
              and inspect.isfunction(value)}
    assert set(SYNC_METHODS) == public
    coroutines = set(async_methods) | {
        name for name, value in vars(AsyncFileSystem).items()
        if name.startswith("_") and not name.startswith("__")
        and (inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value))}
    coroutines.discard("_process_limits")  # a helper of _cat_file, not an operation
    assert set(ASYNC_METHODS) == coroutines


def test_dead_code_is_gone():
    import retryfs.core.engine
    import retryfs.core.policy

    assert not hasattr(retryfs.core.policy, "group_of")
    assert not hasattr(retryfs.core.engine.Retrier, "decide")
    assert not hasattr(retryfs.core.engine.Retrier, "timeout_for")


#: The package's floors, lowest first: a module imports only from its own floor and the ones
#: below it (README, "Development": the layout). A module's floor is that of the longest name
#: here that it starts with.
FLOORS = [
    ("retryfs.errors", "retryfs._moved"),
    ("retryfs.core",),
    ("retryfs.config",),
    ("retryfs.clients", "retryfs.datapath"),
    ("retryfs.patches",),
    ("retryfs.arrow",),
    ("retryfs.fsspec",),
    ("retryfs.uri",),
    ("retryfs.transfer",),
    ("retryfs.integrations", "retryfs.testing"),
    ("retryfs.demo",),
    ("retryfs.cli",),
    ("retryfs", "retryfs.__main__"),
]


def floor_of(module: str) -> int:
    best, floor = "", -1
    for number, names in enumerate(FLOORS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, floor = name, number
    assert floor >= 0, f"{module}: give it a floor in FLOORS"
    return floor


def test_every_import_points_down_the_floors():
    upward = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                    for target in targets if floor_of(target) > floor_of(module))
    assert upward == []


def test_the_root_holds_a_dozen_modules_and_each_subpackage_says_what_lives_there():
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= 12, root
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.parent.name}: say in its __init__ what lives there"
        first = doc.split("\n\n")[0]
        assert len(first.splitlines()) <= 2, f"{init.parent.name}: in two lines, not {first!r}"


def test_import_retryfs_leaves_the_demo_the_command_and_the_test_tools_alone():
    import subprocess
    import sys

    probe = ("import sys, retryfs; print(sorted(m for m in sys.modules if m == 'retryfs.cli' or "
             "m.startswith(('retryfs.demo', 'retryfs.testing', 'retryfs.integrations'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"
