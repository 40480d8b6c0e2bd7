"""docs/configuration.md names every environment variable the code reads, and only those.

The packages are parsed with `ast`, never imported (no torch, no Ray, no Modal): fast, and it
sees code behind optional imports too. A variable counts as read when it is

- a field of a pydantic-settings class (`Settings` in grpo_service/config.py): its env name is
  ``env_prefix`` + the field's alias (``validation_alias`` / ``alias``) or name, upper-cased
  unless the model is ``case_sensitive``;
- a literal (or a module-level string constant, also one imported from another scanned module)
  passed to ``os.environ.get`` / ``os.environ[...]`` (load, not store) / ``os.getenv`` /
  ``os.environ.setdefault`` / ``os.environ.pop``, or tested with ``"X" in os.environ``;
- the ``envvar=`` of a typer option or argument.

Variables only SET for a child process (``{**os.environ, "X": ...}``, ``runtime_env``,
``modal.Image.env``, ``os.environ.update``) are not reads and are not looked at.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
PACKAGES = ("grpo_service", "envs", "training", "inference", "storage", "tools")
SCRIPTS = ("main.py", "modal_vllm.py")
SETTINGS_BASES = {"BaseSettings"}

# Variables of other programs that the code reads only to give them a default for that program
# (``os.environ.setdefault``): the program reads them, the project never does, and a value a
# user sets means what that program's documentation says. docs/configuration.md lists them in
# prose ("Set for other programs"), not in its tables. Each entry must still be read by the code
# (a stale entry fails `test_allow_list_is_current`).
OTHER_PROGRAMS = {
    # Ray's usage reporting, off before `import ray` (grpo_service/cluster/cluster.py).
    "RAY_USAGE_STATS_ENABLED": "Ray",
    # OpenMP's thread count in a training job's process, = its torch threads (training/jobs.py).
    "OMP_NUM_THREADS": "OpenMP (torch)",
    # Hugging Face: load only local checkpoints, no telemetry or progress bars (training/llm).
    "HF_HUB_OFFLINE": "huggingface_hub",
    "TRANSFORMERS_OFFLINE": "transformers",
    "HF_HUB_DISABLE_TELEMETRY": "huggingface_hub",
    "HF_HUB_DISABLE_PROGRESS_BARS": "huggingface_hub",
}

ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# A table row whose first cell names variables: | `A`, `B` | ... |
TABLE_ROW = re.compile(r"^\|\s*(`[^|]*`)\s*\|")


def source_files() -> list[Path]:
    files = [ROOT / name for name in SCRIPTS]
    for package in PACKAGES:
        files += sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def string_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "literal"`` (and annotated) assignments."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update((t.id, value.value) for t in targets if isinstance(t, ast.Name))
    return out


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _literal(node: ast.expr | None, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    return None


class Reads(ast.NodeVisitor):
    """Environment variables one module reads, with the line of each read."""

    def __init__(self, tree: ast.Module, names: dict[str, str], where: str) -> None:
        self.names = names
        self.where = where
        self.found: list[tuple[str, str]] = []  # (variable, "path:line")
        self.unresolved: list[str] = []
        # `from os import environ, getenv` (as ...), wherever in the module
        imported = [
            (alias.name, alias.asname or alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "os"
            for alias in node.names
        ]
        self.environ_aliases = {local for name, local in imported if name == "environ"}
        self.getenv_aliases = {local for name, local in imported if name == "getenv"}

    def add(self, node: ast.expr | None, at: ast.AST) -> None:
        place = f"{self.where}:{at.lineno}"  # type: ignore[attr-defined]
        if isinstance(node, ast.List | ast.Tuple):  # typer's envvar=[...]
            for item in node.elts:
                self.add(item, at)
            return
        name = _literal(node, self.names)
        if name is None:
            self.unresolved.append(place)
        else:
            self.found.append((name, place))

    def is_environ(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "environ":
            return isinstance(node.value, ast.Name) and node.value.id == "os"
        return isinstance(node, ast.Name) and node.id in self.environ_aliases

    def is_getenv(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "getenv":
            return isinstance(node.value, ast.Name) and node.value.id == "os"
        return isinstance(node, ast.Name) and node.id in self.getenv_aliases

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and self.is_environ(func.value):
            if func.attr in ("get", "setdefault", "pop") and node.args:
                self.add(node.args[0], node)
        elif self.is_getenv(func) and node.args:
            self.add(node.args[0], node)
        envvar = _keyword(node, "envvar")  # typer.Option(..., envvar="X")
        if envvar is not None:
            self.add(envvar, node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and self.is_environ(node.value):
            self.add(node.slice, node)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, ast.In | ast.NotIn) and self.is_environ(right):
                self.add(node.left, node)
        self.generic_visit(node)


def settings_reads(tree: ast.Module, where: str) -> Iterator[tuple[str, str]]:
    """The env names of the fields of every pydantic-settings class in the module."""
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in cls.bases}
        if not bases & SETTINGS_BASES:
            continue
        prefix, case_sensitive = "", False
        for node in cls.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "model_config" for t in node.targets
            ):
                assert isinstance(node.value, ast.Call), f"{where}: model_config is not a call"
                prefix = ast.literal_eval(_keyword(node.value, "env_prefix") or ast.Constant(""))
                case_sensitive = ast.literal_eval(
                    _keyword(node.value, "case_sensitive") or ast.Constant(False)
                )
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            field = node.target.id
            if field == "model_config" or "ClassVar" in ast.unparse(node.annotation):
                continue
            env = prefix + field
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func).endswith("Field"):
                alias = _keyword(node.value, "validation_alias") or _keyword(node.value, "alias")
                if alias is not None:
                    assert isinstance(alias, ast.Constant) and isinstance(alias.value, str), (
                        f"{where}:{node.lineno}: teach this test {ast.unparse(alias)} (AliasChoices?)"
                    )
                    env = alias.value  # pydantic-settings: an alias is the whole name, no prefix
            yield (env if case_sensitive else env.upper()), f"{where}:{node.lineno}"


# Every form of read above names one of these; a file without them is not parsed (speed).
MAY_READ = re.compile(r"\benviron\b|\bgetenv\b|\benvvar\b|\bBaseSettings\b")


@functools.cache
def code_reads() -> dict[str, list[str]]:
    """Every variable the code reads -> the places ("path:line") that read it."""
    texts = {module_name(path): (path, path.read_text(encoding="utf-8")) for path in source_files()}

    @functools.cache
    def constants(module: str) -> dict[str, str]:
        path, text = texts[module]
        return string_constants(ast.parse(text, str(path)))

    reads: dict[str, list[str]] = {}
    unresolved: list[str] = []
    for module, (path, text) in texts.items():
        if not MAY_READ.search(text):
            continue
        tree = ast.parse(text, str(path))
        names = dict(constants(module))
        for node in ast.walk(tree):  # constants imported from another scanned module
            if isinstance(node, ast.ImportFrom) and node.module in texts:
                for alias in node.names:
                    if alias.name in constants(node.module):
                        names[alias.asname or alias.name] = constants(node.module)[alias.name]
        where = str(path.relative_to(ROOT))
        visitor = Reads(tree, names, where)
        visitor.visit(tree)
        unresolved += visitor.unresolved
        for name, place in [*visitor.found, *settings_reads(tree, where)]:
            reads.setdefault(name, []).append(place)
    assert not unresolved, (
        "environment reads this test cannot name (use a literal or a module-level constant): "
        + ", ".join(unresolved)
    )
    return reads


def documented() -> dict[str, int]:
    """Variables named in the first column of docs/configuration.md's tables -> line number."""
    out: dict[str, int] = {}
    for number, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        match = TABLE_ROW.match(line)
        if match:
            for name in re.findall(r"`([^`]+)`", match.group(1)):
                if ENV_NAME.match(name):
                    out.setdefault(name, number)
    return out


