"""/env/* over real HTTP: lifecycle, determinism, snapshot → restore, bad input."""

from __future__ import annotations

import asyncio

import httpx
import pytest

ACTIONS = ["move_left", "do", "move_up", "noop", "do", "move_right", "move_down", "do"] * 5


def create(client: httpx.Client, seed: int = 7, **extra: object) -> dict:
    r = client.post("/env/create", json={"env_name": "crafter", "seed": seed, "rl_run_id": "t", **extra})
    assert r.status_code == 200, r.text
    return r.json()


def play(client: httpx.Client, env_id: str, actions: list[str]) -> list[dict]:
    out = []
    for action in actions:
        r = client.post("/env/step", json={"env_id": env_id, "action": action})
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def strip_ids(steps: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "env_id"} for s in steps]


def test_lifecycle(client: httpx.Client) -> None:
    env = create(client)
    assert env["step_idx"] == 0 and env["observation"]["text"]
    assert "image_png_base64" not in env["observation"]

    r = client.post("/env/step", json={"env_id": env["env_id"], "actions": ["move_left", 5, "noop"]})
    body = r.json()
    assert r.status_code == 200 and body["step_idx"] == 3
    assert isinstance(body["reward"], float) and body["done"] is False and body["truncated"] is False
    assert body["info"]["actions_executed"] == 3

    r = client.post(
        "/env/step",
        json={
            "env_id": env["env_id"],
            "tool_calls": [{"tool": "interact_many", "args": {"actions": ["noop"]}}],
        },
    )
    assert r.status_code == 200 and r.json()["step_idx"] == 4

    r = client.post("/env/reset", json={"env_id": env["env_id"], "seed": 7})
    assert r.status_code == 200 and r.json()["step_idx"] == 0
    assert r.json()["observation"] == env["observation"]

    assert client.post("/env/terminate", json={"env_id": env["env_id"]}).json() == {
        "ok": True,
        "existed": True,
    }
    assert client.post("/env/terminate", json={"env_id": env["env_id"]}).json() == {
        "ok": True,
        "existed": False,
    }
    r = client.post("/env/step", json={"env_id": env["env_id"], "action": "noop"})
    assert r.status_code == 404 and r.json()["code"] == "env_not_found"


def test_same_seed_same_trajectory_over_http(client: httpx.Client) -> None:
    a, b = create(client, seed=11), create(client, seed=11)
    assert a["observation"] == b["observation"]
    assert strip_ids(play(client, a["env_id"], ACTIONS)) == strip_ids(play(client, b["env_id"], ACTIONS))


@pytest.mark.through_ray
def test_concurrent_steps_answer_each_like_one_by_one(client: httpx.Client) -> None:
    """Many clients stepping at once (through Ray, the front sends one host's steps of the same
    moment in one actor call): each answer is its own env's, a bad step fails alone."""
    seeds = list(range(20, 28))
    alone = [strip_ids(play(client, create(client, seed=s)["env_id"], ACTIONS[:12])) for s in seeds]
    together = [create(client, seed=s)["env_id"] for s in seeds]

    async def step_all() -> list[list[dict]]:
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=60) as aclient:
            played: list[list[dict]] = [[] for _ in seeds]
            for action in ACTIONS[:12]:
                bodies = [{"env_id": env_id, "action": action} for env_id in together]
                bodies.append({"env_id": together[0], "action": "fly"})  # refused: no step taken
                answers = await asyncio.gather(*(aclient.post("/env/step", json=b) for b in bodies))
                assert answers[-1].status_code == 400, answers[-1].text
                for i, answer in enumerate(answers[:-1]):
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["env_id"] == together[i]
                    played[i].append(answer.json())
            return played

    assert [strip_ids(steps) for steps in asyncio.run(step_all())] == alone


def test_snapshot_restore_continues_identically(client: httpx.Client) -> None:
    env = create(client, seed=3)
    play(client, env["env_id"], ACTIONS[:10])
    snap = client.post("/env/snapshot", json={"env_id": env["env_id"]}).json()
    assert snap["kind"] == "env" and snap["size"] > 0 and snap["rl_run_id"] == "t"
    assert snap["path"].endswith(f"/runs/t/env/{snap['snapshot_id'][:2]}/{snap['snapshot_id']}.tar.gz")

    restored = client.post("/env/restore", json={"snapshot_id": snap["snapshot_id"]})
    assert restored.status_code == 200, restored.text
    restored = restored.json()
    assert restored["env_id"] != env["env_id"] and restored["step_idx"] == 10
    assert restored["parent_env_id"] == env["env_id"]

    original = strip_ids(play(client, env["env_id"], ACTIONS[10:]))
    replayed = strip_ids(play(client, restored["env_id"], ACTIONS[10:]))
    assert original == replayed


