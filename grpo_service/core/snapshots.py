"""Saving and loading env/policy state as signed snapshots in a `SnapshotStore`.

The snapshot id returned to the caller is the one stored, the one registered and the one in
the signed metadata (the reference implementation returned one id and stored another). A
snapshot names its kind and run inside the signed metadata, so a valid snapshot copied over
another's path, or into another run, is refused.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import anyio

from envs.errors import InvalidState
from grpo_service.config import Settings
from grpo_service.core.registry import Registry, SnapshotMeta, new_id
from grpo_service.errors import NotFound, Unprocessable
from storage import (
    SnapshotCodec,
    SnapshotCorrupt,
    SnapshotNotFound,
    SnapshotStore,
    validate_run_id,
    validate_snapshot_id,
)

SERVICE_SNAPSHOT_VERSION = 1


def load_signing_key(settings: Settings) -> bytes:
    """The HMAC key: SNAPSHOT_SECRET if set, else a random key created once under STATE_DIR."""
    if settings.snapshot_secret is not None:
        return settings.snapshot_secret.get_secret_value().encode()
    path = Path(settings.state_dir) / ".snapshot_key"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        # Another process may be writing it right now: wait briefly for the full key.
        for _ in range(50):
            key = path.read_bytes().strip()
            if len(key) >= 32:
                return key
            time.sleep(0.01)
        raise RuntimeError(f"snapshot key file {path} is empty or too short") from None
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_hex(32).encode())
    return path.read_bytes().strip()


class SnapshotService:
    """Signs, stores, registers and verifies snapshots."""

    def __init__(self, store: SnapshotStore, codec: SnapshotCodec, registry: Registry):
        self.store = store
        self.codec = codec
        self.registry = registry

    async def save(
        self,
        *,
        kind: str,
        rl_run_id: str,
        source_id: str,
        plugin_name: str,
        payload: bytes,
        plugin_meta: dict[str, Any],
        parent_snapshot_id: str | None = None,
    ) -> SnapshotMeta:
        try:
            validate_run_id(rl_run_id)
        except ValueError as exc:
            raise Unprocessable(str(exc), code="invalid_rl_run_id") from None
        snapshot_id = new_id()
        created_at = time.time()
        meta = {
            "snapshot_id": snapshot_id,
            "kind": kind,
            "rl_run_id": rl_run_id,
            "plugin": plugin_name,
            "plugin_meta": plugin_meta,
            "source_id": source_id,
            "parent_snapshot_id": parent_snapshot_id,
            "created_at": created_at,
            "service_snapshot_version": SERVICE_SNAPSHOT_VERSION,
        }
        blob = self.codec.pack(meta, payload)
        path = await anyio.to_thread.run_sync(self.store.put, rl_run_id, kind, snapshot_id, blob)
        record = SnapshotMeta(
            snapshot_id=snapshot_id,
            kind=kind,  # type: ignore[arg-type]
            rl_run_id=rl_run_id,
            path=path,
            size=len(blob),
            created_at=created_at,
            source_id=source_id,
            parent_snapshot_id=parent_snapshot_id,
        )
        self.registry.snapshots.put_evicting(snapshot_id, record)
        return record

    async def discard(self, meta: SnapshotMeta) -> None:
        """Delete a snapshot this service wrote and forget it (undoing a step that failed later)."""
        self.registry.snapshots.pop(meta.snapshot_id)
        await anyio.to_thread.run_sync(self.store.delete, meta.rl_run_id, meta.kind, meta.snapshot_id)

    async def load(
        self, kind: str, snapshot_id: str, rl_run_id: str | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """Return ``(signed meta, payload)``: 404 if unknown, 422 if untrustworthy."""
        try:
            validate_snapshot_id(snapshot_id)
            known = self.registry.snapshots.find(snapshot_id)
            run = rl_run_id or (known.rl_run_id if known else None)
            if run is None:
                run = await anyio.to_thread.run_sync(self.store.locate, kind, snapshot_id)
            if run is None:
                raise SnapshotNotFound(f"unknown {kind} snapshot {snapshot_id!r}")
            validate_run_id(run)
            blob = await anyio.to_thread.run_sync(self.store.get, run, kind, snapshot_id)
            meta, payload = self.codec.unpack(blob)
        except SnapshotNotFound as exc:
            raise NotFound(str(exc), code="snapshot_not_found") from None
        except ValueError as exc:
            raise NotFound(str(exc), code="snapshot_not_found") from None
        except SnapshotCorrupt as exc:
            raise Unprocessable(f"snapshot {snapshot_id} refused: {exc}", code="invalid_snapshot") from None
        if meta.get("snapshot_id") != snapshot_id or meta.get("kind") != kind or meta.get("rl_run_id") != run:
            raise Unprocessable(
                f"snapshot {snapshot_id} refused: its signed metadata names another snapshot, kind or run",
                code="invalid_snapshot",
            )
        return meta, payload


def decode_json_state(payload: bytes) -> dict[str, Any]:
    try:
        state = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidState("policy state is not valid JSON") from None
    if not isinstance(state, dict):
        raise InvalidState("policy state must be a JSON object")
    return state