SAMPLE = """
import os
from os import environ as env, getenv
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
import typer

NAME = "A_CONSTANT"

class S(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="app_")
    plain: int = 1
    aliased: int = Field(default=1, validation_alias="OTHER_NAME")

os.environ.get("A_GET"); os.environ["A_ITEM"]; getenv("A_GETENV"); env.setdefault(NAME, "1")
"A_IN" in os.environ
def cmd(url: str = typer.Option(envvar=["A_OPT", "A_OPT2"])) -> None: ...

os.environ["ONLY_SET"] = "1"                        # set, not read
child = {**os.environ, "CHILD_ONLY": "1"}           # for a child process
os.environ.update({"UPDATED": "1"})                 # set, not read
"""


def test_the_parser_on_every_form() -> None:
    tree = ast.parse(SAMPLE)
    visitor = Reads(tree, string_constants(tree), "sample.py")
    visitor.visit(tree)
    found = {name for name, _ in [*visitor.found, *settings_reads(tree, "sample.py")]}
    assert found == {
        "APP_PLAIN", "OTHER_NAME", "A_GET", "A_ITEM", "A_GETENV", "A_CONSTANT", "A_IN", "A_OPT", "A_OPT2",
    }  # fmt: skip
    assert not visitor.unresolved


def test_the_scan_sees_known_reads() -> None:
    """The parser is not blind: a few reads of each kind are found where they are."""
    reads = code_reads()
    expected = {
        "SERVICE_BASE_URL": "grpo_service/config.py",  # a Settings field
        "GRPO_INSTANCE_ID": "grpo_service/core/registry.py",  # os.environ.get(CONSTANT)
        "GRPO_WORLD_CACHE_SIZE": "envs/crafter/worlds.py",  # the same
        "GRPO_VLLM_VENV": "inference/vllm_server.py",  # os.environ[...] and .get
        "TASK_APP_URL": "grpo_service/cli/rollout.py",  # typer's envvar=
        "OMP_NUM_THREADS": "training/jobs.py",  # os.environ.setdefault
    }
    for name, path in expected.items():
        assert any(place.startswith(path + ":") for place in reads.get(name, [])), (name, reads.get(name))


def test_every_variable_read_is_documented() -> None:
    doc = documented()
    missing = {
        name: places
        for name, places in code_reads().items()
        if name not in doc and name not in OTHER_PROGRAMS
    }
    assert not missing, "read but not in a table of docs/configuration.md:\n" + "\n".join(
        f"  {name} (read at {', '.join(places)})" for name, places in sorted(missing.items())
    )


def test_every_documented_variable_is_read() -> None:
    reads = code_reads()
    stale = {name: line for name, line in documented().items() if name not in reads}
    assert not stale, "docs/configuration.md documents variables nothing reads:\n" + "\n".join(
        f"  {name} (docs/configuration.md:{line})" for name, line in sorted(stale.items())
    )


def test_allow_list_is_current() -> None:
    """Each variable of another program is still read (set by default) and is not in a table
    (it is not a setting of this project), but the doc names it."""
    reads = code_reads()
    doc = documented()
    text = DOC.read_text(encoding="utf-8")
    for name, program in OTHER_PROGRAMS.items():
        assert name in reads, f"{name} ({program}) is no longer read: drop it from OTHER_PROGRAMS"
        assert name not in doc, f"{name} belongs to {program}: list it in prose, not in a settings table"
        assert re.search(f"`{name}[`=]", text), (
            f"{name} ({program}), set by {', '.join(reads[name])}, is not named in docs/configuration.md"
        )
