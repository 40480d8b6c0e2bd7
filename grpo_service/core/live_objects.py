"""What the env and policy managers share: a live object's lookup, the check that it was not
terminated meanwhile, its snapshot, and its termination (at most once; again answers False)."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from grpo_service.core.registry import PluginHandle, Registry, SnapshotMeta, Table
from grpo_service.core.snapshots import SnapshotService
from grpo_service.errors import NotFound

H = TypeVar("H", bound=PluginHandle)


class LiveObjects(Generic[H]):
    kind: ClassVar[str]  # "env" or "policy": names the object in errors and their codes

    def __init__(self, registry: Registry, snapshots: SnapshotService, table: Table[H]) -> None:
        self.registry = registry
        self.snapshots = snapshots
        self.table = table

    def get(self, object_id: str) -> H:
        return self.table.get(object_id)

    def _check_open(self, handle: H) -> None:
        if handle.closed:
            raise NotFound(f"{self.kind} {handle.id} was terminated", code=f"{self.kind}_not_found")

    async def snapshot(self, object_id: str, rl_run_id: str | None = None) -> SnapshotMeta:
        """Save the object's state; filed under ``rl_run_id`` (default: its owner's)."""
        handle = self.get(object_id)
        async with handle.lock:
            self._check_open(handle)
            plugin_name, payload, plugin_meta = await self._saved_state(handle)
        return await self.snapshots.save(
            kind=self.kind,
            rl_run_id=rl_run_id or handle.rl_run_id,
            source_id=handle.id,
            plugin_name=plugin_name,
            payload=payload,
            plugin_meta=plugin_meta,
            parent_snapshot_id=handle.parent_snapshot_id,
        )

    async def _saved_state(self, handle: H) -> tuple[str, bytes, dict[str, Any]]:
        """Its plug-in's name, its state and the plug-in's metadata (called under its lock)."""
        raise NotImplementedError

    async def terminate(self, object_id: str) -> bool:
        """Idempotent: terminating an unknown or already-terminated object returns False."""
        handle = self.table.pop(object_id)
        if handle is None:
            return False
        await self.discard(handle)
        return True

    async def discard(self, handle: H) -> None:
        self.table.pop(handle.id)
        if not handle.closed:
            handle.closed = True
            await self._close(handle)

    async def _close(self, handle: H) -> None:
        raise NotImplementedError
