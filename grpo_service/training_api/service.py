"""The service's side of training jobs: one job runner and one model store per app, from settings."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import grpo_service.training_api.llm_jobs  # noqa: F401  (registers the sft and rl job types)
import training.job_types  # noqa: F401  (registers the job types)
from grpo_service.config import Settings
from grpo_service.core.registry import new_instance_id
from training.jobs import JobRunner
from training.model_store import ModelStore


@dataclass
class TrainingService:
    runner: JobRunner
    models: ModelStore

    @classmethod
    def from_settings(cls, settings: Settings) -> TrainingService:
        for module in settings.training_plugins:
            importlib.import_module(module)
        models = ModelStore(settings.state_dir / "models", max_loaded=settings.training_max_loaded_models)
        runner = JobRunner(
            models.models_dir,
            jobs_dir=settings.state_dir / "jobs",
            max_active=settings.training_max_jobs,
            max_wall_time_s=settings.training_max_wall_time_s,
            max_finished=settings.training_max_finished_jobs,
            threads_per_job=settings.training_threads_per_job,
            data_dir=settings.state_dir / "datasets",
            model_exists=models.exists,
            plugins=tuple(settings.training_plugins),
            new_job_id=new_instance_id,  # tagged like every live object's id
        )
        return cls(runner, models)

    def close(self) -> None:
        self.runner.close()
