"""Fuzz a live task app through its OpenAPI schema with schemathesis: no 5xx, no response that
violates the schema, every operation but /health refusing a missing key.

The long run, by hand (from the repo root; about 10 minutes on 2 cores):

    .venv/bin/python tests/fuzz_schemathesis.py --max-examples 300 --max-time 180

It starts a vLLM-shaped fake and two task apps on 127.0.0.1 (one open, one with an API key) and
runs ``schemathesis run`` three times: the open app; the keyed app without the key (every
operation but /health must answer 401); the keyed app with the key. Exit status 0 means no
failure. The suite runs a bounded version: a few examples per operation, the keyed app without
the key only (test_hardening_fuzz.py).

Checks: all of schemathesis's but ``positive_data_acceptance``, which expects every
schema-valid request to succeed. Our schema cannot say "exactly one of env_id, env_name and
snapshot_id", nor which plug-in names and ids exist, so such requests rightly get a 4xx.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

if __name__ == "__main__":  # run as a script from anywhere: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_service.models.group_stream import MAX_TAKE_WAIT_S  # noqa: E402  (after the path, as a script)

EXCLUDED_CHECKS = ("positive_data_acceptance",)
KEY = "sk-fuzz-env-key-0123456789abcdef"
DOCS_PAGES = ("/docs", "/redoc", "/static-offline-docs")  # the API docs' own pages (not ours)
# An answer may rightly take as long as the longest wait a request can ask for (a stream's `/take`
# long-poll), and a busy host adds to it; schemathesis's own limit (10 s) would fail a `/take`
# that waits its schema example's 5 s behind a loaded event loop. Past this, it is a hang.
RESPONSE_LIMIT_S = MAX_TAKE_WAIT_S + 30.0


def schemathesis_command(
    base_url: str,
    *,
    schema: str | None = None,
    exclude_checks: tuple[str, ...] = (),
    headers: dict[str, str] | None = None,
    max_examples: int = 5,
    seed: int = 0,
    max_time_s: float | None = None,
    phases: str = "examples,coverage,fuzzing,stateful",
) -> list[str]:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
        "run",
        schema or f"{base_url}/openapi.json",
        *([f"--url={base_url}"] if schema else []),
        "--checks=all",
        f"--exclude-checks={','.join(EXCLUDED_CHECKS + exclude_checks)}",
        f"--max-examples={max_examples}",
        f"--seed={seed}",
        f"--phases={phases}",
        "--workers=1",
        f"--request-timeout={RESPONSE_LIMIT_S:g}",
        f"--max-response-time={RESPONSE_LIMIT_S:g}",
        "--continue-on-failure",
        "--no-color",
    ]
    if max_time_s is not None:
        cmd.append(f"--max-time={max_time_s:g}")
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    return cmd


def unlisted_routes_schema(app: Any) -> dict[str, Any]:
    """An OpenAPI document of the app's API routes that its own schema leaves out (the viewer's
    pages and JSON API, `include_in_schema=False`), so that the fuzzer reaches them too."""
    routes: list[APIRoute] = []

    def walk(candidates: list[Any]) -> None:
        for route in candidates:
            if (
                isinstance(route, APIRoute)
                and not route.include_in_schema
                and not route.path.startswith(DOCS_PAGES)
            ):
                listed = copy.copy(route)
                listed.include_in_schema = True
                routes.append(listed)
            walk(getattr(getattr(route, "original_router", None), "routes", []))  # included routers

    walk(app.routes)
    return get_openapi(title=f"{app.title} (unlisted routes)", version=app.version, routes=routes)


def run_schemathesis(base_url: str, workdir: Path, **options: object) -> subprocess.CompletedProcess[str]:
    """Run the CLI in ``workdir`` (it keeps its example database there) and capture its report."""
    return subprocess.run(
        schemathesis_command(base_url, **options),  # type: ignore[arg-type]
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=3600,
    )


def main(argv: list[str] | None = None) -> int:
    from grpo_service import Settings, create_app
    from tools.fake_server import FakeConfig, FakeInferenceServer
    from tools.server_thread import ServerThread

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-examples", type=int, default=300, help="per operation and phase")
    parser.add_argument("--max-time", type=float, default=180.0, help="seconds per schemathesis run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    failures = 0
    with tempfile.TemporaryDirectory(prefix="grpo-fuzz-") as tmp, FakeInferenceServer(FakeConfig()) as fake:
        workdir = Path(tmp)
        for name, key in (("open", None), ("keyed", KEY)):
            settings = Settings(
                _env_file=None,  # type: ignore[call-arg]
                state_dir=workdir / name / "state",
                snapshot_secret="fuzz-secret-" + "x" * 32,
                vllm_base_url=fake.base_url,
                default_model="fake-model",
                environment_api_key=key,
            )
            with ServerThread(create_app(settings), name=f"fuzz-{name}") as server:
                runs: list[tuple[str, dict[str, str] | None]] = [("no key", None)]
                if key is not None:
                    runs.append(("with key", {"X-API-Key": key}))
                for label, headers in runs:
                    print(f"== {name} app, {label}: {server.base_url}", flush=True)
                    result = run_schemathesis(
                        server.base_url,
                        workdir,
                        headers=headers,
                        max_examples=args.max_examples,
                        seed=args.seed,
                        max_time_s=args.max_time,
                    )
                    print(result.stdout[-6000:], result.stderr[-2000:], sep="\n", flush=True)
                    failures += result.returncode != 0
    print("FAILED" if failures else "OK: no 5xx, no schema violation, every protected operation refused")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
