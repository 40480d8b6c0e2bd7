"""A reply the environment cannot use is answered, not fatal: the turn is recorded as invalid,
counts as a round, takes no env step, and the model is told what was wrong in the next prompt.
Checked on the agent's prompts, on real text games through ``POST /rollouts`` with the
vLLM-shaped fake, and with an untrained model behind ``serve-model`` (the real case)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch

os.environ.setdefault("SCIWORLD_JVMS", "1")

from envs.agent.formats import MULTIPLE_ACTIONS_FEEDBACK, Turn  # noqa: E402
from envs.base import DRY_RUN, POLICIES, PolicyContext, StepResult  # noqa: E402
from tests.conftest import MODEL  # noqa: E402
from tests.llm_helpers import make_tiny_model  # noqa: E402
from tests.test_batch_rollouts import traced_sessions  # noqa: E402
from tools.fake_server import FakeConfig, FakeInferenceServer  # noqa: E402
from tools.server_thread import ServerThread  # noqa: E402
from training.llm.server import ModelEngine, create_model_app  # noqa: E402


def textcraft_agent(**config: object):
    return POLICIES["textcraft-agent"].create({"model": "m", **config}, PolicyContext())


def moved(text: str) -> StepResult:
    return StepResult({"text": text}, 0.0, False, False, {}, 1)


def replied(policy, observation: str, reply: str) -> None:
    """The agent's state after the model answered ``observation`` with ``reply`` (as `_decide` leaves it)."""
    parsed = policy.parse_reply({"content": reply}, "stop")
    policy._pending = Turn(
        observation=observation, tool_calls=parsed.tool_calls, reply=reply, error=parsed.error
    )


async def prompt(policy, text: str) -> list[dict]:
    return (await policy.step({"text": text}, DRY_RUN)).meta["inference_request"]["messages"]


async def test_agentgym_prompt_answers_an_invalid_reply_like_agentgyms_client() -> None:
    policy = textcraft_agent()
    # Turn 0: a reply with two Action lines; the env is not stepped.
    replied(policy, "obs 0", "Action: get 1 oak logs\nAction: inventory")
    assert policy.answer_invalid("multiple_actions", "two lines") == MULTIPLE_ACTIONS_FEEDBACK
    messages = await prompt(policy, "obs 0")
    assert [m["content"] for m in messages[2:]] == [
        "obs 0",
        "Action: get 1 oak logs\nAction: inventory",
        MULTIPLE_ACTIONS_FEEDBACK,  # the unchanged observation is not repeated
    ]
    # Turn 1: no Action line at all, then a valid turn: the history keeps both, as written.
    replied(policy, "obs 0", "I am thinking.")
    feedback = policy.answer_invalid("no_action", "no line")
    assert feedback is not None and "'Action: <your action>'" in feedback
    replied(policy, "obs 0", "Action: inventory")
    policy.observe_outcome(moved("obs 1"))
    messages = await prompt(policy, "obs 1")
    assert [m["content"] for m in messages[2:]] == [
        "obs 0",
        "Action: get 1 oak logs\nAction: inventory",
        MULTIPLE_ACTIONS_FEEDBACK,
        "I am thinking.",
        feedback,
        "Action: inventory",
        "obs 1",
    ]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 4 + ["user"]
    # A window that no longer holds the invalid turn's own message shows the observation again.
    short = textcraft_agent(history_window=1)
    replied(short, "obs 0", "hm")
    short.answer_invalid("no_action", None)
    replied(short, "obs 0", "still hm")
    short.answer_invalid("no_action", None)
    assert [m["content"] for m in (await prompt(short, "obs 0"))[2:]] == ["obs 0", "still hm", feedback]
    # The state round-trips with the invalid turns; "end" and non-reply failures answer nothing.
    restored = type(policy).from_state(policy.get_state(), policy.context)
    assert await prompt(restored, "obs 1") == messages
    ending = textcraft_agent(on_invalid_reply="end")
    replied(ending, "obs 0", "hm")
    assert ending.answer_invalid("no_action", None) is None and not ending.history
    assert policy.answer_invalid("inference_timeout", None) is None


