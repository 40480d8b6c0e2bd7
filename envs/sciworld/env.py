"""`SciWorldEnv`: the "sciworld" environment plug-in (AgentGym's SciWorld, ScienceWorld 1.2.3 on Java 17).

The seed is AgentGym's ``data_idx`` into its flat (task, variation) list (`envs.sciworld.tasks`).
A reset loads the task and looks around, as AgentGym's server does; the first observation is
the task description and that look, as AgentGym's client shows it. Each action's observation
is the simulator's answer; the score is the simulator's 0-100 score (negative when the agent
did something fatal), the reward its change, and the episode ends when the task is complete,
the score drops below zero, or after 100 moves (ScienceWorld's default step limit, AgentGym's).

The simulator cannot export its state, so the env *is* its history (task, variation, actions)
and runs on a simulator leased from a shared pool of JVMs (`envs.sciworld.pool`) that is
brought to that history before each call. A snapshot is that history; a restore costs nothing
until the next step, which replays it on a JVM that does not already stand there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from envs.base import EpisodeOutcome, register_environment
from envs.errors import InvalidState
from envs.sciworld.pool import Load, Simulator, pool
from envs.sciworld.tasks import TASKS
from envs.text_game import TextGameConfig, TextGameEnv, TextGameObservation

LOOK = "look around"
MAX_HISTORY = 10_000


class SciWorldConfig(TextGameConfig):
    step_limit: int = Field(
        100,
        ge=1,
        le=MAX_HISTORY,
        description="Moves after which the episode ends (ScienceWorld's envStepLimit).",
    )


class SciWorldObservation(TextGameObservation):
    task_name: str
    task_id: str
    variation: int
    task_description: str
    observation: str = Field(description="The simulator's last answer.")
    score: int = Field(description="The simulator's score, -100 to 100.")
    moves: int


@register_environment
class SciWorldEnv(TextGameEnv[SciWorldConfig]):
    name = "sciworld"
    version = "1"
    config_model = SciWorldConfig
    action_help = (
        'One ScienceWorld command, e.g. "open door to kitchen" or "focus on substance in metal pot".'
    )
    observation_model = SciWorldObservation
    # AgentGym's list of ScienceWorld's actions (`envs.sciworld.prompt`)
    action_forms = (
        "open OBJ",
        "close OBJ",
        "activate OBJ",
        "deactivate OBJ",
        "connect OBJ to OBJ",
        "disconnect OBJ",
        "use OBJ [on OBJ]",
        "look around",
        "look at OBJ",
        "look in OBJ",
        "read OBJ",
        "move OBJ to OBJ",
        "pick up OBJ",
        "put down OBJ",
        "pour OBJ into OBJ",
        "dunk OBJ into OBJ",
        "mix OBJ",
        "go to LOC",
        "eat OBJ",
        "flush OBJ",
        "focus on OBJ",
        "wait",
        "wait1",
        "examine OBJ",
        "task",
        "inventory",
    )
    action_examples = ("look around", "open door to kitchen", "focus on substance in metal pot")
    description = (
        "SciWorld (AgentGym, ScienceWorld 1.2.3): 4,639 science tasks (task × variation) in a text "
        "simulator; seed = AgentGym's data_idx; score -100..100."
    )
    state_magic = b"SCIWORLD1"

    def __init__(self, config: SciWorldConfig, seed: int | None) -> None:
        super().__init__(config, seed)
        self._load: Load | None = None
        self._history: list[str] = []  # every action sent since the load, starting with the look
        self._task_description = ""
        self._observation = ""  # the simulator's last answer (AgentGym's ``observation``)
        self._sim_score = 0
        self._moves = 0
        self._gold: list[str] = []

    @classmethod
    def num_tasks(cls) -> int:
        return len(TASKS)

    @classmethod
    def eval_metrics(cls, episodes: Sequence[EpisodeOutcome]) -> dict[str, Any]:
        """An episode's return is its final score (-100..100); it succeeded when the score is 100
        (AgentGym counts a score of 100 as success; a positive score is only partial progress)."""
        n = len(episodes)
        return {
            "success_rate": sum(1 for e in episodes if e.total_return >= 100) / n if n else 0.0,
            "mean_score": sum(e.total_return for e in episodes) / n if n else 0.0,
        }

    @property
    def task(self) -> Any:
        return TASKS[self.seed]

    # -- the game ----------------------------------------------------------------------------

    def _start(self, data_idx: int) -> str:
        task = TASKS[data_idx]
        load = Load(task.task_name, task.variation, gold=self.config.oracle)
        with pool().lease(load, []) as sim:
            sim.go_to(load, [])  # a fresh load or reset of this task
            self._task_description = str(sim.env.server.getTaskDescription())
            self._gold = list(sim.env.get_gold_action_sequence()) if load.gold else []
            self._load, self._history = load, []
            self._sim_score = 0
            observation, _, _ = self._send(sim, LOOK)
        self._observation = observation
        return f"{self._task_description}\n{observation}"

    def _act(self, action: Any) -> tuple[str, float, bool]:
        assert self._load is not None
        with pool().lease(self._load, self._history) as sim:
            observation, reward, done = self._send(sim, action)
        self._observation = observation
        return observation, reward, done

    def _send(self, sim: Simulator, action: str) -> tuple[str, float, bool]:
        """One simulator step with ScienceWorld's own score, reward and completion rules."""
        observation = sim.step(action)
        self._history.append(action)
        server = sim.env.server
        score = int(round(100 * server.getScore()))
        reward = score - self._sim_score
        self._sim_score = score
        self._moves = int(server.getNumMoves())
        done = bool(server.getCompleted()) or self._moves > self.config.step_limit or score < 0
        return observation, float(reward), done

    def _score_after(self, reward: float) -> float:
        return float(self._sim_score)

    def _is_success(self, reward: float, done: bool) -> bool:
        return self._sim_score >= 100

    def _oracle_action(self) -> str | None:
        return self._gold[self._steps] if self._steps < len(self._gold) else None

    def query(self, method: str, *args: Any) -> Any:
        """Call a read-only `ScienceWorldEnv` method (``get_possible_actions``, ``look``, ...) at this
        env's current state."""
        self._started_check()
        assert self._load is not None
        with pool().lease(self._load, self._history) as sim:
            return getattr(sim.env, method)(*args)

    # -- what callers see --------------------------------------------------------------------

    def _fields(self) -> dict[str, Any]:
        task = self.task
        return {
            "task_name": task.task_name,
            "task_id": task.task_id,
            "variation": task.variation,
            "task_description": self._task_description,
            "observation": self._observation,
            "score": self._sim_score,
            "moves": self._moves,
        }

    @property
    def task_description(self) -> str:
        return self._task_description

    @property
    def observation_text(self) -> str:
        """The simulator's last answer (AgentGym's ``observation`` field)."""
        return self._observation

    # -- snapshots: the history ---------------------------------------------------------------

    def _game_state(self) -> dict[str, Any]:
        return {
            "history": list(self._history),
            "task_description": self._task_description,
            "observation": self._observation,
            "sim_score": self._sim_score,
            "moves": self._moves,
            "gold": list(self._gold),
        }

    def _restore_game(self, state: dict[str, Any]) -> None:
        history, gold = state.get("history"), state.get("gold")
        for name, value in (("history", history), ("gold", gold)):
            if (
                not isinstance(value, list)
                or len(value) > MAX_HISTORY
                or not all(isinstance(a, str) and len(a) <= 512 for a in value)
            ):
                raise InvalidState(f"invalid sciworld snapshot: {name} must be a list of action strings")
        if not history or history[0] != LOOK:
            raise InvalidState(f"invalid sciworld snapshot: the history must start with {LOOK!r}")
        texts = [state.get("task_description"), state.get("observation")]
        numbers = [state.get("sim_score"), state.get("moves")]
        if not all(isinstance(t, str) for t in texts) or not all(type(n) is int for n in numbers):
            raise InvalidState("invalid sciworld snapshot: task_description, observation, sim_score, moves")
        task = TASKS[self.seed]
        self._load = Load(task.task_name, task.variation, gold=self.config.oracle)
        self._history = list(history)  # type: ignore[arg-type]
        self._gold = list(gold)  # type: ignore[arg-type]
        self._task_description, self._observation = texts  # type: ignore[assignment]
        self._sim_score, self._moves = numbers  # type: ignore[assignment]
