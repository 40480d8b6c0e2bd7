"""The README and docs/ say only what can be checked: each figure the README quotes equals the
committed bench JSON its row names (rounded as printed), every relative link and anchor in
README.md and docs/*.md resolves, the README opens with the two commands (the test command
byte-identical to .ci/run's), and its "Try it" example runs as written against a served app.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tools.server_thread import ServerThread

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

# A figure row: | what | value | `docs/bench/X.json` `dotted.key` |
FIGURE_ROW = re.compile(
    r"^\|\s*(?P<what>[^|]+?)\s*\|\s*(?P<value>[^|]+?)\s*"
    r"\|\s*`(?P<file>docs/bench/[\w.-]+\.json)`\s+`(?P<key>[\w.*-]+)`\s*\|$"
)
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A rate, a duration or a size quoted in prose: only the figures table may carry one.
PROSE_FIGURE = re.compile(r"\d[\d,.]*\s*(?:steps/s|decisions/s|µs|ms\b|KiB|MiB|GiB|KB\b|MB\b|×|%)")


def without_code(text: str) -> str:
    """The text with fenced code blocks blanked out (their lines kept, empty)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def figure_rows() -> list[dict[str, str]]:
    lines = README.read_text(encoding="utf-8").splitlines()
    rows = [m.groupdict() for line in lines if (m := FIGURE_ROW.match(line))]
    assert rows, "the README quotes no figure with its source"
    return rows


def lookup(data: Any, key: str) -> list[Any]:
    """The values at a dotted key; ``*`` stands for every key of a mapping."""
    values = [data]
    for part in key.split("."):
        if part == "*":
            values = [v for value in values for v in value.values()]
        else:
            values = [value[part] for value in values]
    return values


def decimals(printed: str) -> int:
    return len(printed.partition(".")[2])


@pytest.mark.parametrize("row", figure_rows(), ids=lambda row: row["key"])
def test_each_readme_figure_equals_the_json_it_names(row: dict[str, str]) -> None:
    data = json.loads((REPO / row["file"]).read_text(encoding="utf-8"))
    values = lookup(data, row["key"])
    printed = NUMBER.findall(row["value"])
    assert printed, row
    if "*" in row["key"]:  # a count: "2 of 6" true flags
        assert all(isinstance(v, bool) for v in values), row
        assert [int(p) for p in printed[:2]] == [sum(values), len(values)], (row, values)
        return
    (value,) = values
    shown = float(printed[0].replace(",", ""))
    assert shown == round(float(value), decimals(printed[0])), (row, value)


def test_the_readme_quotes_figures_only_in_its_figures_table() -> None:
    prose = [
        line
        for line in without_code(README.read_text(encoding="utf-8")).splitlines()
        if not FIGURE_ROW.match(line) and PROSE_FIGURE.search(line)
    ]
    assert not prose, prose


def test_the_readme_opens_with_the_serve_and_test_commands() -> None:
    head = README.read_text(encoding="utf-8").splitlines()[:40]
    serve = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python main.py"
    ci_lines = (REPO / ".ci/run").read_text(encoding="utf-8").splitlines()
    ci = [line for line in ci_lines if line.startswith("python3 ")]
    assert len(ci) == 1, ci
    assert serve in head and ci[0] in head


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in without_code(path.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            base = slug(m.group(1))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, broken


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_no_internal_history_names(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not re.findall(r"(?i)\bseed 0\d\d\b|\bseed 0\d\d's|\bissue #?\d+\b", text)


def test_the_readme_example_runs_as_written(server: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Try it") :].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(code.replace("http://127.0.0.1:8000", server.base_url), "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert "Map (top row is up; @ = you):" in lines
    members = [line.split()[0] for line in lines[-4:]]
    assert members == ["0", "1", "2", "3"], lines
