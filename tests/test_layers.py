"""The import graph: every import runs downward, and no module reaches itself through imports.

Two levels of layers, lowest first:
- the project's packages: ``inference`` < ``storage`` < ``envs`` < ``training`` < ``grpo_service``
  < ``tools``;
- inside ``grpo_service``, the floors of `GRPO_SERVICE_FLOORS` (the package's docstring and
  docs/architecture.md say what each holds). A module imports its own unit or a lower floor;
  two units on the same floor never import each other.

Every import statement counts: at module level, inside functions, and under ``TYPE_CHECKING``
(an import that only a type checker runs is still an arrow in the architecture).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("inference", "storage", "envs", "training", "grpo_service", "tools")

# Lowest first; a unit is a top-level module or subpackage of grpo_service. Units on one floor
# are peers: neither imports the other.
GRPO_SERVICE_FLOORS: tuple[tuple[str, ...], ...] = (
    ("version", "gc_tuning", "config", "models"),  # the ground floor: imports nothing of ours
    ("errors",),
    ("client",),  # what a trainer imports: wire types only, never the server
    ("core",),
    ("tracing",),
    ("rollout", "training_api", "reporting"),
    ("api",),
    ("protocols",),
    ("cluster",),
    ("app",),
    ("serving", "__init__"),
    ("cli",),
)
FLOOR = {unit: n for n, units in enumerate(GRPO_SERVICE_FLOORS) for unit in units}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports, wherever the import stands (functions and
    ``TYPE_CHECKING`` blocks included). ``from pkg import name`` is an import of ``pkg.name``
    when that is a module, else of ``pkg``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {name for name in found if name.split(".")[0] in LAYERS}


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for layer in LAYERS for p in sorted((root / layer).rglob("*.py"))}


def unit_of(module: str) -> str:
    """``grpo_service.api.routes.env`` → ``api``; the package itself → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def back_arrows(root: Path = ROOT) -> list[str]:
    modules = project_modules(root)
    names = set(modules)
    wrong = []
    for name, path in modules.items():
        layer = LAYERS.index(name.split(".")[0])
        for imported in sorted(imports(path, names)):
            if LAYERS.index(imported.split(".")[0]) > layer:
                wrong.append(f"{name} imports {imported} (a higher package)")
            elif name.startswith("grpo_service") and imported.startswith("grpo_service"):
                mine, theirs = unit_of(name), unit_of(imported)
                if mine != theirs and FLOOR[theirs] >= FLOOR[mine]:
                    wrong.append(f"{name} ({mine}) imports {imported} ({theirs}): not a lower floor")
    return wrong


def cycles(root: Path = ROOT) -> list[list[str]]:
    modules = project_modules(root)
    names = set(modules)
    graph = {
        name: {i for i in imports(path, names) if i in names and i != name} for name, path in modules.items()
    }
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_every_grpo_service_unit_has_a_floor() -> None:
    units = {unit_of(m) for m in project_modules() if m.startswith("grpo_service")}
    assert units <= set(FLOOR), f"place these in GRPO_SERVICE_FLOORS: {sorted(units - set(FLOOR))}"


def test_layers_import_only_downward() -> None:
    wrong = back_arrows()
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    found = cycles()
    assert not found, "\n".join(" -> ".join(c) for c in found)


def _copy_tree(tmp_path: Path) -> Path:
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            target = tmp_path / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


def test_a_back_import_inside_a_function_is_caught(tmp_path: Path) -> None:
    """The checks see what a runtime-only import hides: a function-level import of the app from
    the core is both a back arrow and a circle."""
    root = _copy_tree(tmp_path)
    registry = root / "grpo_service/core/registry.py"
    registry.write_text(
        registry.read_text() + "\n\ndef _sneak():\n    from grpo_service.app import create_app\n\n"
        "    return create_app\n"
    )
    assert any("grpo_service.core.registry (core) imports grpo_service.app" in w for w in back_arrows(root))
    assert any("grpo_service.core.registry" in c and "grpo_service.app" in c for c in cycles(root))


def test_a_back_import_under_type_checking_is_caught(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    forks = root / "grpo_service/rollout/forks.py"
    forks.write_text(
        forks.read_text() + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from grpo_service.api.services import Services\n"
    )
    assert any(
        "grpo_service.rollout.forks (rollout) imports grpo_service.api" in w for w in back_arrows(root)
    )
