"""The task app's CPU per decision across its history: a scan, or a ``git bisect run`` test.

    python -m tools.bench.history scan --worktree /tmp/wt REV1 REV2 ...   # one line per commit
    python -m tools.bench.history scan --worktree /tmp/wt --since REV        # main's merges since REV
    cd /tmp/wt && git bisect run python -m tools.bench.history test --harness DIR --above 1500

Each commit's service runs from a separate worktree (checked out detached there) and is measured
by this checkout's harness (`tools.bench.decision`, HTTP mode: the same fake LLM, load and
client for every commit), so only the service changes between lines. ``test`` exits 0 (good)
when the service's CPU per decision is at most ``--above``, 1 (bad) above it, 125 (skip) when
the commit cannot be measured, as ``git bisect run`` expects. Run it under ``nice``: on a shared
machine the figure moves by 10-20 % between runs, so repeat (``--repeats``) and bisect only jumps
well above that.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]  # this checkout: the harness
SERVICE_PATHS = ("grpo_service", "envs", "inference", "storage")  # commits touching these are scanned


def measure(
    server_path: Path, harness: Path, repeats: int, traced: bool, record: str = "tokens"
) -> dict[str, float] | None:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, "-m", "tools.bench.decision", "--mode", "http", "--repeats", str(repeats)]
        cmd += ["--server-path", str(server_path), "--json", out.name, "--groups", "2", "--record", record]
        if traced:
            cmd.append("--traced")
        proc = subprocess.run(cmd, cwd=harness, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            print(proc.stdout[-800:], proc.stderr[-1500:], file=sys.stderr)
            return None
        result = json.loads(Path(out.name).read_text())["results"]["http"]
    runs = result["runs"]
    return {
        "cpu_us_per_decision": result["median_cpu_us_per_decision"],
        "spread_lo": result["spread"][0],
        "spread_hi": result["spread"][1],
        "steps_per_decision": runs[0]["steps"] / max(1, runs[0]["decisions"]),
    }


def _git(worktree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=worktree, check=True, capture_output=True, text=True).stdout


def scan(args: argparse.Namespace) -> None:
    revs = list(args.revs)
    if args.since:
        span = f"{args.since}^..{args.until}"
        log = _git(HERE, "log", "--first-parent", "--reverse", "--format=%h", span, "--", *SERVICE_PATHS)
        revs += log.split()
    for rev in revs:
        _git(args.worktree, "checkout", "-q", "--detach", rev)
        subject = _git(
            args.worktree, "log", "-1", "--format=%ad %s", "--date=format:%m-%d %H:%M", rev
        ).strip()
        for traced in (False, True) if args.traced else (False,):
            m = measure(args.worktree, HERE, args.repeats, traced, args.record)
            shown = (
                "skipped (not measurable)"
                if m is None
                else f"{m['cpu_us_per_decision']:6.0f} us/decision "
                f"[{m['spread_lo']:.0f}-{m['spread_hi']:.0f}], "
                f"{m['steps_per_decision']:.2f} steps/decision"
            )
            print(f"{rev} {'traced  ' if traced else 'untraced'} {shown}  {subject[:70]}", flush=True)


def test(args: argparse.Namespace) -> None:
    m = measure(Path.cwd(), args.harness, args.repeats, args.traced, args.record)
    if m is None:
        raise SystemExit(125)
    print(f"{m['cpu_us_per_decision']:.0f} us CPU per decision (bad above {args.above:.0f})")
    raise SystemExit(0 if m["cpu_us_per_decision"] <= args.above else 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("scan")
    p.add_argument("revs", nargs="*")
    p.add_argument("--worktree", type=Path, required=True, help="a git worktree to check commits out in")
    p.add_argument("--since", help="every first-parent commit of main from this one")
    p.add_argument("--until", default="main")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--record", choices=("tokens", "default", "none"), default="tokens")
    p.add_argument("--traced", action="store_true", help="also measure with TRACE_DB on")
    p.set_defaults(run=scan)
    t = sub.add_parser("test")
    t.add_argument("--harness", type=Path, default=HERE, help="the checkout whose harness measures")
    t.add_argument("--above", type=float, required=True, help="bad above this many us per decision")
    t.add_argument("--repeats", type=int, default=2)
    t.add_argument("--record", choices=("tokens", "default", "none"), default="tokens")
    t.add_argument("--traced", action="store_true")
    t.set_defaults(run=test)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
