"""`BabyAIEnv`: the "babyai" environment plug-in (AgentGym's BabyAI on minigrid 3.2.0).

The seed is AgentGym's ``data_idx`` (level ``data_idx % 40``, reset seed ``data_idx // 40``). Text
actions are AgentGym's high-level ones ("go to red ball 1", "pickup red key 1", "toggle and go
through blue locked door 1", "check available actions", ...), each expanded into minigrid steps
by a path search (`envs.babyai.view`) and run until one of them leaves the view unchanged; an
integer 0-6 is one primitive minigrid action (left, right, forward, pickup, drop, toggle, done).

Observation text, reward and score are AgentGym's: after each action, the view's description
and the available actions; the reward is the minigrid reward of the last step taken (it stays
until a later step changes it) and the score sums the rewards of every action. The episode ends
when the mission is accomplished with a reward above 0.5 (a later success keeps the episode
going, as in AgentGym). Snapshots record the task and the primitive steps taken, and a restore
replays them (minigrid is deterministic; about 0.1 ms a step).
"""

from __future__ import annotations

import base64
import copy
import io
from typing import Any

import numpy as np
from pydantic import Field

from envs.babyai import levels
from envs.babyai.view import DONE, PRIMITIVES, View, available_actions_text, describe
from envs.base import Frame, register_environment
from envs.errors import InvalidAction, InvalidState
from envs.text_game import MAX_ACTION_CHARS, TextGameConfig, TextGameEnv, TextGameObservation

MAX_REPLAY_STEPS = 100_000
NOT_RECOGNIZED = "The action is not recognized. Please check valid actions."
NO_CHANGE = "No change in state."
COMPLETED = "\n The task is completed."
ORACLE_HORIZON = 64  # bot steps looked ahead to place a text action on its plan


class BabyAIConfig(TextGameConfig):
    image: bool = Field(False, description="Add the full grid as a base64 PNG (`image_png_base64`).")


class BabyAIObservation(TextGameObservation):
    goal: str = Field(description="The mission.")
    level: str = Field(description="The BabyAI level.")
    state: str = Field(description="The text without the available actions.")
    available_actions: list[str] = Field(description="The text actions available now.")
    carrying: str | None = Field(description="What the agent carries.")
    image_png_base64: str | None = Field(default=None, description="The grid (config `image`).")


