"""Entry point of the benchmark's server processes (the task app and the fake LLM).

    python -m tools.bench.child service --fd N --settings JSON
    python -m tools.bench.child fake --fd N --config JSON
    python -m tools.bench.child floor --fd N --config JSON     # tools/bench/floor.py

The parent binds the listening socket on 127.0.0.1 and passes its file descriptor, so the
port is known before the child starts and no other process can take it in between.
"""

from __future__ import annotations

import argparse
import json
import socket

import uvicorn


def _serve(app: object, fd: int) -> None:
    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("service", "fake", "floor"))
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--settings", default="{}", help="service: Settings fields as JSON")
    parser.add_argument("--config", default="{}", help="fake: FakeConfig fields as JSON")
    args = parser.parse_args(argv)
    if args.kind == "service":
        from grpo_service import Settings, create_app

        settings = Settings(_env_file=None, **json.loads(args.settings))  # type: ignore[call-arg]
        _serve(create_app(settings), args.fd)  # with RAY_ADDRESS: the front of a Ray cluster
    elif args.kind == "floor":
        from tools.bench.floor import create_floor_app

        _serve(create_floor_app(**json.loads(args.config)), args.fd)
    else:
        from tools.fake_server import FakeConfig, create_fake_app

        _serve(create_fake_app(FakeConfig.model_validate(json.loads(args.config))), args.fd)


if __name__ == "__main__":
    main()
