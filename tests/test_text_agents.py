"""The LLM agents of TextCraft, BabyAI and SciWorld (configurations of the generic agent), and
seed 003's ``POST /rollouts`` with them against the vLLM-shaped fake."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("SCIWORLD_JVMS", "1")

from envs.base import DRY_RUN, POLICIES, PolicyContext  # noqa: E402
from envs.text_game import TOOL_NAME  # noqa: E402
from tests.conftest import MODEL  # noqa: E402
from tests.test_batch_rollouts import traced_sessions  # noqa: E402
from tools.fake_server import FakeConfig, FakeInferenceServer  # noqa: E402
from tools.server_thread import ServerThread  # noqa: E402

GAMES = ("textcraft", "babyai", "sciworld")


@pytest.fixture
def acting_llm(fake_llm: FakeInferenceServer) -> Iterator[FakeInferenceServer]:
    """The fake answers in AgentGym's ReAct form with one of a few TextCraft actions."""
    fake_llm.set_config(FakeConfig(model=MODEL, text_actions=["get 1 oak logs", "inventory"]))
    try:
        yield fake_llm
    finally:
        fake_llm.set_config(FakeConfig(model=MODEL))


@pytest.mark.parametrize("game", GAMES)
async def test_agent_builds_agentgyms_conversation_and_the_act_tool(game: str) -> None:
    cls = POLICIES[f"{game}-agent"]
    assert cls.env_name == game and cls.uses_inference
    policy = cls.create({"model": "m"}, PolicyContext())
    observation = {"text": "You see a door."}
    request = (await policy.step(observation, DRY_RUN)).meta["inference_request"]
    messages = request["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "OK. I'll follow your instructions and try my best to solve the task."
    assert messages[2]["content"] == "You see a door." and "tools" not in request
    tools = cls.create({"model": "m", "prompt_format": "tool_calls"}, PolicyContext())
    request = (await tools.step(observation, DRY_RUN)).meta["inference_request"]
    assert [t["function"]["name"] for t in request["tools"]] == [TOOL_NAME]


def test_seed_curl_line_with_textcraft_records_conversation_tokens_and_traces(
    start_server: Callable[..., ServerThread], acting_llm: FakeInferenceServer, tmp_path: Path
) -> None:
    db = tmp_path / "traces.db"
    server = start_server(trace_db=db)
    body = {
        "env": "textcraft",
        "model": MODEL,
        "base_url": acting_llm.base_url,
        "ids": [0, 1, 2, 3],
        "max_round": 3,
    }
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        r = client.post("/rollouts", json=body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [res["id"] for res in results] == [0, 1, 2, 3]
    for res in results:
        assert res["error"] is None and res["rounds"] == 3 and res["score"] == 0.0 and not res["success"]
        conversation = res["conversation"]
        assert [m["role"] for m in conversation] == ["user", "assistant"] + ["user", "assistant"] * 3 + [
            "user"
        ]
        assert conversation[2]["content"].startswith("Crafting commands:")
        assert "\nAction: " in conversation[3]["content"]
        assert conversation[4]["content"] in (
            "Got 1 oak logs",
            "Inventory: You are not carrying anything.",
        ) or (conversation[4]["content"].startswith("Inventory: [oak logs]"))
        assert len(res["turns"]) == 3 and all(t["completion_token_ids"] for t in res["turns"])
    rows = traced_sessions(db, 4)
    assert sorted(seed for env, seed, _, _ in rows if env == "textcraft") == [0, 1, 2, 3]


def test_out_of_range_ids_name_the_range(client: httpx.Client, fake_llm: FakeInferenceServer) -> None:
    body = {
        "env": "sciworld",
        "model": MODEL,
        "base_url": fake_llm.base_url,
        "ids": [0, 4639],
        "max_round": 1,
    }
    r = client.post("/rollouts", json=body)
    assert r.status_code == 422 and "ids[1]=4639" in r.json()["detail"] and "0..4638" in r.json()["detail"]
    r = client.post("/rollouts", json={**body, "env": "textcraft", "ids": [544]})
    assert r.status_code == 422 and "0..543" in r.json()["detail"]


def test_eval_env_textcraft_reports_success_rate_and_mean_score(
    start_server: Callable[..., ServerThread], acting_llm: FakeInferenceServer, tmp_path: Path
) -> None:
    import json

    from typer.testing import CliRunner

    from grpo_service.cli import app

    server = start_server(vllm_base_url=acting_llm.base_url)
    out = tmp_path / "eval.json"
    args = ["eval", "--base-url", server.base_url, "--env", "textcraft", "--model", MODEL, "--seeds", "0-2"]
    result = CliRunner().invoke(app, [*args, "--max-turns", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "success rate" in result.output and "mean score" in result.output
    report = json.loads(out.read_text())
    assert report["aggregate"]["success_rate"] == 0.0 and report["aggregate"]["mean_score"] == 0.0
    assert report["config"]["env_name"] == "textcraft"
    assert [e["total_return"] for e in report["episodes"]] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("game", "task", "prompt_format"), [("textcraft", 0, "agentgym"), ("babyai", 1, "tool_calls")]
)
def test_oracle_teacher_traces_the_agents_prompts_and_exports_them_as_sft_data(
    start_server: Callable[..., ServerThread], tmp_path: Path, game: str, task: int, prompt_format: str
) -> None:
    """``teacher: oracle``: the agent's own prompts answered by the solver, traced as model 'oracle'
    and exported as chat SFT examples (how scripted baselines are distilled into a model)."""
    import json

    from grpo_service.tracing.export import ExportFilters, export_sft

    db = tmp_path / "traces.db"
    server = start_server(trace_db=db)
    config = {"teacher": "oracle", "prompt_format": prompt_format, "temperature": 0.0}
    body = {
        "group_size": 1,
        "env": {"env_name": game, "seed": task, "config": {"oracle": True}},
        "max_turns": 20,
        "policy": {"policy_name": f"{game}-agent", "config": config},
    }
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        result = client.post("/rollout/group", json=body).json()["members"][0]["result"]
        (trajectory,) = result["trajectories"]
        assert trajectory["done"] and trajectory["total_reward"] > 0  # the solver's success
        # Without the env's oracle there is nothing to teach: a policy error, not a guess.
        no_oracle = client.post("/rollout/group", json={**body, "env": {"env_name": game, "seed": task}})
        assert no_oracle.json()["members"][0]["result"]["stop_reason"] == "policy_error:no_oracle_action"
        r = client.post(
            "/policy/create", json={"policy_name": "crafter-react", "config": {"teacher": "oracle"}}
        )
        assert r.status_code == 422 and "text action space" in r.text
    traced_sessions(db, 2)
    report = export_sft(db, tmp_path / "sft.jsonl", ExportFilters(model="oracle"))
    examples = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert report.examples == len(examples) == trajectory["length"] >= 1
    replies = []
    for example in examples:
        reply = example["messages"][-1]
        if prompt_format == "agentgym":
            assert "tools" not in example and example["messages"][0]["content"].startswith("You are")
            replies.append(reply["content"].removeprefix("Action: "))
        else:
            assert [t["function"]["name"] for t in example["tools"]] == [TOOL_NAME]
            replies.append(json.loads(reply["tool_calls"][0]["function"]["arguments"])["action"])
    assert replies == [a for step in trajectory["steps"] for a in step["actions"]]
