"""Request and response models of the training job API (the gymnasium job's fields, and the LLM jobs')."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Discriminator, Field, Tag

from grpo_service.models.common import request_config
from training.gym.config import MODEL_NAME_PATTERN
from training.jobs import JOB_TYPES

DEFAULT_JOB_TYPE = "gymnasium"
ModelName = Annotated[
    str,
    Field(
        pattern=MODEL_NAME_PATTERN,
        description="A saved model's name (models/<name>.zip): letters, digits, '_', '-', '.'; no path.",
        examples=["my_model"],
    ),
]
JobStatusName = Literal["pending", "running", "completed", "failed", "stopped"]


def _job_type_of(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("type", DEFAULT_JOB_TYPE)
    return getattr(value, "type", None)


def train_request_type() -> Any:
    """The body of ``POST /train``: one config model per registered job type, chosen by ``type``
    (``"gymnasium"`` when absent, so a gymnasium job's body needs no type)."""
    models = [(name, jt.config_model) for name, jt in sorted(JOB_TYPES.items())]
    if len(models) == 1:
        return models[0][1]
    union = Union[tuple(Annotated[model, Tag(name)] for name, model in models)]  # noqa: UP007
    return Annotated[union, Discriminator(_job_type_of)]


class TrainResponse(BaseModel):
    job_id: str = Field(description="The job's id, for /training/{job_id}/*.", examples=["5f0c2a..."])
    message: str = Field(description="What happened.", examples=["Training started"])
    config: dict[str, Any] = Field(
        description="The resolved configuration: every field with its default, and the model name."
    )
    status_url: str = Field(description="Where to poll the job.", examples=["/training/5f0c2a.../status"])


class JobStatusResponse(BaseModel):
    job_id: str = Field(description="The job's id.")
    job_type: str = Field(description="The job type (`type` of the request).", examples=["gymnasium"])
    status: JobStatusName = Field(
        description="pending (process starting), running, completed, failed (see error_message) or stopped."
    )
    progress: float = Field(ge=0, le=1, description="current_timesteps / total_timesteps.", examples=[0.75])
    current_timesteps: int = Field(description="Environment steps taken so far.", examples=[7500])
    total_timesteps: int = Field(description="The job's budget of environment steps.", examples=[10000])
    start_time: str = Field(description="ISO 8601, UTC.", examples=["2026-11-23T10:00:00+00:00"])
    end_time: str | None = Field(default=None, description="ISO 8601, UTC; null while the job runs.")
    error_message: str | None = Field(default=None, description="Why a failed job failed.")
    end_reason: str | None = Field(
        default=None,
        description="completed (budget spent), target_reached, time_limit, stopped, or error.",
    )
    model_name: str = Field(
        description="Where the job saves: models/<model_name>.zip.", examples=["my_model"]
    )
    metrics: dict[str, Any] = Field(
        default_factory=dict,
        description="Live metrics of the last update: mean_episode_return (environment return, mean of "
        "the last 20 episodes), mean_reward (training reward per episode), loss, clip_fraction, "
        "approx_kl, entropy, updates, timesteps, episodes, steps_per_s, elapsed_s, groups, "
        "degenerate_groups (groups whose episodes all scored the same: no signal).",
        examples=[{"mean_episode_return": 212.4, "loss": -0.012, "updates": 14, "steps_per_s": 8150.0}],
    )


class JobSummary(BaseModel):
    job_id: str = Field(description="The job's id.")
    job_type: str = Field(description="The job type (`type` of the request).")
    status: JobStatusName = Field(description="pending, running, completed, failed or stopped.")
    progress: float = Field(ge=0, le=1, description="Share of the job's budget done.")
    model_name: str = Field(description="The model the job writes.")
    start_time: str = Field(description="ISO 8601, UTC.")
    end_time: str | None = Field(default=None, description="ISO 8601, UTC; null while the job runs.")


class JobListResponse(BaseModel):
    jobs: list[JobSummary] = Field(description="Every remembered job, oldest first.")


class StopResponse(BaseModel):
    message: str = Field(description="What happened.", examples=["Training job stopped"])
    job_id: str = Field(description="The job's id.")
    status: JobStatusName = Field(description="The job's status after the request.")


class InferenceRequest(BaseModel):
    model_config = request_config(
        {"model_name": "my_model", "observation": [0.1, 0.0, 0.05, 0.0], "deterministic": True}, strict=True
    )

    model_name: ModelName
    observation: list[float] = Field(
        max_length=65_536,
        description="One observation (4 numbers for CartPole).",
        examples=[[0.1, 0.0, 0.05, 0.0]],
    )
    deterministic: bool = Field(default=True, description="Most probable action; false samples one.")


class InferenceResponse(BaseModel):
    action: int = Field(description="The chosen action.", examples=[1])
    action_probs: list[float] = Field(
        description="Probability of every action (sums to 1).", examples=[[0.3, 0.7]]
    )
    value: float | None = Field(
        default=None,
        description="Value estimate, when the model was trained with value_head (GRPO needs no critic).",
        examples=[0.85],
    )


class ModelInfo(BaseModel):
    name: str = Field(description="The model's name (its zip under models/).", examples=["my_model"])
    status: Literal["loaded", "saved"] = Field(description="loaded: cached in memory; saved: on disk only.")
    training: bool = Field(default=False, description="A running job is writing it (checkpoints).")


class ModelListResponse(BaseModel):
    models: list[ModelInfo] = Field(description="Every saved model.")


class DeleteModelResponse(BaseModel):
    message: str = Field(description="What happened.", examples=["Model my_model deleted"])
    name: str = Field(description="The deleted model's name.")


class RootResponse(BaseModel):
    message: str = Field(description="The service's name.", examples=["grpo-service"])
    version: str = Field(description="The service's version.")
    endpoints: dict[str, str] = Field(description="What the service offers, route by route.")
