"""The configs of the LLM training jobs (``sft`` and ``rl``). Importing this module does not
import torch: the service validates job configs in its own process."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
"""A directory name without directories (the job API's model names)."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model_name: str | None = Field(
        default=None,
        pattern=MODEL_NAME_PATTERN,
        description="Job API: the run is written to models/<model_name>/ (generated when absent).",
    )
    overwrite: bool = Field(default=False, description="Job API: replace a run of the same name.")
    model: str = Field(
        description="The start checkpoint: a local directory (init-model output or a real one). "
        "Job API: a directory inside the service's models directory (STATE_DIR/models), named "
        "relative to it, e.g. `tiny-lm` or `my_sft/final`."
    )
    out: str | None = Field(
        default=None,
        description="The run directory (metrics.jsonl, curves.png, checkpoints/, final/). "
        "Default: the job's models directory / model name.",
    )
    seed: int = Field(default=0, description="Seed of the data order, sampling and initialisation.")
    threads: int = Field(default=1, ge=1, le=256, description="torch threads (1 is fastest on a busy CPU).")
    save_every: int = Field(default=50, ge=1, description="Checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(default=2, ge=1, description="Checkpoints kept on disk (the newest).")
    grad_clip: float = Field(default=1.0, gt=0, description="Gradient norm clipping.")


class SFTConfig(_Config):
    """Supervised fine-tuning on chat JSONL (``export-sft`` output), loss on assistant tokens."""

    type: Literal["sft"] = Field(default="sft", description="Job type: `sft`.")
    dataset: str | None = Field(
        default=None,
        description="Chat JSONL (the --dataset flag sets it). Job API: required, a file inside the "
        "service's data directory (STATE_DIR/datasets), named relative to it.",
    )
    epochs: int = Field(default=1, ge=1, le=10_000, description="Passes over the dataset.")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many steps.")
    batch_size: int = Field(default=4, ge=1, le=4096, description="Examples per optimizer step.")
    lr: float = Field(default=5e-4, gt=0, le=1, description="AdamW learning rate (cosine schedule).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps of the learning rate.")
    max_length: int = Field(default=4096, ge=8, description="Longer examples are skipped (counted).")


class RLConfig(_Config):
    """GRPO against the task app, sampling from a model server (``serve-model``, or vLLM)."""

    type: Literal["rl"] = Field(default="rl", description="Job type: `rl`.")
    task_app_url: str = Field(
        default="http://127.0.0.1:8000", description="The task app (grpo-service serve)."
    )
    task_app_api_key: str | None = Field(default=None, description="Default: ENVIRONMENT_API_KEY.")
    model_server_url: str = Field(
        default="http://127.0.0.1:8001",
        description="serve-model serving `model`: the policy's inference URL.",
    )
    env_name: str = Field(default="crafter", description="The task app's environment plug-in.")
    env_config: dict[str, Any] = Field(default_factory=dict, description="The environment's config.")
    policy_name: str = Field(default="crafter-react", description="The LLM policy plug-in that plays it.")
    policy_config: dict[str, Any] = Field(
        default_factory=dict, description="inference_url and model are set to the model server's."
    )
    seeds: list[int] = Field(
        default_factory=list, description="Start seeds, cycled; empty: seed_base, seed_base + 1, ..."
    )
    seed_base: int = Field(default=0, ge=0, description="First start seed when `seeds` is empty.")
    steps: int = Field(default=10, ge=1, le=1_000_000, description="GRPO steps (one batch of groups each).")
    groups_per_step: int = Field(default=2, ge=1, le=1024, description="B: starts per step.")
    group_size: int = Field(default=4, ge=2, le=256, description="G: rollouts per start.")
    max_turns: int = Field(default=10, ge=1, le=100_000, description="Decisions per rollout at most.")
    rollout_timeout_s: float = Field(
        default=600.0, gt=0, le=86_400, description="Deadline of one group request."
    )
    lr: float = Field(default=1e-5, gt=0, le=1, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    clip_eps: float = Field(default=0.2, gt=0, lt=1, description="PPO-style clip range of the ratio.")
    clip_eps_high: float | None = Field(
        default=None, gt=0, description="DAPO's clip-higher; default clip_eps."
    )
    kl_coef: float = Field(
        default=0.0, ge=0, description="KL (k3) to the start model; 0: no reference model."
    )
    scale_by_std: bool = Field(default=True, description="False: Dr. GRPO's R - mean advantages.")
    advantage: Literal["group", "tree"] = Field(
        default="group",
        description="`group`: one advantage per rollout, relative to its group (GRPO). `tree`: the groups "
        "fork mid-episode (`fork`) and every stretch of turns between two forks gets its own advantage, "
        "from the Monte-Carlo values of the fork states (per-turn credit).",
    )
    fork: dict[str, Any] = Field(
        default_factory=dict,
        description="With advantage `tree`: the /rollout/group fork plan, e.g. "
        '`{"every": 2, "continuations": 2}` or `{"rule": "max_entropy", "count": 2}` (the task app '
        "validates it).",
    )
    turn_budget: int | None = Field(
        default=None,
        ge=1,
        description="Stop after the step in which the decisions sampled (every member's, continuations "
        "included) reach this many: an equal budget for `group` and `tree` runs.",
    )
    sequences: Literal["stream", "decision"] = Field(
        default="stream",
        description="`stream`: a rollout the policy played as token streams is trained as one sequence per "
        "stream (one forward pass over the episode, loss on the sampled tokens); `decision`: one sequence "
        "per decision (prompt + completion). Decisions outside any stream are always trained one by one.",
    )
    aggregation: Literal["token", "sequence"] = Field(
        default="token", description="Loss averaged over all tokens, or per sequence then over sequences."
    )
    updates_per_step: int = Field(default=1, ge=1, le=64, description="Optimizer steps on each batch.")
    micro_batch: int = Field(default=8, ge=1, le=4096, description="Sequences per forward pass.")
    max_staleness: int = Field(
        default=0, ge=0, description="Keep samples drawn from weights at most this many versions old."
    )
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description="`sync`: each step requests its groups, waits for them, trains and pushes. `async`: "
        "the groups come from the task app's stream (/rollout/stream), which keeps `in_flight` groups "
        "playing while the trainer trains; a push does not drain it (needs `max_staleness` >= 1 to "
        "overlap).",
    )
    in_flight: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Async: groups started and not yet trained on (default: 2 x groups_per_step).",
    )
    stale_policy: Literal["drop", "restart"] = Field(
        default="restart",
        description="Async: a group whose oldest span is more than `max_staleness` versions old is "
        "dropped, or played again from its start state (the stream's policy; both counted).",
    )
    success_reward: float = Field(default=1.0, description="A rollout whose reward reaches this succeeded.")
    format_penalty: float = Field(
        default=0.0,
        ge=0,
        description="A rollout loses this times the share of max_turns lost to invalid replies (no "
        "tool call or action line, an invalid action: each answered invalid turn, and the unplayed "
        "turns after one that ended the rollout): a format reward, the signal a model that cannot yet "
        "act needs first.",
    )
    fidelity_tolerance: float = Field(
        default=1e-3, gt=0, description="Warn when server and trainer logprobs differ by more."
    )

    @model_validator(mode="after")
    def _check(self) -> RLConfig:
        if self.advantage == "tree" and not self.fork:
            raise ValueError('advantage "tree" needs a fork plan, e.g. fork = {every = 2, continuations = 2}')
        if self.fork and self.advantage != "tree":
            raise ValueError('fork: only advantage "tree" learns from continuations; set advantage = "tree"')
        if self.policy_config.get("api_key"):
            raise ValueError(
                "policy_config.api_key: use the model server without a key, or set it on the server"
            )
        return self


