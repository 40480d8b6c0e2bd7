"""A new user's first hour: the README's workflow block, run as written against the bundled fake,
yields SFT data and an evaluation; and each failure the user can run into exits non-zero with its
cause on screen.

The commands are read from README.md (section "The workflow"), so the README and this test cannot
drift apart: only the ports are replaced by free ones, and ``grpo-service`` is run as
``python -m grpo_service.cli`` (the same entry point, without depending on the PATH).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from grpo_service.cli import app as cli_app
from grpo_service.tracing.export import validate_example
from tests.conftest import REPO, free_port

README = REPO / "README.md"
README_PORTS = ("8000", "8001")  # the task app's and the inference server's, as the README writes them


def workflow_commands() -> list[str]:
    """The shell commands of the README's workflow block, continuation lines joined."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The workflow") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README's workflow section has no bash block"
    joined = block.group(1).replace("\\\n", " ")
    lines = (line.strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


class Shell:
    """Runs README commands in ``cwd`` with the README's ports mapped to free ones."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.ports = {p: str(free_port()) for p in README_PORTS}
        self.background: list[subprocess.Popen[bytes]] = []
        self.env = {k: v for k, v in os.environ.items() if k not in ("ENVIRONMENT_API_KEY", "TRACE_DB")}
        self.env["PYTHONPATH"] = str(REPO)

    def url(self, readme_port: str) -> str:
        return f"http://127.0.0.1:{self.ports[readme_port]}"

    def argv(self, command: str) -> tuple[dict[str, str], list[str], bool]:
        for readme_port, port in self.ports.items():
            command = command.replace(f":{readme_port}", f":{port}")
            command = command.replace(f"--port {readme_port}", f"--port {port}")
        background = command.endswith("&")
        words = shlex.split(command.rstrip("&"))
        env = {}
        while "=" in words[0]:
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[0] == "grpo-service":
            words = [sys.executable, "-m", "grpo_service.cli", *words[1:]]
        elif words[0] == "python":
            words[0] = sys.executable
        return env, words, background

    def run(self, command: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        env, argv, background = self.argv(command)
        assert not background, command
        return subprocess.run(
            argv,
            cwd=self.cwd,
            env={**self.env, **env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )

    def invoke(self, command: str) -> subprocess.CompletedProcess[str]:
        """`run` in this process (no interpreter start-up): for the many short failure cases."""
        env, argv, _ = self.argv(command)
        assert argv[1:3] == ["-m", "grpo_service.cli"], command
        cwd = os.getcwd()
        os.chdir(self.cwd)
        try:
            unset = {"ENVIRONMENT_API_KEY": None, "TRACE_DB": None}  # as in `run`'s environment
            result = CliRunner().invoke(cli_app, argv[3:], env={**unset, **env, "COLUMNS": "200"})
        finally:
            os.chdir(cwd)
        return subprocess.CompletedProcess(argv, result.exit_code, result.output, "")

    def start(self, command: str, ready_url: str) -> None:
        env, argv, background = self.argv(command)
        assert background, command
        log = (self.cwd / f"bg-{len(self.background)}.log").open("wb")
        proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.background.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{command} exited: {Path(log.name).read_text()}"
            try:
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{command} did not start: {Path(log.name).read_text()}")

    def stop(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """The README's steps 0 and 1, started once: the fake inference server and the traced task app."""
    sh = Shell(tmp_path_factory.mktemp("first-hour"))
    fake, serve, *_ = workflow_commands()
    assert "fake_server" in fake and " serve " in serve, (fake, serve)
    # No retries of a refused LLM connection: keeps the dead-server cases short (same cause).
    sh.env["INFERENCE_MAX_RETRIES"] = "0"
    sh.start(fake, sh.url("8001") + "/v1/models")
    sh.start(serve, sh.url("8000") + "/health")
    yield sh
    sh.stop()


@pytest.mark.slow
def test_the_readme_workflow_yields_sft_data_and_an_evaluation(shell: Shell) -> None:
    _, _, rollout, export, evaluate = workflow_commands()
    done = shell.run(rollout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed" in done.stdout and (shell.cwd / "local-trace_trace.json").exists()

    time.sleep(0.5)  # the trace writer commits within 0.25 s of a rollout's end
    exported = shell.run(export)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    lines = (shell.cwd / "ft_data" / "crafter_sft.jsonl").read_text().splitlines()
    examples = [json.loads(line) for line in lines]
    assert examples, exported.stdout
    assert all(validate_example(e) == [] and e["metadata"]["run_id"] == "local-trace" for e in examples)

    evaluated = shell.run(evaluate)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    report = json.loads((shell.cwd / "evals" / "crafter.json").read_text())
    assert report["aggregate"]["total"] == 20 and report["aggregate"]["completed"] == 20
    assert "success rates" in evaluated.stdout

    # The eval episodes are in the DB now, but not in a default export: still only local-trace.
    again = shell.run(export)
    assert again.returncode == 0 and "session skipped: mode" in again.stdout
    assert (shell.cwd / "ft_data" / "crafter_sft.jsonl").read_text().splitlines() == lines

    # A GRPO group against the README's fake has spread: its members sample different answers.
    group = httpx.post(
        shell.url("8000") + "/rollout/group",
        json={
            "group_size": 8,
            "env": {"env_name": "crafter", "seed": 123},
            "policy": {"policy_name": "crafter-react", "config": {"temperature": 1.0}},
            "max_turns": 5,
        },
        timeout=120,
    ).json()
    plays = {
        tuple(tuple(step["actions"]) for step in m["result"]["trajectories"][0]["steps"])
        for m in group["members"]
    }
    assert len(plays) == 8, plays

    # The session list and the turn-by-turn view of the collected run.
    listed = shell.run("grpo-service traces --last 0")
    assert listed.returncode == 0 and "local-trace" in listed.stdout, listed.stdout + listed.stderr
    shown = shell.run("grpo-service traces show local-trace")
    assert shown.returncode == 0 and "turn 9" in shown.stdout, shown.stdout + shown.stderr


def test_failures_exit_non_zero_with_their_cause(shell: Shell) -> None:
    _, _, rollout, export, evaluate = workflow_commands()
    dead = f"http://127.0.0.1:{free_port()}"

    failed = shell.invoke(rollout.replace(shell_url_of(rollout, "8001"), dead).replace("local-trace", "dead"))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "failed: policy_error:inference_connection_error" in failed.stdout
    assert "completed" not in failed.stdout.split("status", 1)[1].splitlines()[0]

    no_eval = shell.invoke(
        evaluate.replace("--episodes 20", "--episodes 2").replace("0-19", "0-1") + f" --inference-url {dead}"
    )
    assert no_eval.returncode == 1, no_eval.stdout + no_eval.stderr
    assert "no episode completed" in no_eval.stdout and "inference_connection_error" in no_eval.stdout

    twice = rollout.replace("local-trace", "twice").replace("--max-llm-calls 10", "--max-llm-calls 2")
    assert shell.invoke(twice).returncode == 0
    replay = shell.invoke(twice)
    assert replay.returncode == 2 and "already exists" in replay.stdout and "--force" in replay.stdout
    forced = shell.invoke(twice + " --force")
    assert forced.returncode == 0 and "two runs named twice" in forced.stdout

    time.sleep(0.5)
    typo = shell.invoke(export + " --require-achievement collect_woood")
    assert typo.returncode == 2 and "collect_woood" in typo.stdout and "collect_wood," in typo.stdout
    nothing = shell.invoke(export + " --run-id nobody")
    assert nothing.returncode == 1 and "no examples" in nothing.stdout


def shell_url_of(command: str, readme_port: str) -> str:
    """The README's URL for that port in a command (e.g. ``http://127.0.0.1:8001``)."""
    match = re.search(rf"http://[\w.]+:{readme_port}", command)
    assert match is not None, command
    return match.group(0)


def test_the_readme_task_app_shows_its_rollouts_in_the_viewer(shell: Shell) -> None:
    """README, "The workflow", then /viewer (docs/viewer.md): the traced app serves it and replays."""
    base = shell.url("8000")
    assert httpx.get(base + "/viewer", timeout=30).status_code == 200
    played = httpx.post(
        base + "/rollout",
        json={
            "run_id": "viewer-first-hour",
            "env": {"env_name": "crafter", "seed": 3},
            "policy": {"policy_name": "crafter-heuristic"},
            "max_turns": 30,
        },
        timeout=120,
    )
    assert played.status_code == 200, played.text
    for _ in range(100):  # the trace writer commits within 0.25 s of a rollout's end
        listed = httpx.get(base + "/viewer/api/rollouts", params={"run_id": "viewer-first-hour"}, timeout=30)
        if listed.json()["rows"]:
            break
        time.sleep(0.05)
    session_id = listed.json()["rows"][0]["session_id"]
    replay = httpx.get(f"{base}/viewer/api/rollouts/{session_id}/replay", timeout=60).json()
    assert replay["available"] and replay["divergence"] is None and replay["checked"] == 30
