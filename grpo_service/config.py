"""Service settings: one place, read from the environment and an optional `.env` file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inference.openai_client import normalize_base_url


class Settings(BaseSettings):
    """Every knob of the task app. Field names map to upper-case environment variables; all of
    them, and the variables read elsewhere, are listed in docs/configuration.md."""

    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", hide_input_in_errors=True
    )

    service_base_url: str = "http://localhost:8000"
    vllm_base_url: str = "http://localhost:8001"
    default_model: str | None = None
    environment_api_key: SecretStr | None = Field(
        default=None, description="When set, every route but /health requires it."
    )
    inference_api_key: SecretStr | None = Field(
        default=None,
        description="API key sent to VLLM_BASE_URL (and INFERENCE_KEY_URLS), never to a URL a "
        "caller names in a policy config: such a caller brings its own key (config.api_key).",
    )
    inference_key_urls: list[str] = Field(
        default_factory=list,
        description="More inference endpoints that may receive INFERENCE_API_KEY (JSON list).",
    )
    inference_max_response_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Larger inference replies are refused as they stream."
    )
    snapshot_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key that signs snapshots. Unset: a key is created once under STATE_DIR.",
    )
    state_dir: Path = Path("./data/state")

    host: str = "127.0.0.1"
    port: int = 8000
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description="Web origins allowed to call the API from a browser (JSON list; none by "
        "default: a page on another site must not drive a keyless loopback server).",
    )
    allow_insecure: bool = Field(
        default=False, description="Allow serving on a non-loopback address with no API key."
    )

    max_envs: int = Field(default=10_000, ge=1)
    max_policies: int = Field(default=10_000, ge=1)
    max_active_runs: int = Field(default=1_024, ge=1)
    max_finished_runs: int = Field(default=2_000, ge=1, description="Finished runs kept for /run/status.")
    max_finished_result_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="Bytes of finished background results (their JSON) kept for /run/status; beyond "
        "it the oldest results are dropped (their runs stay listed, with `result_evicted`).",
    )
    max_request_turns: int = Field(
        default=10_000,
        ge=1,
        description="Turns (decisions) one rollout request may play over all its members: a group's "
        "G x max_turns (a fork tree's continuations included), a batch's ids x max_round. Its result "
        "holds every turn in memory until it is answered; 422 beyond.",
    )
    idle_ttl_s: float = Field(default=1_800.0, gt=0, description="Idle envs/policies expire after this.")
    reaper_interval_s: float = Field(default=30.0, gt=0)
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="A request's headers must arrive within this (408 and a close)."
    )
    max_group_size: int = Field(default=256, ge=1)
    env_threads: int = Field(default=8, ge=1, description="Worker threads for CPU-bound env calls.")

    ray_address: str | None = Field(
        default=None,
        description="Serve through a Ray cluster: a cluster address (host:port) to join, `auto` "
        "(join the running one, else start a local one) or `local` (start a private local "
        "cluster). Unset: one embedded process, and Ray is never imported.",
    )
    ray_hosts: int = Field(
        default=0,
        ge=0,
        description="Ray hosts (actors holding live envs, policies and runs); 0: one per "
        "RAY_HOST_CPUS of the cluster. Hosts already running in the namespace count.",
    )
    ray_host_cpus: float = Field(default=1.0, ge=0, description="CPUs Ray reserves for each host.")
    ray_namespace: str = Field(
        default="grpo-service",
        min_length=1,
        max_length=64,
        description="Ray namespace of the hosts: fronts in one namespace serve the same hosts.",
    )
    ray_keep_hosts: bool = Field(
        default=False,
        description="Hosts outlive the front that started them (detached actors), for several "
        "fronts on one cluster; by default they end with it.",
    )
    ray_step_link: bool = Field(
        default=True,
        description="Send batches of steps to a host over a kept-open connection of its own (its "
        "step link) rather than as Ray actor calls; off, or when a host cannot be reached that "
        "way, every batch is an actor call.",
    )
    ray_start_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait for Ray and the hosts at startup."
    )
    host_timeout_s: float = Field(
        default=86_460.0,
        gt=0,
        description="Longest wait for a Ray host's answer: the longest rollout a request may ask "
        "for (safety.max_time_s <= 86,400 s) plus a minute. The host's own deadlines end it sooner.",
    )

    inference_timeout_s: float = Field(default=120.0, gt=0)
    inference_transport: Literal["lean", "sdk"] = Field(
        default="lean",
        description="How policies reach the inference server: 'lean' (aiohttp directly, the least "
        "CPU per decision) or 'sdk' (through the openai package, for a provider that needs its "
        "behaviour). Same requests, retries and errors.",
    )
    inference_max_retries: int = Field(default=3, ge=0, le=10)

    trace_db: Path | None = Field(default=None, description="SQLite file that every rollout is traced to.")
    trace_queue_size: int = Field(
        default=1_000,
        ge=1,
        description="Finished rollouts waiting for the trace writer; beyond it they are dropped and counted.",
    )

    training_enabled: bool = Field(
        default=True,
        description="Serve the training job API: /train, /training/*, /inference, /models.",
    )
    training_max_jobs: int = Field(default=2, ge=1, description="Training jobs running at once; 429 beyond.")
    training_max_wall_time_s: float = Field(
        default=3_600.0, gt=0, description="Longest a training job may run; it stops (saving) at this limit."
    )
    training_max_finished_jobs: int = Field(default=1_000, ge=1, description="Finished jobs remembered.")
    training_threads_per_job: int = Field(default=1, ge=1, le=64, description="torch threads of each job.")
    training_plugins: list[str] = Field(
        default_factory=list,
        description="Modules imported by the service and by every job process before training: "
        "they register your reward functions (training.gym.rewards.register_reward) or job types.",
    )
    training_max_loaded_models: int = Field(default=64, ge=1, description="Policies cached in memory.")

    @field_validator("vllm_base_url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        normalize_base_url(url)  # a clear error at startup, not a 500 at the first LLM call
        return url

    @field_validator("inference_key_urls")
    @classmethod
    def _check_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            normalize_base_url(url)
        return urls

    def as_environment(self) -> dict[str, str]:
        """The settings as environment variables, for a child process that rebuilds them
        (uvicorn's reloader)."""
        out: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, dict | list):
                value = json.dumps(value)
            out[name.upper()] = str(value)
        return out