@register_environment
class BabyAIEnv(TextGameEnv[BabyAIConfig]):
    name = "babyai"
    version = "1"
    config_model = BabyAIConfig
    action_help = 'One BabyAI action from the available actions, e.g. "go to red ball 1" or "turn left".'
    observation_model = BabyAIObservation
    action_forms = (
        "turn left",
        "turn right",
        "move forward",
        "go to <obj> <id>",
        "pickup <obj> <id>",
        "go through <door> <id>",
        "toggle and go through <door> <id>",
        "toggle",
        "check available actions",
    )
    action_examples = ("go to red ball 1", "turn left", "pickup blue key 1")

    @classmethod
    def vocabulary(cls) -> str:
        return super().vocabulary()[:-1] + " (each observation lists those available now)."

    @classmethod
    def action_schema(cls) -> dict[str, Any]:
        text = super().action_schema()
        primitive = {
            "type": "integer",
            "minimum": 0,
            "maximum": len(PRIMITIVES) - 1,
            "description": "A primitive minigrid action: "
            + ", ".join(f"{i} {p}" for i, p in enumerate(PRIMITIVES)),
        }
        return {"anyOf": [text, primitive], "description": text["description"], "examples": text["examples"]}

    description = (
        "BabyAI (AgentGym, minigrid 3.2.0): 40 grid-world levels with high-level text actions "
        "(or primitive actions 0-6); seed = AgentGym's data_idx; score = AgentGym's cumulative reward."
    )
    state_magic = b"BABYAI1"

    def __init__(self, config: BabyAIConfig, seed: int | None) -> None:
        super().__init__(config, seed)
        self._level = ""
        self._gym: Any = None
        self._image: np.ndarray | None = None
        self._direction = 0
        self._view: View | None = None
        self._goal = ""
        self._state = ""  # the last observation without the list of available actions
        self._reward = 0.0
        self._primitives: list[int] = []
        self._bot: Any = None
        self._suggestion: int | None = None

    # -- the game ----------------------------------------------------------------------------

    def _start(self, data_idx: int) -> str:
        level, seed = levels.level_of(data_idx)
        if level != self._level or self._gym is None:
            self._gym, self._level = levels.make(level), level
        obs, _ = self._gym.reset(seed=seed)
        self._observe(obs)
        mission = self._gym.unwrapped.mission
        self._goal = mission.replace("then", "and").replace("after you", "and")
        self._reward, self._primitives = 0.0, []
        self._start_bot()
        self._state = self._view.description  # type: ignore[union-attr]
        return f"Your goal: {self._goal}\n{self._state}" + self._actions_suffix()

    def _check_actions(self, actions: Any) -> list[Any]:
        if isinstance(actions, (str, bytes)) or not isinstance(actions, (list, tuple)):
            raise InvalidAction(f"actions must be a list, got {type(actions).__name__}")
        if not actions:
            raise InvalidAction("no actions to execute")
        for i, action in enumerate(actions):
            if type(action) is int:
                if not 0 <= action < len(PRIMITIVES):
                    raise InvalidAction(
                        f"action {i}: primitive actions are 0-{len(PRIMITIVES) - 1} "
                        f"({', '.join(PRIMITIVES)}), got {action}"
                    )
            elif not isinstance(action, str):
                raise InvalidAction(f"action {i} must be a text action or a primitive index 0-6")
            elif len(action) > MAX_ACTION_CHARS:
                raise InvalidAction(f"action {i} is longer than {MAX_ACTION_CHARS} characters")
        return list(actions)

    def _act(self, action: Any) -> tuple[str, float, bool]:
        if type(action) is int:
            return self._run([action], verify=False)
        text = action.lower().strip()
        view = self._view
        assert view is not None
        if "check" in text:
            return self._say("You can take the following actions: " + ", ".join(view.actions))
        if text == "":
            return self._say(NO_CHANGE)
        if text not in view.actions:
            return self._say(view.errors.get(text, NOT_RECOGNIZED))
        steps = view.actions[text]
        if not steps:
            return self._say(NO_CHANGE)
        return self._run(steps, verify=True)

    def _say(self, message: str) -> tuple[str, float, bool]:
        """An action that changes nothing: the message, and the reward as it stands."""
        self._state = message
        return message + self._actions_suffix(), self._reward, False

    def _run(self, steps: list[int], verify: bool) -> tuple[str, float, bool]:
        """Take minigrid steps; with ``verify``, stop after one that leaves the view unchanged."""
        for primitive in steps:
            before = self._image
            obs, reward, terminated, _, _ = self._gym.step(primitive)
            self._primitives.append(primitive)
            self._observe(obs, describe_view=False)
            self._advance_bot(primitive)
            if verify and np.array_equal(obs["image"], before):
                break
        self._view = describe(self._gym, self._image, self._direction)  # type: ignore[arg-type]
        self._reward = float(reward)
        self._state = self._view.description + (COMPLETED if terminated else "")
        return self._state + self._actions_suffix(), self._reward, bool(terminated) and self._reward > 0.5

    def _observe(self, obs: dict[str, Any], describe_view: bool = True) -> None:
        self._image, self._direction = obs["image"], int(obs["direction"])
        if describe_view:
            self._view = describe(self._gym, self._image, self._direction)

    def _actions_suffix(self) -> str:
        assert self._view is not None
        return available_actions_text(list(self._view.actions))

    # -- the oracle (minigrid's BabyAI bot) --------------------------------------------------

    def _start_bot(self) -> None:
        self._bot = self._suggestion = None
        if self.config.oracle:
            from minigrid.utils.baby_ai_bot import BabyAIBot

            self._bot = BabyAIBot(self._gym)
            self._advance_bot(None)

    def _advance_bot(self, taken: int | None) -> None:
        if self._bot is None:
            return
        try:
            self._suggestion = int(self._bot.replan(taken))
        except Exception:  # the bot gives up on a few levels (e.g. KeyInBox): no suggestion
            self._bot, self._suggestion = None, None

    def _oracle_action(self) -> str | int | None:
        """The bot's next move in the agent's own action space (AgentGym's text actions): the
        longest available action whose steps are exactly the bot's next ones ("go to red ball 1"
        for a whole walk, "turn left" for one step), else the bot's next primitive's index.
        Taking it plays exactly the bot's moves, so the bot's success rate stands."""
        if self._bot is None or self._suggestion is None:
            return None
        assert self._view is not None
        plan = self._bot_plan()
        matches = [(len(s), t) for t, s in self._view.actions.items() if s and plan[: len(s)] == s]
        return max(matches)[1] if matches else self._suggestion

    def _bot_plan(self) -> list[int]:
        """The bot's next steps, to the end of its plan or ``ORACLE_HORIZON`` steps."""
        gym, bot = copy.deepcopy((self._gym, self._bot))
        steps: list[int] = []
        action = self._suggestion
        while action is not None and len(steps) < ORACLE_HORIZON:
            _, _, terminated, truncated, _ = gym.step(action)
            steps.append(action)
            if terminated or truncated:
                break
            try:
                action = int(bot.replan(action))
            except Exception:  # the bot gave up: its plan ends here
                action = None
        return steps

    # -- what callers see --------------------------------------------------------------------

    def _fields(self) -> dict[str, Any]:
        assert self._view is not None
        carrying = self._gym.unwrapped.carrying
        fields: dict[str, Any] = {
            "goal": self._goal,
            "level": self._level,
            "state": self._state,
            "available_actions": list(self._view.actions),
            "carrying": f"{carrying.color} {carrying.type}" if carrying is not None else None,
        }
        if self.config.image:
            fields["image_png_base64"] = base64.b64encode(self.frame_png()).decode("ascii")
        return fields

    @property
    def goal(self) -> str:
        return self._goal

    @property
    def state_text(self) -> str:
        """The last observation without the available actions (AgentGym's ``_get_obs()``)."""
        return self._state

    @property
    def available_actions(self) -> list[str]:
        assert self._view is not None
        return list(self._view.actions)

    @property
    def reward(self) -> float:
        """AgentGym's ``reward`` field: the last minigrid reward."""
        return self._reward

    def frame_png(self, tile_size: int = 16) -> bytes:
        """The full grid as a PNG (the agent's view highlighted), as AgentGym's ``/render`` draws it."""
        from PIL import Image

        rgb = self._gym.unwrapped.get_frame(highlight=True, tile_size=tile_size)
        buffer = io.BytesIO()
        Image.fromarray(rgb.astype("uint8")).save(buffer, format="PNG")
        return buffer.getvalue()

    def render_frame(self) -> Frame:
        """The full grid (the agent's view highlighted) and the last observation text."""
        self._started_check()
        return Frame(png=self.frame_png(), text=self._text)

    def close(self) -> None:
        super().close()
        if self._gym is not None:
            self._gym.close()
            self._gym = self._bot = None

    # -- snapshots: the task and the primitive steps, replayed -------------------------------

    def _game_state(self) -> dict[str, Any]:
        return {
            "level": self._level,
            "primitives": list(self._primitives),
            "reward": self._reward,
            "state": self._state,
        }

    def _restore_game(self, state: dict[str, Any]) -> None:
        primitives, reward, text = state.get("primitives"), state.get("reward"), state.get("state")
        if (
            not isinstance(primitives, list)
            or len(primitives) > MAX_REPLAY_STEPS
            or any(type(p) is not int or not 0 <= p <= DONE for p in primitives)
        ):
            raise InvalidState("invalid babyai snapshot: primitives must be a list of actions 0-6")
        if type(reward) not in (int, float) or not isinstance(text, str):
            raise InvalidState("invalid babyai snapshot: reward and state are required")
        level, _ = levels.level_of(self.seed)
        if state.get("level") != level:
            raise InvalidState(
                f"invalid babyai snapshot: level {state.get('level')!r:.60} is not task {self.seed}'s"
            )
        self._start(self.seed)
        for primitive in primitives:
            obs, *_ = self._gym.step(primitive)
            self._primitives.append(primitive)
            self._observe(obs, describe_view=False)
            self._advance_bot(primitive)
        self._view = describe(self._gym, self._image, self._direction)  # type: ignore[arg-type]
        self._reward, self._state = float(reward), text
