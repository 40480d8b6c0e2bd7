"""The import graph: layers only import downward, and no module imports itself in a cycle.

Layers, lowest first: ``inference`` < ``storage`` < ``envs`` < ``training`` < ``grpo_service``
< ``tools``. Every import statement counts, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("inference", "storage", "envs", "training", "grpo_service", "tools")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """The project modules ``path`` imports, each with whether the import runs at load time."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, top))
                found.extend((f"{child.module}.{alias.name}", top) for alias in child.names)
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return [(name, top) for name, top in found if name.split(".")[0] in LAYERS]


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def test_layers_import_only_downward() -> None:
    wrong = []
    for name, path in project_modules().items():
        layer = LAYERS.index(name.split(".")[0])
        for imported, _ in imports(path):
            if LAYERS.index(imported.split(".")[0]) > layer:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_at_load_time() -> None:
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:n]) for n in range(1, name.count(".") + 2)}  # itself, its packages
        edges = set()
        for imported, top in imports(path):
            if not top:
                continue
            parts = imported.split(".")
            # Importing a.b.c runs the packages a and a.b first: they count as imported too.
            for n in range(1, len(parts) + 1):
                target = ".".join(parts[:n])
                if target in modules and target not in own:
                    edges.add(target)
        graph[name] = edges
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