@pytest.fixture
def llm(fake_llm: FakeInferenceServer) -> Iterator[FakeInferenceServer]:
    yield fake_llm
    fake_llm.set_config(FakeConfig(model=MODEL))


def test_rollouts_on_text_games_go_on_after_an_unparsable_reply(
    start_server: Callable[..., ServerThread], llm: FakeInferenceServer, tmp_path: Path
) -> None:
    db = tmp_path / "traces.db"
    server = start_server(trace_db=db)
    # The fake's no_tool_call fault leaves the Action line out of a ReAct reply.
    script = ["ok", "no_tool_call", "ok"]
    body = {"model": MODEL, "base_url": llm.base_url, "ids": [2], "max_round": 3, "concurrency": 1}
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        results = {}
        for game in ("textcraft", "babyai"):
            llm.set_config(FakeConfig(model=MODEL, text_actions=["inventory"], fault_script=script))
            r = client.post("/rollouts", json={**body, "env": game})
            assert r.status_code == 200, r.text
            results[game] = r.json()["results"][0]
        llm.set_config(FakeConfig(model=MODEL, text_actions=["inventory"], fault_script=script))
        ended = client.post(
            "/rollouts", json={**body, "env": "textcraft", "policy_config": {"on_invalid_reply": "end"}}
        ).json()["results"][0]
    for game, res in results.items():
        assert res["error"] is None and res["stop_reason"] == "completed", (game, res)
        assert res["rounds"] == 3 and res["invalid_rounds"] == 1
        assert len(res["turns"]) == 3 and all(t["completion_token_ids"] for t in res["turns"])
        conversation = res["conversation"]
        assert [m["role"] for m in conversation] == ["user", "assistant"] + ["user", "assistant"] * 3 + [
            "user"
        ]
        assert "Action:" not in conversation[5]["content"]  # the invalid reply, as written
        assert conversation[6]["content"].startswith("Error: your reply has no 'Action: ...' line")
    assert (ended["stop_reason"], ended["rounds"], ended["invalid_rounds"]) == (
        "policy_error:no_action",
        2,
        1,
    )
    assert len(traced_sessions(db, 3)) == 3


@pytest.fixture(scope="module")
def untrained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    torch.set_num_threads(1)
    # BabyAI's prompts outgrow the default 1024 positions by the second round.
    path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", max_positions=4096)
    engine = ModelEngine(path, served_name="tiny")
    with ServerThread(create_model_app(engine), name="model-server") as server:
        yield server
    engine.close()


def test_an_untrained_model_plays_every_round(
    start_server: Callable[..., ServerThread], untrained: ServerThread
) -> None:
    """What real vLLM showed with an untrained model: no reply has a usable action line. Every
    episode still runs to max_round, each round with the sampler's own tokens."""
    server = start_server()
    body = {
        "env": "babyai",
        "model": "tiny",
        "base_url": untrained.base_url,
        "ids": [0, 1],
        "max_round": 3,
        "max_tokens": 12,
        "temperature": 1.0,
    }
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        r = client.post("/rollouts", json=body)
    assert r.status_code == 200, r.text
    for res in r.json()["results"]:
        assert res["error"] is None and res["rounds"] == 3, {k: v for k, v in res.items() if k != "turns"}
        assert res["stop_reason"] in ("completed", "episode_done")
        assert res["invalid_rounds"] >= 1  # a 512-token random model does not write 'Action: ...'
        assert len(res["turns"]) == 3 and all(t["completion_token_ids"] for t in res["turns"])
        errors = [m["content"] for m in res["conversation"] if m["role"] == "user"][2:]
        assert sum(e.startswith("Error:") for e in errors) == res["invalid_rounds"]
