"""The training job API: ``GET /``, ``POST /train``, ``/training/*``, ``POST /inference``,
``/models``. Jobs run in their own processes (`training.jobs.JobRunner`); models are zip files
under the state directory's ``models/`` (`training.model_store.ModelStore`)."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Annotated

import numpy as np
from fastapi import Body, Depends, Path

from grpo_service.api.routes import service_router
from grpo_service.api.routes.meta import ENDPOINTS
from grpo_service.api.services import ServicesDep
from grpo_service.errors import (
    CapacityExceeded,
    Conflict,
    NotFound,
    ServiceError,
    Unprocessable,
    error_responses,
)
from grpo_service.models.training import (
    DeleteModelResponse,
    InferenceRequest,
    InferenceResponse,
    JobListResponse,
    JobStatusResponse,
    JobSummary,
    ModelInfo,
    ModelListResponse,
    RootResponse,
    StopResponse,
    TrainResponse,
    train_request_type,
)
from grpo_service.training_api.service import TrainingService
from grpo_service.version import __version__
from training.gym.policy import InvalidPolicyFile
from training.jobs import TERMINAL, Job, JobConfigRefused, JobLimitReached, ModelNameTaken, get_job_type
from training.model_store import InvalidModelName, ModelNotFound

router = service_router("training")

TRAINING_ENDPOINTS = {
    "train": "POST /train",
    "training_status": "GET /training/{job_id}/status",
    "training_jobs": "GET /training/jobs",
    "training_stop": "POST /training/{job_id}/stop",
    "inference": "POST /inference",
    "models": "GET /models",
    "delete_model": "DELETE /models/{model_name}",
    "health": "GET /health",
}
TrainRequest = train_request_type()
TRAIN_EXAMPLES = {
    "gymnasium": {
        "summary": "GRPO on CartPole-v1 (the gymnasium job)",
        "value": {
            "env_name": "CartPole-v1",
            "total_timesteps": 10000,
            "learning_rate": 0.0003,
            "n_steps": 32,
            "batch_size": 64,
            "n_epochs": 10,
            "reward_function_type": "optimized_cartpole",
            "model_name": "my_model",
        },
    },
    "sft": {
        "summary": "SFT of a causal LM on export-sft data (names in STATE_DIR/models and /datasets)",
        "value": {
            "type": "sft",
            "model": "tiny-lm",
            "dataset": "crafter_sft.jsonl",
            "model_name": "my_sft",
        },
    },
    "rl": {
        "summary": "GRPO of a causal LM against this task app, sampling from serve-model",
        "value": {
            "type": "rl",
            "model": "tiny-lm",
            "model_server_url": "http://127.0.0.1:8001",
            "model_name": "my_rl",
        },
    },
}
JobId = Annotated[str, Path(max_length=64, description="A job id from POST /train.")]
ModelNamePath = Annotated[str, Path(max_length=128, description="A saved model's name.")]


class TrainingUnavailable(ServiceError, status=503, code="training_unavailable"):
    """Training needs the ``train`` extra, which is not installed here."""


def _training(services: ServicesDep) -> TrainingService:
    return services.training


TrainingDep = Annotated[TrainingService, Depends(_training)]


def _job(training: TrainingService, job_id: str) -> Job:
    try:
        return training.runner.get(job_id)
    except KeyError as exc:
        raise NotFound(exc.args[0], code="job_not_found") from None


def _status(job: Job) -> JobStatusResponse:
    return JobStatusResponse.model_validate(job.record())


@router.get("/", response_model=RootResponse)
async def root() -> RootResponse:
    """The service's name, version and endpoint map."""
    return RootResponse(
        message="grpo-service", version=__version__, endpoints={**ENDPOINTS, **TRAINING_ENDPOINTS}
    )


