"""`PolicyManager`: the lifecycle of live policies (create, step, snapshot, fork, terminate)."""

from __future__ import annotations

import json
from typing import Any

from envs.base import Policy, PolicyContext, PolicyDecision, StepOptions, StepResult, policy_class
from grpo_service.core.live_objects import LiveObjects
from grpo_service.core.registry import Hold, PolicyHandle, Registry, new_instance_id
from grpo_service.core.snapshots import SnapshotService, decode_json_state
from grpo_service.errors import Unprocessable
from inference import compact_response


def check_plays(policy_name: str, env_name: str, what: str) -> None:
    """Refuse (422) a policy made for another environment: ``what`` names the env in the message."""
    plays = policy_class(policy_name).env_name
    if plays and env_name != plays:
        raise Unprocessable(
            f"policy {policy_name!r} plays {plays!r}; {what} is {env_name!r}", code="env_policy_mismatch"
        )


class PolicyManager(LiveObjects[PolicyHandle]):
    kind = "policy"

    def __init__(self, registry: Registry, snapshots: SnapshotService, context: PolicyContext):
        super().__init__(registry, snapshots, registry.policies)
        self.context = context

    def _register(
        self, policy: Policy, rl_run_id: str, hold: Hold | None = None, **fields: Any
    ) -> PolicyHandle:
        handle = PolicyHandle(
            id=new_instance_id(), rl_run_id=rl_run_id, policy=policy, policy_name=policy.name, **fields
        )
        self.registry.policies.add(handle.id, handle, hold)
        return handle

    async def create(
        self,
        policy_name: str,
        config: dict[str, Any] | None,
        rl_run_id: str,
        bound_env_id: str | None = None,
        parent_policy_id: str | None = None,
        hold: Hold | None = None,
    ) -> PolicyHandle:
        cls = policy_class(policy_name)
        if bound_env_id is not None:
            env = self.registry.envs.get(bound_env_id)
            check_plays(policy_name, env.env_name, f"env {bound_env_id}")
        self.registry.policies.reserve(1, hold)
        policy = cls.create(config, self.context)
        return self._register(
            policy, rl_run_id, hold, bound_env_id=bound_env_id, parent_policy_id=parent_policy_id
        )

    def check_config(self, policy_name: str, config: dict[str, Any] | None) -> None:
        """Raise what creating this policy would raise (`InvalidConfig`: a 422). A plug-in
        acquires nothing until it steps, so the trial instance is simply dropped."""
        policy_class(policy_name).create(config, self.context)

    async def step(
        self, handle: PolicyHandle, observation: dict[str, Any], options: StepOptions
    ) -> PolicyDecision:
        async with handle.lock:
            self._check_open(handle)
            decision = await handle.policy.step(observation, options)
            handle.touch()
        if decision.llm_call is not None:  # ids and logprobs stay in their own fields
            decision.llm_call.response = compact_response(decision.llm_call.response)
        return decision

    @staticmethod
    def observe_outcome(handle: PolicyHandle, result: StepResult) -> None:
        """Tell the policy what its tool calls did (it keeps its history)."""
        handle.policy.observe_outcome(result)

    @staticmethod
    def answer_invalid(handle: PolicyHandle, error: str, detail: str | None) -> str | None:
        """The policy's decision could not be played: its feedback to go on, or None to end."""
        return handle.policy.answer_invalid(error, detail)

    @staticmethod
    def reset(handle: PolicyHandle) -> None:
        """The bound env started a new episode: the policy forgets the last one."""
        handle.policy.reset()

    @staticmethod
    def public_config(handle: PolicyHandle) -> dict[str, Any]:
        """The policy's config as traces show it: never a key."""
        state = handle.policy.get_state()
        config = state.get("config") if isinstance(state, dict) else None
        return {k: v for k, v in (config or {}).items() if "key" not in k.lower()}

    async def _close(self, handle: PolicyHandle) -> None:
        await handle.policy.aclose()

    def _state_payload(self, handle: PolicyHandle) -> bytes:
        state = handle.policy.get_state()
        return json.dumps(
            {"policy_name": handle.policy_name, "bound_env_id": handle.bound_env_id, "state": state},
            separators=(",", ":"),
        ).encode()

    async def _saved_state(self, handle: PolicyHandle) -> tuple[str, bytes, dict[str, Any]]:
        meta = {"policy_name": handle.policy_name, "policy_version": handle.policy.version}
        return handle.policy_name, self._state_payload(handle), meta

    def _from_payload(self, payload: bytes, plugin: str) -> Policy:
        doc = decode_json_state(payload)
        cls = policy_class(plugin)
        state = doc.get("state")
        if not isinstance(state, dict):
            raise Unprocessable("policy snapshot has no state object", code="invalid_snapshot")
        return cls.from_state(state, self.context)

    async def restore(
        self, snapshot_id: str, rl_run_id: str | None = None, bound_env_id: str | None = None
    ) -> PolicyHandle:
        self.registry.policies.reserve()
        if bound_env_id is not None:
            self.registry.envs.get(bound_env_id)
        meta, payload = await self.snapshots.load("policy", snapshot_id, rl_run_id)
        policy = self._from_payload(payload, meta["plugin"])
        return self._register(
            policy,
            meta["rl_run_id"],
            bound_env_id=bound_env_id,
            parent_policy_id=meta.get("source_id"),
            parent_snapshot_id=snapshot_id,
        )

    async def fork(
        self, handle: PolicyHandle, bound_env_ids: list[str | None], parent_snapshot_id: str | None
    ) -> list[PolicyHandle]:
        """One copy of ``handle`` per entry of ``bound_env_ids``: all of them, or none."""
        self.registry.policies.reserve(len(bound_env_ids))
        payload = await self.state_of(handle)
        return await self.copies(handle, [payload] * len(bound_env_ids), bound_env_ids, parent_snapshot_id)

    async def state_of(self, handle: PolicyHandle) -> bytes:
        """The policy's state as it is now, to copy later with `copies`."""
        async with handle.lock:
            self._check_open(handle)
            return self._state_payload(handle)

    @staticmethod
    def with_seed(payload: bytes, offset: int) -> bytes:
        """``payload`` with its config's sampling ``seed`` moved by ``offset`` (unchanged when the
        policy has no seed): copies of one state that must sample differently."""
        doc = json.loads(payload)
        config = (doc.get("state") or {}).get("config")
        if not offset or not isinstance(config, dict) or not isinstance(config.get("seed"), int):
            return payload
        config["seed"] += offset
        return json.dumps(doc, separators=(",", ":")).encode()

    async def copies(
        self,
        parent: PolicyHandle,
        payloads: list[bytes],
        bound_env_ids: list[str | None],
        parent_snapshot_id: str | None = None,
        hold: Hold | None = None,
    ) -> list[PolicyHandle]:
        """One policy per payload (`state_of` ``parent``, now or earlier), bound to the env of the
        same index: all of them, or none."""
        self.registry.policies.reserve(len(bound_env_ids), hold)
        copies = [self._from_payload(payload, parent.policy_name) for payload in payloads]
        kids: list[PolicyHandle] = []
        try:
            for policy, env_id in zip(copies, bound_env_ids, strict=True):
                kids.append(
                    self._register(
                        policy,
                        parent.rl_run_id,
                        hold,
                        bound_env_id=env_id,
                        parent_policy_id=parent.id,
                        parent_snapshot_id=parent_snapshot_id,
                    )
                )
        except BaseException:  # the table filled up meanwhile: undo the copies made
            for kid in kids:
                await self.discard(kid)
            raise
        return kids
