"""Bad input, table-driven: unknown ids, wrong types, huge bodies, NaN/inf, bad seeds, invalid
actions, ops over ``safety.max_ops``, path-like ids, unicode. Each gets a clear 4xx with a
``{code, detail}`` body, and nothing changes on the server: the /health counts and every file
under STATE_DIR are the same before and after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service import create_app
from tests.conftest import make_settings
from tests.hardening import assert_error, nothing_changes
from tools.fake_server import FakeInferenceServer
from tools.server_thread import ServerThread

MAX_BODY = 64 * 1024


@dataclass
class World:
    client: httpx.Client
    state_dir: Path
    env_id: str
    policy_id: str
    snapshot_id: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, fake_llm: FakeInferenceServer) -> Iterator[World]:
    """One server for the whole table, with a live env, a bound policy and a snapshot on disk."""
    settings = make_settings(
        tmp_path_factory.mktemp("input"), vllm_base_url=fake_llm.base_url, max_request_bytes=MAX_BODY
    )
    with (
        ServerThread(create_app(settings), name="input") as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        env_id = client.post("/env/create", json={"env_name": "crafter", "seed": 3}).json()["env_id"]
        policy_id = client.post(
            "/policy/create", json={"policy_name": "crafter-random", "bound_env_id": env_id}
        ).json()["policy_id"]
        snapshot_id = client.post("/env/snapshot", json={"env_id": env_id}).json()["snapshot_id"]
        yield World(client, settings.state_dir, env_id, policy_id, snapshot_id)


@dataclass
class Case:
    path: str
    body: Any = None  # JSON, with "{env}", "{policy}", "{snapshot}", "{other}" filled in
    status: int = 422
    code: str | None = "invalid_request"
    raw: bytes | None = None  # sent as is instead of ``body``
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"


RANDOM = "crafter-random"
ROLL = {"env": {"env_name": "crafter"}, "policy": {"policy_name": RANDOM}}
GROUP = {"group_size": 2, **ROLL}
GROUP_NO_SEQ = {"group_size": 2, "env": {"env_name": "crafter"}, "policy": {"policy_name": RANDOM}}

CASES: dict[str, Case] = {
    # Unknown ids
    "step unknown env": Case("/env/step", {"env_id": "{unknown}", "action": "noop"}, 404, "env_not_found"),
    "step untagged id": Case("/env/step", {"env_id": "nope", "action": "noop"}, 404, "env_not_found"),
    "reset unknown env": Case("/env/reset", {"env_id": "{unknown}"}, 404, "env_not_found"),
    "snapshot unknown env": Case("/env/snapshot", {"env_id": "{unknown}"}, 404, "env_not_found"),
    "restore unknown snapshot": Case("/env/restore", {"snapshot_id": "ab" * 16}, 404, "snapshot_not_found"),
    "policy step unknown": Case("/policy/step", {"policy_id": "{unknown}"}, 404, "policy_not_found"),
    "policy snapshot unknown": Case("/policy/snapshot", {"policy_id": "x"}, 404, "policy_not_found"),
    "policy restore unknown": Case("/policy/restore", {"snapshot_id": "cd" * 16}, 404, "snapshot_not_found"),
    "policy bound to unknown env": Case(
        "/policy/create", {"policy_name": RANDOM, "bound_env_id": "{unknown}"}, 404, "env_not_found"
    ),
    "rollout unknown env": Case(
        "/rollout", {**ROLL, "env": {"env_id": "{unknown}"}, "max_turns": 1}, 404, "env_not_found"
    ),
    "rollout unknown policy (its new env is released)": Case(
        "/rollout", {**ROLL, "policy": {"policy_id": "{unknown}"}, "max_turns": 1}, 404, "policy_not_found"
    ),
    "group from unknown snapshot": Case(
        "/rollout/group",
        {**GROUP, "env": {"snapshot_id": "ef" * 16}, "max_turns": 1},
        404,
        "snapshot_not_found",
    ),
    "abort unknown run": Case("/run/abort", {"run_id": "no-such-run"}, 404, "run_not_found"),
    "status of unknown run": Case("/run/status/no-such-run", method="GET", status=404, code="run_not_found"),
    "branch unknown env": Case("/branch", {"env_ids": ["{env}", "{unknown}"]}, 404, "env_not_found"),
    "id of another replica": Case(
        "/env/step", {"env_id": "{other}", "action": "noop"}, 421, "wrong_instance"
    ),
    # Wrong types
    "env_name is a number": Case("/env/create", {"env_name": 5}),
    "seed is a string": Case("/env/create", {"env_name": "crafter", "seed": "5"}),
    "seed is a bool": Case("/env/create", {"env_name": "crafter", "seed": True}),
    "seed is a float": Case("/env/create", {"env_name": "crafter", "seed": 1.5}),
    "config is a list": Case("/env/create", {"env_name": "crafter", "config": []}),
    "config value of the wrong type": Case(
        "/env/create", {"env_name": "crafter", "config": {"max_steps": "many"}}, 422, "invalid_config"
    ),
    "unknown config key": Case(
        "/env/create", {"env_name": "crafter", "config": {"difficulty": 3}}, 422, "invalid_config"
    ),
    "actions is a string": Case("/env/step", {"env_id": "{env}", "actions": "noop"}),
    "action is an object": Case("/env/step", {"env_id": "{env}", "action": {}}),
    "action is a bool": Case("/env/step", {"env_id": "{env}", "action": True}),
    "env_id is a number": Case("/env/step", {"env_id": 5, "action": "noop"}),
    "ops is a string": Case("/rollout", {**ROLL, "ops": "agent"}),
    "max_turns is a list": Case("/rollout", {**ROLL, "max_turns": []}),
    "dry_run is not a bool": Case("/policy/step", {"policy_id": "{policy}", "dry_run": "maybe"}),
    "typo in a field name": Case("/env/create", {"env_name": "crafter", "sede": 1}),
    "body is a list": Case("/env/create", [1, 2, 3]),
    "body is a string": Case("/env/create", "crafter"),
    "body is empty": Case("/env/create", raw=b""),
    "body is an empty object": Case("/env/create", {}),
    "body is not JSON": Case("/env/create", raw=b"{env_name: crafter"),
    "body is not JSON text": Case(
        "/env/create", raw=b'{"env_name": "crafter"}', headers={"content-type": "text/plain"}
    ),
    # Huge bodies and values
    "body over the size limit": Case(
        "/env/create", raw=b" " * (MAX_BODY + 1), status=413, code="payload_too_large"
    ),
    "chunked body over the size limit": Case(
        "/env/create", raw=b"chunked", status=413, code="payload_too_large"
    ),  # sent as a stream, without content-length
    "1,000 actions": Case("/env/step", {"env_id": "{env}", "actions": ["noop"] * 1000}),
    "10,000-character id": Case("/env/step", {"env_id": "e" * 10_000, "action": "noop"}),
    # Past what Python's parser recurses: refused by the strict parser like any too-deep body.
    "10,000-deep nesting": Case("/env/create", raw=b"[" * 10_000 + b"]" * 10_000),
    "1,200-deep nesting in a step": Case(
        "/env/step", raw=b'{"env_id": "{env}", "action": ' + b"[" * 1_200 + b"]" * 1_200 + b"}"
    ),
    "5,000-deep unclosed step": Case("/env/step", raw=b'{"env_id": "{env}", "actions": ' + b"[" * 5_000),
    "5,000-digit seed": Case(
        "/env/create",
        raw=b'{"env_name": "crafter", "seed": ' + b"9" * 5000 + b"}",
        status=400,
        code="bad_request",
    ),
    "group over max_group_size": Case(
        "/rollout/group", {**GROUP, "group_size": 300, "max_turns": 1}, 422, "group_too_large"
    ),
    # A config the policy refuses refuses the group, rather than failing each of its members.
    "group with a prompt format the policy lacks": Case(
        "/rollout/group",
        {
            **GROUP,
            "max_turns": 1,
            "policy": {"policy_name": "crafter-react", "config": {"prompt_format": "agentgym"}},
        },
        422,
        "invalid_config",
    ),
    "group with an oracle teacher on Crafter": Case(
        "/rollout/group",
        {
            **GROUP,
            "max_turns": 1,
            "policy": {"policy_name": "crafter-react", "config": {"teacher": "oracle"}},
        },
        422,
        "invalid_config",
    ),
    # NaN and infinities (Python's json parses them; JSON has none)
    "seed NaN": Case("/env/create", raw=b'{"env_name": "crafter", "seed": NaN}'),
    "max_time_s Infinity": Case(
        "/rollout",
        raw=b'{"env": {"env_name": "crafter"}, "policy": {"policy_name": "crafter-random"}, '
        b'"max_turns": 1, "safety": {"max_time_s": Infinity}}',
    ),
    "temperature -Infinity": Case(
        "/policy/create", raw=b'{"policy_name": "crafter-react", "config": {"temperature": -Infinity}}'
    ),
    "NaN in a free-form dict": Case(
        "/policy/create", raw=b'{"policy_name": "crafter-react", "config": {"extra_body": {"x": NaN}}}'
    ),
    "NaN in an observation": Case(
        "/policy/step", raw=b'{"policy_id": "{policy}", "observation": {"text": NaN}}'
    ),
    "float overflow 1e400": Case("/env/create", raw=b'{"env_name": "crafter", "seed": 1e400}'),
    # Negative and huge seeds
    "seed -1": Case("/env/create", {"env_name": "crafter", "seed": -1}),
    "seed 2**64": Case("/env/create", {"env_name": "crafter", "seed": 2**64}),
    "reset seed -1": Case("/env/reset", {"env_id": "{env}", "seed": -1}),
    "group seed 2**63": Case(
        "/rollout/group", {**GROUP, "env": {"env_name": "crafter", "seed": 2**63}, "max_turns": 1}
    ),
    # Invalid actions: 400, and the env does not move (checked in a test below)
    "unknown action name": Case("/env/step", {"env_id": "{env}", "action": "fly"}, 400, "invalid_action"),
    "action index out of range": Case("/env/step", {"env_id": "{env}", "action": 17}, 400, "invalid_action"),
    "negative action index": Case("/env/step", {"env_id": "{env}", "action": -1}),
    "one bad action in a list": Case(
        "/env/step", {"env_id": "{env}", "actions": ["noop", "fly"]}, 400, "invalid_action"
    ),
    "empty action name": Case("/env/step", {"env_id": "{env}", "action": ""}, 400, "invalid_action"),
    "unknown tool": Case(
        "/env/step", {"env_id": "{env}", "tool_calls": [{"tool": "rm", "args": {}}]}, 400, "invalid_action"
    ),
    "tool arguments not JSON": Case(
        "/env/step",
        {"env_id": "{env}", "tool_calls": [{"function": {"name": "interact_many", "arguments": "{x"}}]},
        400,
        "invalid_action",
    ),
    # Op sequences
    "ops beyond safety.max_ops": Case(
        "/rollout", {**ROLL, "ops": ["agent", "env"] * 3, "safety": {"max_ops": 4}}
    ),
    "group ops beyond safety.max_ops": Case(
        "/rollout/group", {**GROUP, "ops": ["agent", "env"] * 3, "safety": {"max_ops": 4}}
    ),
    "group with neither ops nor max_turns": Case("/rollout/group", GROUP_NO_SEQ),
    "group start with an env op first": Case("/rollout/group/start", {**GROUP, "ops": ["env", "agent"]}),
    "env op with no decision": Case("/rollout", {**ROLL, "ops": ["agent", "env", "env"]}),
    "max_turns 0": Case("/rollout", {**ROLL, "max_turns": 0}),
    "max_ops 0": Case("/rollout", {**ROLL, "max_turns": 1, "safety": {"max_ops": 0}}),
    # Path-like ids
    "env_id ../../etc/passwd": Case(
        "/env/step", {"env_id": "../../etc/passwd", "action": "noop"}, 404, "env_not_found"
    ),
    "snapshot_id ../../../etc/passwd": Case(
        "/env/restore", {"snapshot_id": "../../../etc/passwd"}, 404, "snapshot_not_found"
    ),
    "snapshot_id /etc/passwd": Case(
        "/policy/restore", {"snapshot_id": "/etc/passwd"}, 404, "snapshot_not_found"
    ),
    "snapshot_id with backslashes": Case(
        "/env/restore", {"snapshot_id": "..\\..\\state"}, 404, "snapshot_not_found"
    ),
    "snapshot_id with a NUL": Case(
        "/env/restore", {"snapshot_id": "ab" * 15 + "\u0000a"}, 404, "snapshot_not_found"
    ),
    "rl_run_id ../x at create": Case("/env/create", {"env_name": "crafter", "rl_run_id": "../x"}),
    "rl_run_id a/b at snapshot": Case("/env/snapshot", {"env_id": "{env}", "rl_run_id": "a/b"}),
    "rl_run_id with .. at snapshot": Case(
        "/env/snapshot", {"env_id": "{env}", "rl_run_id": "ok..ok"}, 422, "invalid_request"
    ),
    "rl_run_id ../.. at restore": Case("/env/restore", {"snapshot_id": "{snapshot}", "rl_run_id": "../.."}),
    "run_id ../x": Case("/rollout", {**ROLL, "max_turns": 1, "run_id": "../x"}),
    "encoded ../ in a path": Case(
        "/run/status/..%2F..%2Fetc%2Fpasswd", method="GET", status=404, code="not_found"
    ),
    # Unicode
    "env_name in Cyrillic with an emoji": Case(
        "/env/create", {"env_name": "кра́фтер🎮"}, 400, "unknown_plugin"
    ),
    "env_name with a NUL": Case("/env/create", {"env_name": "crafter\u0000"}, 400, "unknown_plugin"),
    "env_name with a right-to-left override": Case(
        "/env/create", {"env_name": "\u202ecrafter"}, 400, "unknown_plugin"
    ),
    "policy_name with a zero-width joiner": Case(
        "/policy/create", {"policy_name": "crafter\u200d-random"}, 400, "unknown_plugin"
    ),
    "env_id emoji": Case("/env/step", {"env_id": "🎮", "action": "noop"}, 404, "env_not_found"),
    "full-width action name": Case("/env/step", {"env_id": "{env}", "action": "ｄｏ"}, 400, "invalid_action"),
    "rl_run_id with non-ASCII letters": Case("/env/create", {"env_name": "crafter", "rl_run_id": "ünï"}),
    "lone surrogate escape": Case("/env/create", raw=b'{"env_name": "\\ud800crafter"}'),
    "a body that is not UTF-8": Case("/env/create", raw=b'{"env_name": "cr\xffafter"}'),
    # Policy configs that used to fail only at the first step
    "inference_url not http": Case(
        "/policy/create",
        {"policy_name": "crafter-react", "config": {"inference_url": "ftp://x"}},
        422,
        "invalid_config",
    ),
    "inference_url unparsable": Case(
        "/policy/create",
        {"policy_name": "crafter-react", "config": {"inference_url": "http://[::1"}},
        422,
        "invalid_config",
    ),
    "temperature out of range": Case(
        "/policy/create",
        {"policy_name": "crafter-react", "config": {"temperature": 5}},
        422,
        "invalid_config",
    ),
}


def fill(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, real in ids.items():
            value = value.replace("{" + name + "}", real)
        return value
    if isinstance(value, dict):
        return {k: fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, ids) for v in value]
    return value


def ids_of(world: World) -> dict[str, str]:
    instance, _, rest = world.env_id.partition("-")
    other = ("1" if instance[0] == "0" else "0") + instance[1:]
    return {
        "env": world.env_id,
        "policy": world.policy_id,
        "snapshot": world.snapshot_id,
        "unknown": f"{instance}-{uuid.uuid4().hex}",
        "other": f"{other}-{rest}",
    }


def send(client: httpx.Client, case: Case, ids: dict[str, str]) -> httpx.Response:
    if case.method == "GET":
        return client.get(case.path)
    headers = {"content-type": "application/json", **case.headers}
    if case.raw == b"chunked":
        chunks = (b" " * 8192 for _ in range(MAX_BODY // 8192 + 2))
        return client.post(case.path, content=chunks, headers=headers)
    if case.raw is not None:
        raw = fill(case.raw.decode(), ids).encode() if case.raw.isascii() else case.raw
        return client.post(case.path, content=raw, headers=headers)
    return client.post(case.path, json=fill(case.body, ids), headers=headers)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_a_clear_4xx_and_changes_nothing(world: World, name: str) -> None:
    case = CASES[name]
    with nothing_changes(world.client, world.state_dir):
        response = send(world.client, case, ids_of(world))
        assert_error(response, case.status, case.code)


def test_invalid_actions_take_no_step(world: World) -> None:
    client, env_id = world.client, world.env_id
    before = client.post("/env/reset", json={"env_id": env_id, "seed": 3}).json()
    for body in ({"action": "fly"}, {"actions": ["noop", "do", "fly"]}, {"action": 99}):
        assert client.post("/env/step", json={"env_id": env_id, **body}).status_code == 400
    after = client.post("/env/step", json={"env_id": env_id, "action": "noop"}).json()
    assert after["step_idx"] == before["step_idx"] + 1


def test_extreme_but_valid_values_work(world: World) -> None:
    """The edges of the accepted ranges are served, not refused."""
    client = world.client
    env = client.post("/env/create", json={"env_name": "crafter", "seed": 2**63 - 1}).json()
    assert env["step_idx"] == 0
    assert client.post("/env/step", json={"env_id": env["env_id"], "actions": [16] * 64}).status_code == 200
    assert client.post("/env/terminate", json={"env_id": env["env_id"]}).json()["existed"] is True
    emoji = client.post(
        "/policy/step", json={"policy_id": world.policy_id, "observation": {"text": "🎮 ∑ 漢字"}}
    )
    assert emoji.status_code == 200
