"""py-spy's collapsed stacks → the CPU budget of one decision by part, and a flame graph PNG.

Each sample is charged to the part of its innermost frame that belongs to one (walking from
the leaf toward the root), so the standard library's JSON encoder counts for whoever called
it. The parts, first match wins: see `PARTS`.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# (part, substrings of a frame's "function (file:line)"), in the order they are tried.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("crafter simulation", ("/site-packages/crafter/", "/envs/crafter/sim.py", "/envs/crafter/creatures.py")),
    ("agent: prompt and reply", ("/envs/agent/", "/envs/crafter/policy.py", "/inference/tool_calls.py")),
    ("env wrapper: text observation", ("/envs/crafter/", "/envs/base.py")),
    ("trace writer (encoding, SQLite)", ("/grpo_service/tracing/",)),
    (
        "HTTP client (http1, openai SDK, aiohttp, httpx)",
        (
            "/inference/http1.py",
            "/site-packages/httptools/",
            "/site-packages/openai/",
            "/site-packages/aiohttp/",
            "/site-packages/httpx",
            "/site-packages/httpcore/",
            "/site-packages/anyio/",
            "/site-packages/yarl/",
            "/site-packages/multidict/",
        ),
    ),
    ("inference client (ours)", ("/inference/",)),
    ("records, trajectories, metrics", ("/grpo_service/rollout/records.py",)),
    ("coordinator and episode loop", ("/grpo_service/rollout/",)),
    ("env and policy managers", ("/grpo_service/core/",)),
    ("wire types (pydantic)", ("/grpo_service/models/", "/site-packages/pydantic")),
    (
        "route, JSON in and out",
        ("/grpo_service/api/", "/site-packages/fastapi/", "/site-packages/starlette/", "/grpo_service/app"),
    ),
    (
        "HTTP server (uvicorn)",
        ("/site-packages/uvicorn/", "/site-packages/httptools/", "/site-packages/h11/"),
    ),
    ("event loop and tasks", ("/asyncio/", "/site-packages/uvloop/", "concurrent/futures", "threading.py")),
    ("garbage collection", ("<gc>",)),
)
OTHER = "other"
# Leaf frames of a thread blocked in C (py-spy's idle detection does not work in every
# container): these samples are waiting, not CPU, and are dropped.
IDLE_LEAVES = (
    ("Condition.wait (", "/threading.py)"),
    ("_worker (", "/concurrent/futures/thread.py)"),
    ("Event.wait (", "/threading.py)"),
    ("Queue.get (", "/queue.py)"),
    ("select (", "/selectors.py)"),
)
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def read_stacks(path: Path) -> Counter[tuple[str, ...]]:
    """``{(root frame, ..., leaf frame): samples}`` from py-spy's ``--format raw`` output."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stack = tuple(_strip_line(f) for f in frames.split(";"))
            if not any(stack[-1].startswith(f) and stack[-1].endswith(e) for f, e in IDLE_LEAVES):
                stacks[stack] += int(count)
    return stacks


def _strip_line(frame: str) -> str:
    """``func (file:123)`` → ``func (file)``: one node per function in the graph."""
    m = _FRAME.match(frame)
    return f"{m['func']} ({m['file']})" if m else frame


def part_of(stack: tuple[str, ...]) -> str:
    for frame in reversed(stack):
        for part, needles in PARTS:
            if any(n in frame for n in needles):
                return part
    return OTHER


def budget_report(path: Path, cpu_us_per_decision: float, *, title: str) -> dict[str, Any]:
    """Each part's share of the samples, times the measured CPU per decision; writes the flame
    graph (PNG and SVG) beside ``path``."""
    stacks = read_stacks(path)
    total = sum(stacks.values()) or 1
    parts: Counter[str] = Counter()
    for stack, n in stacks.items():
        parts[part_of(stack)] += n
    order = [p for p, _ in PARTS] + [OTHER]
    shares = {p: parts[p] / total for p in order if parts[p]}
    heading = f"{title}: {cpu_us_per_decision:.0f} us CPU per decision"
    for suffix in (".png", ".svg"):
        render(stacks, path.with_suffix(suffix), title=heading)
    return {
        "samples": total,
        "cpu_us_per_decision": round(cpu_us_per_decision, 1),
        "shares": {p: round(s, 4) for p, s in shares.items()},
        "us_per_decision": {p: round(s * cpu_us_per_decision, 1) for p, s in shares.items()},
    }


# ------------------------------------------------------------------------------ the picture

_COLORS = {
    "crafter simulation": "#8fbc8f",
    "agent: prompt and reply": "#f4a460",
    "env wrapper: text observation": "#b0d8a0",
    "trace writer (encoding, SQLite)": "#d8a0d8",
    "inference client (ours)": "#f4b0a0",
    "HTTP client (http1, openai SDK, aiohttp, httpx)": "#f08080",
    "records, trajectories, metrics": "#ffd27f",
    "coordinator and episode loop": "#ffe4a0",
    "env and policy managers": "#e0e0a0",
    "wire types (pydantic)": "#a0c8f0",
    "route, JSON in and out": "#87cefa",
    "HTTP server (uvicorn)": "#add8e6",
    "event loop and tasks": "#d3d3d3",
    "garbage collection": "#c0c0c0",
    OTHER: "#e8e8e8",
}


def _short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    return f"{m['func']} ({Path(m['file']).name})"


def render(stacks: Counter[tuple[str, ...]], out: Path, *, title: str, max_depth: int = 40) -> None:
    """An icicle flame graph (root at the top), boxes coloured by part, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    total = sum(stacks.values()) or 1
    # Node: a path prefix; its width is the samples under it, its colour its own frame's part.
    width: dict[tuple[str, ...], int] = defaultdict(int)
    for stack, n in stacks.items():
        for depth in range(1, min(len(stack), max_depth) + 1):
            width[stack[:depth]] += n
    children: dict[tuple[str, ...], list[tuple[str, ...]]] = defaultdict(list)
    for node in width:
        children[node[:-1]].append(node)
    depth_max = max((len(n) for n in width), default=1)
    fig, ax = plt.subplots(figsize=(16, max(4.0, 0.22 * depth_max + 1.5)), dpi=110)

    def draw(node: tuple[str, ...], x: float) -> None:
        for child in sorted(children.get(node, []), key=lambda c: -width[c]):
            w = width[child] / total
            depth = len(child)
            part = part_of(child)
            ax.add_patch(
                Rectangle((x, depth - 1), w, 0.95, facecolor=_COLORS[part], edgecolor="white", linewidth=0.3)
            )
            if w > 0.04:
                label = _short(child[-1])
                ax.text(x + 0.002, depth - 0.55, label[: int(w * 190)], fontsize=6, va="center", clip_on=True)
            draw(child, x)
            x += w

    draw((), 0.0)
    ax.set_xlim(0, 1)
    ax.set_ylim(depth_max, 0)
    ax.set_yticks([])
    ax.set_xlabel("share of the service's CPU samples")
    ax.set_title(title, fontsize=10)
    used = {part_of(s) for s in stacks}
    handles = [Patch(color=c, label=p) for p, c in _COLORS.items() if p in used]
    ax.legend(handles=handles, loc="lower right", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