@router.post(
    "/train",
    response_model=TrainResponse,
    status_code=200,
    responses=error_responses(400, 409, 413, 422, 429, 503),
)
async def train(
    config: Annotated[TrainRequest, Body(openapi_examples=TRAIN_EXAMPLES)], training: TrainingDep
) -> TrainResponse:
    """Start a training job in its own process. Every field is optional (the gymnasium job's defaults);
    ``type`` picks the job type (``gymnasium``: GRPO of an MLP policy on a gymnasium env)."""
    if importlib.util.find_spec("torch") is None:
        raise TrainingUnavailable(
            "training needs torch: install the train extra (pip install 'grpo-service[train]')"
        )
    job_type = get_job_type(config.type)
    try:
        job = await asyncio.to_thread(training.runner.submit, job_type, config)
    except JobLimitReached as exc:
        raise CapacityExceeded(str(exc), code="too_many_jobs", headers={"Retry-After": "5"}) from None
    except ModelNameTaken as exc:
        raise Conflict(str(exc), code="model_exists") from None
    except JobConfigRefused as exc:
        raise Unprocessable(str(exc), code="invalid_job_config") from None
    return TrainResponse(
        job_id=job.job_id,
        message="Training started",
        config=job.config,
        status_url=f"/training/{job.job_id}/status",
    )


@router.get("/training/jobs", response_model=JobListResponse)
async def list_jobs(training: TrainingDep) -> JobListResponse:
    """Every remembered job (running and finished), oldest first."""
    return JobListResponse(jobs=[JobSummary.model_validate(j.record()) for j in training.runner.list()])


@router.get(
    "/training/{job_id}/status", response_model=JobStatusResponse, responses=error_responses(404, 421, 422)
)
async def job_status(job_id: JobId, training: TrainingDep) -> JobStatusResponse:
    """Status, progress and the live metrics of the job's last update."""
    return _status(_job(training, job_id))


@router.post(
    "/training/{job_id}/stop", response_model=StopResponse, responses=error_responses(404, 409, 421, 422)
)
async def stop_job(job_id: JobId, training: TrainingDep) -> StopResponse:
    """Stop a job within a second; the model keeps its last checkpoint. Stopping a stopped job is
    a no-op; stopping a completed or failed one is a 409."""
    job = _job(training, job_id)
    if job.status in TERMINAL and job.status != "stopped":
        raise Conflict(f"job {job_id} already ended: {job.status}", code="job_finished")
    job = await asyncio.to_thread(training.runner.stop, job_id)
    return StopResponse(message="Training job stopped", job_id=job_id, status=job.status)


@router.post("/inference", response_model=InferenceResponse, responses=error_responses(400, 404, 413, 422))
async def inference(req: InferenceRequest, training: TrainingDep) -> InferenceResponse:
    """The action a saved model takes for one observation, with every action's probability (a
    model being trained answers with its latest checkpoint)."""
    try:
        policy = training.models.get(req.model_name)
        obs = policy.check_observation(np.asarray(req.observation, dtype=np.float64))
    except ModelNotFound as exc:
        raise NotFound(exc.args[0], code="model_not_found") from None
    except InvalidPolicyFile as exc:
        raise Unprocessable(str(exc), code="invalid_model_file") from None
    except ValueError as exc:
        raise Unprocessable(str(exc), code="invalid_observation") from None
    probs = policy.probs(obs[None])[0].astype(np.float64)
    probs /= probs.sum()
    if req.deterministic:
        action = int(np.argmax(probs))
    else:
        action = int(np.random.default_rng().choice(len(probs), p=probs))
    value = policy.value(obs[None])
    return InferenceResponse(
        action=action, action_probs=probs.tolist(), value=None if value is None else float(value[0])
    )


@router.get("/models", response_model=ModelListResponse)
async def list_models(training: TrainingDep) -> ModelListResponse:
    """Saved models: ``loaded`` when cached in memory, ``saved`` when only on disk."""
    store = training.models
    return ModelListResponse(
        models=[
            ModelInfo(name=name, status=store.status(name), training=training.runner.model_in_use(name))
            for name in store.names()
        ]
    )


@router.delete(
    "/models/{model_name}", response_model=DeleteModelResponse, responses=error_responses(404, 409, 422)
)
async def delete_model(model_name: ModelNamePath, training: TrainingDep) -> DeleteModelResponse:
    """Delete a model from memory and disk (with its metrics and curves)."""
    try:
        training.models.path(model_name)
        if training.runner.model_in_use(model_name):
            raise Conflict(f"model {model_name!r} is being trained; stop the job first", code="model_in_use")
        training.models.delete(model_name)
    except InvalidModelName as exc:
        raise Unprocessable(str(exc), code="invalid_model_name") from None
    except ModelNotFound as exc:
        raise NotFound(exc.args[0], code="model_not_found") from None
    return DeleteModelResponse(message=f"Model {model_name} deleted", name=model_name)
