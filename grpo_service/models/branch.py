"""``/branch``: copies of a live env and its policy from one snapshot."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from grpo_service.models.common import ENV_ID, Id, Request, RunId, request_config


class BranchRequest(Request):
    """Fork live envs and policies into exact copies."""

    model_config = request_config({"env_ids": [ENV_ID], "num_children": 2})

    env_ids: list[Id] = Field(default_factory=list, max_length=64, description="Envs to fork.")
    policy_ids: list[Id] = Field(default_factory=list, max_length=64, description="Policies to fork.")
    num_children: int = Field(default=1, ge=1, le=256, description="Copies of each.")
    max_branches: int = Field(default=256, ge=1, le=4096, description="Cap on children in total.")
    rl_run_id: RunId | None = Field(
        default=None, description="Owner of the children (default: the parent's)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> BranchRequest:
        if not self.env_ids and not self.policy_ids:
            raise ValueError("give at least one of 'env_ids' or 'policy_ids'")
        total = (len(self.env_ids) + len(self.policy_ids)) * self.num_children
        if total > self.max_branches:
            raise ValueError(f"{total} children requested, more than max_branches={self.max_branches}")
        return self


class BranchChild(BaseModel):
    id: str = Field(description="The child's env or policy id.")
    parent_id: str = Field(description="The env or policy it copies.")
    parent_snapshot_id: str = Field(description="The snapshot it was made from.")
    child_index: int = Field(description="Index among the parent's children.")
    bound_env_id: str | None = Field(default=None, description="A policy child's env.")


class BranchResponse(BaseModel):
    env_branches: dict[str, list[str]] = Field(description="Parent env id → child env ids.")
    policy_branches: dict[str, list[str]] = Field(description="Parent policy id → child policy ids.")
    children: list[BranchChild] = Field(description="Every child with its lineage.")