def test_invalid_action_takes_no_step(client: httpx.Client) -> None:
    env = create(client)
    r = client.post("/env/step", json={"env_id": env["env_id"], "actions": ["noop", "fly"]})
    assert r.status_code == 400 and r.json()["code"] == "invalid_action" and "fly" in r.json()["detail"]
    r = client.post("/env/step", json={"env_id": env["env_id"], "action": 99})
    assert r.status_code == 400
    r = client.post("/env/step", json={"env_id": env["env_id"], "action": "noop"})
    assert r.json()["step_idx"] == 1


def test_bad_requests_are_clear_4xx(client: httpx.Client) -> None:
    cases = [
        ("/env/create", {"env_name": "nethack"}, 400, "nethack"),
        ("/env/create", {"env_name": "crafter", "config": {"difficulty": "hard"}}, 422, "difficulty"),
        ("/env/create", {"env_name": "crafter", "seed": -1}, 422, "seed"),
        ("/env/create", {"env_name": "crafter", "rl_run_id": "../../etc"}, 422, "rl_run_id"),
        ("/env/step", {"env_id": "nope", "action": "noop"}, 404, "nope"),
        ("/env/step", {"env_id": "x"}, 422, "exactly one"),
        ("/env/restore", {"snapshot_id": "../../../etc/passwd"}, 404, "snapshot"),
        ("/env/restore", {"snapshot_id": "0" * 32}, 404, "snapshot"),
        ("/policy/create", {"policy_name": "gpt-god"}, 400, "gpt-god"),
    ]
    for path, body, status, needle in cases:
        r = client.post(path, json=body)
        assert r.status_code == status, (path, body, r.status_code, r.text)
        assert needle in r.text, (path, r.text)


def test_info_and_health(client: httpx.Client) -> None:
    info = client.get("/info").json()
    assert {"crafter"} <= {e["name"] for e in info["environments"]}
    assert {"crafter-react", "crafter-random", "crafter-heuristic"} <= {p["name"] for p in info["policies"]}
    assert info["inference"]["endpoints"]["chat_completions"] == "/v1/chat/completions"
    health = client.get("/health").json()
    assert health["status"] == "healthy" and health["envs"] >= 0
    assert "docs" in info["service"]["endpoints"]
    assert client.get("/openapi.json").status_code == 200


def test_ids_from_another_replica_get_421(client: httpx.Client) -> None:
    env_id = create(client)["env_id"]
    instance, _, rest = env_id.partition("-")
    foreign = ("0" if instance[0] != "0" else "1") + instance[1:] + "-" + rest
    r = client.post("/env/step", json={"env_id": foreign, "action": "noop"})
    assert r.status_code == 421 and r.json()["code"] == "wrong_instance" and instance in r.json()["detail"]
    client.post("/env/terminate", json={"env_id": env_id})
    r = client.post("/env/step", json={"env_id": env_id, "action": "noop"})
    assert r.status_code == 404 and "terminated, or expired" in r.json()["detail"]


def test_a_ray_host_tags_its_ids_with_the_tag_its_front_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_service.core import registry

    monkeypatch.setattr(registry, "_instance", registry.instance_id())  # this process's, restored after
    registry.adopt_instance_id("0123abcd")
    assert registry.instance_id() == "0123abcd" and registry.new_instance_id().startswith("0123abcd-")
    with pytest.raises(ValueError, match="8 lowercase hex digits"):
        registry.adopt_instance_id("host-1")


def test_dot_dot_run_id_refused_at_create(client: httpx.Client) -> None:
    r = client.post("/env/create", json={"env_name": "crafter", "rl_run_id": "a..b"})
    assert r.status_code == 422 and "rl_run_id" in r.text


@pytest.mark.parametrize("env_name", ["crafter", "textcraft", "babyai"])
def test_step_answers_the_bytes_its_response_model_writes(client: httpx.Client, env_name: str) -> None:
    """/env/step is encoded by orjson (`answer_json`); its bytes are pydantic's for the same
    answer, rewards (floats, also when an int) and nested observations included."""
    from grpo_service.models import EnvStepResponse

    r = client.post("/env/create", json={"env_name": env_name, "seed": 3, "rl_run_id": "t"})
    assert r.status_code == 200, r.text
    env_id = r.json()["env_id"]
    actions = {"crafter": ["do", "move_left", "do"], "textcraft": ["inventory"], "babyai": ["turn left"]}
    for action in actions[env_name] * 3:
        r = client.post("/env/step", json={"env_id": env_id, "action": action})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
        assert r.content == EnvStepResponse.model_validate_json(r.content).model_dump_json().encode()
        assert isinstance(r.json()["reward"], float)
        if r.json()["done"]:
            break
