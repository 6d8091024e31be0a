"""The drawn structure holds (docs/architecture.md, "Layers"): imports only point down, and no
module imports itself back through others. Read from the source, every import statement, also
those inside functions. And no module grows past one idea's length."""

import ast
from pathlib import Path

from tests.support.source import parse

ROOT = Path(__file__).resolve().parents[1]
# Lowest first. chat imports observability (a turn records its row); observability never imports
# chat. spend (limits and budgets) is asked by the pipeline, so it sits under routing and imports
# only the ground. benchmarks, devtools and tests may import anything and are not listed.
LAYERS = [
    "core",
    "privacy",
    "inference_ops",
    "knowledge",
    "spend",
    "routing",
    "observability",
    "chat",
    "config",
]
RANK = {package: rank for rank, package in enumerate(LAYERS)}


def _modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project's modules `path` imports (a `from package import module` counts the module)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            # `from package import module` imports the module; `from module import name`, the
            # module (a package's own __init__ runs either way and is not counted).
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, set(modules)) for name, path in modules.items()}


def test_imports_only_point_down():
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in _graph().items()
        for target in targets
        if RANK[target.partition(".")[0]] > RANK[name.partition(".")[0]]
    )
    assert not upward, upward


def test_no_module_imports_itself_back():
    graph = _graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not circles, circles


# One idea per module (CONTRIBUTING.md, "Code style"): past this a module has grown a second idea
# to split off. Migrations are generated and the settings are a table of sections, each its own
# module; the harness and the development tools are held to it as the product is.
MAX_MODULE_LINES = 450
SIZED = [*LAYERS, "benchmarks", "devtools"]


def test_no_module_is_longer_than_one_idea():
    long = sorted(
        f"{path.relative_to(ROOT)}: {lines} lines"
        for package in SIZED
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
        and (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    )
    assert not long, f"over {MAX_MODULE_LINES} lines: {long}"
