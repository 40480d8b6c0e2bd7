"""``GET /info`` and ``GET /health``: what the service offers and how it is doing."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ServiceEndpoints(BaseModel):
    base_url: str = Field(description="This service's public URL (SERVICE_BASE_URL).")
    version: str = Field(description="grpo-service's version.")
    endpoints: dict[str, str] = Field(description="Route families by name, e.g. `rollout: /rollout`.")


class InferenceInfo(BaseModel):
    base_url: str = Field(description="Default OpenAI-compatible server for LLM policies (VLLM_BASE_URL).")
    endpoints: dict[str, str] = Field(description="The inference routes the policies call.")
    default_model: str | None = Field(description="DEFAULT_MODEL; null: the server's first listed model.")


class PluginInfo(BaseModel):
    name: str = Field(description="The name to pass as `env_name` or `policy_name`.")
    version: str = Field(description="The plug-in's version.")
    description: str = Field(description="What it is.")
    config_schema: dict[str, Any] = Field(description="JSON schema of its `config`.")
    env_name: str | None = Field(default=None, description="A policy's environment (null: any).")
    uses_inference: bool = Field(default=False, description="The policy calls an LLM.")


class Limits(BaseModel):
    max_envs: int = Field(description="Live envs at most (429 beyond).")
    max_policies: int = Field(description="Live policies at most (429 beyond).")
    max_active_runs: int = Field(description="Running rollouts at most, group members included.")
    max_group_size: int = Field(description="Largest `group_size` of /rollout/group.")
    max_request_turns: int = Field(
        description="Most turns one rollout request may play over all its members (422 beyond)."
    )
    idle_ttl_s: float = Field(description="Idle envs and policies are terminated after this many seconds.")
    max_request_bytes: int = Field(description="Larger request bodies get 413.")


class ServiceInfo(BaseModel):
    service: ServiceEndpoints = Field(description="Where the service is and its routes.")
    inference: InferenceInfo = Field(description="The default inference server.")
    environments: list[PluginInfo] = Field(description="Environment plug-ins with their config schemas.")
    policies: list[PluginInfo] = Field(description="Policy plug-ins with their config schemas.")
    limits: Limits = Field(description="Capacity and size limits.")
    auth_required: bool = Field(description="Every route but /health needs X-API-Key.")
    snapshot_store: str = Field(description="Where snapshots are written.")
    tracing: str | None = Field(description="The trace DB every rollout is written to (null: off).")


class Health(BaseModel):
    status: Literal["healthy"] = Field(description="Always `healthy` when the service answers.")
    version: str = Field(description="grpo-service's version.")
    instance: str = Field(
        description="This process's tag: the prefix of the env, policy and run ids it issues "
        "(through Ray, each host's tag prefixes its ids)."
    )
    workers: int = Field(description="Processes holding live objects: 1 embedded, else the live Ray hosts.")
    lost_hosts: list[str] = Field(
        default_factory=list, description="Ray hosts found dead: their envs, policies and runs are gone."
    )
    uptime_s: float = Field(description="Seconds since this process started serving.")
    envs: int = Field(description="Live envs (of every Ray host when served through Ray).")
    policies: int = Field(description="Live policies (of every Ray host).")
    runs_active: int = Field(description="Running rollouts (of every Ray host).")
    capacity: dict[str, int] = Field(description="`max_envs`, `max_policies`, `max_active_runs`.")
    tracing: dict[str, int] | None = Field(
        default=None,
        description="Trace writer counters (written, dropped, failed, queued) when tracing is on.",
    )
    timestamp: str = Field(
        default="", description="Now, ISO 8601 UTC.", examples=["2026-11-23T10:00:00+00:00"]
    )
    active_jobs: int = Field(default=0, description="Training jobs pending or running.")
    loaded_models: int = Field(default=0, description="Trained models cached in memory for /inference.")
