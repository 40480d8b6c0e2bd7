"""A one-decision toy environment and its LLM policy, registered only while a test runs.

``toy-words``: the agent names words; the reward is the share of the letter ``e`` among the
letters it said (graded, so two different answers almost never tie). The policy offers one
tool, ``say(actions: [word])`` (a teacher calls it with words from the enum); a reply without a
parsable call is taken as the spoken text itself. So a model far too small to call tools yet
still earns rewards that vary within a group: the signal a test of the GRPO loop needs, in
seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from envs.base import (
    ENVIRONMENTS,
    POLICIES,
    Environment,
    PluginConfig,
    Policy,
    PolicyContext,
    PolicyDecision,
    StepOptions,
    StepResult,
)
from envs.errors import EpisodeOver
from inference import openai_client
from inference.errors import InferenceError

WORDS = ["apple", "berry", "kiwi", "plum", "fig", "lime"]
SYSTEM = "Name a fruit. Call say."
TOOL = {
    "type": "function",
    "function": {
        "name": "say",
        "description": "Say words.",
        "parameters": {
            "type": "object",
            "properties": {"actions": {"type": "array", "items": {"enum": WORDS}, "maxItems": 1}},
        },
    },
}


class ToyWordsEnv(Environment[PluginConfig]):
    name: ClassVar[str] = "toy-words"

    def __init__(self, config: PluginConfig, seed: int | None) -> None:
        self.config, self.seed, self._done, self._steps = config, seed or 0, False, 0

    def _result(self, reward: float) -> StepResult:
        text = f"Round {self.seed}: name a fruit."
        return StepResult({"text": text}, reward, self._done, False, {"actions": []}, self._steps)

    def reset(self, seed: int | None = None) -> StepResult:
        self.seed = self.seed if seed is None else seed
        self._done, self._steps = False, 0
        return self._result(0.0)

    def step(self, actions: Sequence[str | int]) -> StepResult:
        if self._done:
            raise EpisodeOver("the round is over")
        said = " ".join(map(str, actions))
        self._done, self._steps = True, 1
        letters = [c for c in said.lower() if c.isalpha()]
        result = self._result(letters.count("e") / len(letters) if letters else 0.0)
        result.info["actions"] = [said]
        return result

    def observe(self) -> StepResult:
        return self._result(0.0)

    def actions_from_tool_calls(self, tool_calls: Sequence[dict[str, Any]]) -> list[str | int]:
        return [str(a) for call in tool_calls for a in call.get("args", {}).get("actions", [])] or [""]

    @classmethod
    def tools(cls) -> list[dict[str, Any]]:
        return [TOOL]

    @property
    def step_idx(self) -> int:
        return self._steps

    @property
    def done(self) -> bool:
        return self._done

    def get_state(self) -> bytes:
        return json.dumps({"seed": self.seed, "done": self._done, "steps": self._steps}).encode()

    @classmethod
    def from_state(cls, state: bytes) -> ToyWordsEnv:
        data = json.loads(state)
        env = cls(PluginConfig(), data["seed"])
        env._done, env._steps = data["done"], data["steps"]
        return env


class ToySayConfig(PluginConfig):
    inference_url: str | None = None
    model: str | None = None
    temperature: float = 1.0
    max_tokens: int = 16
    seed: int | None = None


class ToySayPolicy(Policy[ToySayConfig]):
    name: ClassVar[str] = "toy-say"
    env_name: ClassVar[str | None] = "toy-words"
    config_model: ClassVar[type[PluginConfig]] = ToySayConfig
    uses_inference: ClassVar[bool] = True

    def __init__(self, config: ToySayConfig, context: PolicyContext) -> None:
        self.config, self.context = config, context

    async def step(self, observation: dict[str, Any], options: StepOptions = StepOptions()) -> PolicyDecision:
        cfg = self.config
        request: dict[str, Any] = {
            "model": cfg.model or self.context.model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": observation["text"]},
            ],
            "tools": [TOOL],
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
        }
        if cfg.seed is not None:
            request["seed"] = cfg.seed
        if options.dry_run:
            return PolicyDecision(tool_calls=[], meta={"inference_request": request})
        pool = self.context.client_pool or openai_client.shared_pool()  # the service's, closed with it
        client = pool.get(cfg.inference_url or self.context.inference_url)
        try:
            call = await client.chat(
                request, return_token_ids=options.record_logprobs, deadline_s=options.timeout_s
            )
        except InferenceError as exc:
            return PolicyDecision(tool_calls=[], error=f"inference_{exc.kind}", error_detail=str(exc))
        message = call.response["choices"][0]["message"]
        if message.get("tool_calls"):
            raw = message["tool_calls"][0]["function"]
            args = json.loads(raw["arguments"] or "{}")
            calls = [{"id": "say", "tool": raw["name"], "args": args if isinstance(args, dict) else {}}]
        else:  # the spoken text itself
            calls = [{"id": "say", "tool": "say", "args": {"actions": [message.get("content") or ""]}}]
        return PolicyDecision(tool_calls=calls, llm_call=call)

    def get_state(self) -> dict[str, Any]:
        return {"config": self.config.model_dump()}

    @classmethod
    def from_state(cls, state: dict[str, Any], context: PolicyContext) -> ToySayPolicy:
        return cls(ToySayConfig.model_validate(state["config"]), context)


@contextmanager
def toy_plugins() -> Iterator[None]:
    ENVIRONMENTS[ToyWordsEnv.name] = ToyWordsEnv
    POLICIES[ToySayPolicy.name] = ToySayPolicy
    try:
        yield
    finally:
        ENVIRONMENTS.pop(ToyWordsEnv.name, None)
        POLICIES.pop(ToySayPolicy.name, None)
