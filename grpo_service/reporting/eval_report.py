"""An evaluation as one self-contained HTML file: the aggregate, charts and a link per episode.

`render_report` takes the result ``grpo-service eval --json`` writes (``aggregate``, ``config``,
``episodes``) and nothing else, so it works for any environment: it shows the summary's scalar
metrics (the Crafter score when there is one), a chart of per-achievement success rates (from
``summary.success_rates``, else counted from the episodes), the distribution of returns,
failures by cause, and a table of episodes linking into the trace viewer
(``<viewer>#/run/<run id>``; the links resolve when the task app traces its rollouts).
Charts are matplotlib PNGs embedded as data URIs: the file opens anywhere, offline.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

HEADLINE_KEYS = ("crafter_score", "success_rate", "score", "mean_return", "avg_achievements", "avg_turns")
STYLE = """
body { margin: 0; background: #f4f5f7; color: #1d2330; 
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 13px; margin: 0 0 10px; color: #677085; text-transform: uppercase; letter-spacing: .04em; }
.card { background: #fff; border: 1px solid #e2e5eb; border-radius: 10px;
  padding: 14px 16px; margin: 14px 0; }
.stats { display: flex; flex-wrap: wrap; gap: 10px 28px; }
.stat { display: flex; flex-direction: column; }
.stat b { font-size: 11px; color: #677085; text-transform: uppercase; letter-spacing: .04em; }
.stat span { font-size: 20px; font-variant-numeric: tabular-nums; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 0 14px; }
@media (max-width: 900px) { .grid { grid-template-columns: 1fr; } }
img { max-width: 100%; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th { text-align: left; color: #677085; font-weight: 600; 
  border-bottom: 1px solid #e2e5eb; padding: 6px 8px; }
td { padding: 5px 8px; border-bottom: 1px solid #f0f1f4; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.mono, code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
.muted { color: #677085; } .bad { color: #c5221f; } a { color: #2f5bd3; }
"""
COLORS = {"bar": "#2f5bd3", "good": "#1e8e3e", "bad": "#c5221f", "muted": "#677085"}


def _figure(width: float, height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=9)
    return fig, ax


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _aggregate(result: dict[str, Any]) -> dict[str, Any]:
    """The eval JSON's aggregate (``"summary"`` in files written before it was named so)."""
    return result.get("aggregate") or result.get("summary") or {}


def success_rates(result: dict[str, Any]) -> dict[str, float]:
    """Per-achievement success rates in percent: the summary's, else counted from the episodes."""
    rates = _aggregate(result).get("success_rates")
    if isinstance(rates, dict) and rates:
        return {str(k): float(v) for k, v in rates.items()}
    scored = [e for e in result.get("episodes") or [] if e.get("returned", True)]
    counts = Counter(a for e in scored for a in set(e.get("achievements") or []))
    return {a: 100.0 * n / len(scored) for a, n in counts.items()} if scored else {}


def achievement_chart(rates: dict[str, float]) -> str | None:
    if not rates:
        return None
    items = sorted(rates.items(), key=lambda kv: (kv[1], kv[0]))
    fig, ax = _figure(9.0, max(2.0, 0.24 * len(items) + 0.8))
    names, values = [k.replace("_", " ") for k, _ in items], [v for _, v in items]
    bars = ax.barh(names, values, color=[COLORS["bar"] if v > 0 else COLORS["muted"] for v in values])
    ax.set_xlim(0, 100)
    ax.set_xlabel("episodes that unlocked it (%)", fontsize=9)
    for bar, value in zip(bars, values, strict=True):
        ax.text(
            min(value + 1.5, 92), bar.get_y() + bar.get_height() / 2, f"{value:.0f}%", va="center", fontsize=8
        )
    return _png(fig)


def return_chart(returns: list[float]) -> str | None:
    """A bar per distinct return when there are few (Crafter's are mostly whole), else a histogram."""
    if not returns:
        return None
    fig, ax = _figure(5.6, 3.0)
    counts = Counter(round(r, 3) for r in returns)
    if len(counts) <= 15:
        values = sorted(counts)
        width = 0.8 * min((b - a for a, b in zip(values, values[1:], strict=False)), default=1.0)
        ax.bar(values, [counts[v] for v in values], width=width, color=COLORS["bar"])
    else:
        ax.hist(returns, bins=20, color=COLORS["bar"], edgecolor="white")
    mean = statistics.fmean(returns)
    ax.axvline(mean, color=COLORS["bad"], linestyle="--", linewidth=1.2, label=f"mean {mean:.2f}")
    ax.set_xlabel("episode return", fontsize=9)
    ax.set_ylabel("episodes", fontsize=9)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, frameon=False)
    return _png(fig)


def failure_chart(failures: dict[str, int]) -> str | None:
    if not failures:
        return None
    items = sorted(failures.items(), key=lambda kv: kv[1])
    fig, ax = _figure(5.6, max(1.6, 0.32 * len(items) + 0.8))
    ax.barh([k for k, _ in items], [v for _, v in items], color=COLORS["bad"])
    ax.set_xlabel("episodes", fontsize=9)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _png(fig)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else f"{value:,.3f}".rstrip("0").rstrip(".")
            if value % 1
            else f"{value:,.0f}"
        )
    return str(value)


def _scalars(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    keys = [k for k in HEADLINE_KEYS if k in summary]
    keys += [k for k, v in summary.items() if k not in keys and isinstance(v, int | float | str | bool)]
    return [(k, summary[k]) for k in keys]


def render_report(result: dict[str, Any], *, viewer_url: str | None = None, title: str | None = None) -> str:
    """The HTML of one evaluation (``result`` as ``grpo-service eval --json`` writes it)."""
    summary = _aggregate(result)
    config = result.get("config") or {}
    episodes = list(result.get("episodes") or [])
    returned = [e for e in episodes if e.get("returned", True)]
    returns = [float(e.get("total_return") or 0.0) for e in returned]
    failures = summary.get("failures")
    if not isinstance(failures, dict):
        failures = dict(Counter(e["failure"] for e in episodes if e.get("failure")))
    rates = success_rates(result)
    env = config.get("env_name") or "the environment"
    who = config.get("model") or config.get("policy") or "a policy"
    title = title or f"Evaluation of {who} on {env}"
    esc = html.escape

    headline = "".join(
        f'<div class="stat"><b>{esc(k.replace("_", " "))}</b>'
        f'<span id="stat-{esc(k)}">{esc(_fmt(v))}</span></div>'
        for k, v in _scalars(summary)
    )

    def chart(name: str, cid: str, src: str | None, empty: str, extra: str = "") -> str:
        body = (
            f'<img id="{cid}" alt="{esc(name)}" src="{src}">' if src else f'<p class="muted">{esc(empty)}</p>'
        )
        return f'<section class="card"><h2>{esc(name)}</h2>{body}{extra}</section>'

    failure_rows = "".join(
        f"<tr><td class=mono>{esc(str(k))}</td><td class=num>{v}</td></tr>"
        for k, v in sorted(failures.items(), key=lambda kv: -kv[1])
    )
    episode_rows = []
    for e in episodes:
        run_id = str(e.get("run_id") or "")
        link = (
            esc(f"{viewer_url.rstrip('/')}#/run/{run_id}")
            if viewer_url and run_id and e.get("returned", True)
            else None
        )
        cause = e.get("failure") or e.get("stop_reason") or ""
        episode_rows.append(
            "<tr>"
            f"<td class=num>{esc(str(e.get('index', '')))}</td>"
            f"<td class=num>{esc(str(e.get('seed', '')))}</td>"
            f"<td class=num>{esc(_fmt(float(e.get('total_return') or 0.0)))}</td>"
            f"<td class=num>{len(set(e.get('achievements') or []))}</td>"
            f"<td class=num>{esc(str(e.get('turns', '')))}</td>"
            f"<td class='mono{' bad' if e.get('failure') else ''}'>{esc(str(cause))}</td>"
            f"<td>{f'<a href={chr(34)}{link}{chr(34)}>{esc(run_id)}</a>' if link else esc(run_id)}</td>"
            "</tr>"
        )
    settings = "".join(
        f"<tr><td>{esc(str(k))}</td><td class=mono>{esc(str(v))}</td></tr>"
        for k, v in config.items()
        if v not in (None, {}, [])
    )
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    viewer_note = (
        f'Each run id opens the rollout in the trace viewer at <a href="{esc(viewer_url)}">'
        f"{esc(viewer_url)}</a> "
        "(when the task app traces its rollouts: <code>grpo-service serve --trace traces/v3</code>)."
        if viewer_url
        else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{STYLE}</style></head>
<body><main>
<h1>{esc(title)}</h1>
<p class="muted">{len(episodes)} episodes · created {created}</p>
<section class="card"><h2>Aggregate</h2><div class="stats">{headline}</div></section>
{chart("Success rate per achievement", "chart-achievements", achievement_chart(rates), "No achievement.")}
<div class="grid">
{chart("Return distribution", "chart-returns", return_chart(returns), "No episode returned.")}
{
        chart(
            "Failures by cause",
            "chart-failures",
            failure_chart(failures),
            "No failures: every episode completed.",
            f"<table id=failures><tr><th>cause</th><th class=num>episodes</th></tr>{failure_rows}</table>"
            if failure_rows
            else "",
        )
    }
</div>
<section class="card"><h2>Episodes</h2><p class="muted">{viewer_note}</p>
<table id="episodes"><tr><th class=num>#</th><th class=num>seed</th><th class=num>return</th>
<th class=num>achievements</th><th class=num>turns</th><th>stop reason / failure</th><th>run</th></tr>
{"".join(episode_rows)}</table></section>
<section class="card"><h2>Settings</h2><table>{settings}</table></section>
</main></body></html>
"""


def write_report(path: Path, result: dict[str, Any], *, viewer_url: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(result, viewer_url=viewer_url), encoding="utf-8")
    return path