_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _inside(base: Path, name: str, field: str, kind: str) -> Path:
    """``name`` resolved inside ``base`` (links followed), or ValueError naming ``field``."""
    where = f"the service's {'models' if kind == 'model' else 'data'} directory"
    if len(name) > 512 or not all(_NAME_PART.match(part) for part in name.split("/")):
        raise ValueError(
            f"{field}: {name!r} is not a {kind} name: under the job API it names a {kind} inside {where}, "
            "relative to it (no leading '/', no '..', no hidden parts)"
        )
    root = base.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{field}: {name!r} leads outside {where}")
    if kind == "model" and not (path / "config.json").is_file():
        raise ValueError(f"{field}: no model {name!r} (a directory with a config.json) in {where}")
    if kind == "dataset" and not path.is_file():
        raise ValueError(f"{field}: no dataset {name!r} in {where}")
    return path


def confine_paths(config: _Config, models_dir: Path, data_dir: Path) -> Any:
    """Under the job API (`training.jobs.JobType.confine`): ``model`` names a checkpoint directory
    inside the service's models directory and an sft job's ``dataset`` a file inside its data
    directory, both relative to it; the config comes back with them resolved. A job never reads
    an arbitrary server path (``/etc/passwd`` as a dataset). ValueError naming the field."""
    update: dict[str, Any] = {"model": str(_inside(models_dir, config.model, "model", "model"))}
    if isinstance(config, SFTConfig):
        if not config.dataset:
            raise ValueError("dataset: required (a chat JSONL file inside the service's data directory)")
        update["dataset"] = str(_inside(data_dir, config.dataset, "dataset", "dataset"))
    return config.model_copy(update=update)
