"""The training job types `POST /train` and `grpo-service train` accept, by ``type``.

One line per type. A config model must import without torch (the service validates it); the
trainer (``"module:function"``, called as ``fn(config, ctx: TrainContext) -> dict``) is imported
only in the job's own process.
"""

from __future__ import annotations

from training.gym.config import GymTrainConfig, write_initial_model
from training.jobs import JobType, register_job_type

register_job_type(
    JobType(
        "gymnasium",
        GymTrainConfig,
        "training.gym.trainer:train_gym",
        "Episode-level GRPO of an MLP policy on a gymnasium environment.",
        prepare=write_initial_model,
    )
)
