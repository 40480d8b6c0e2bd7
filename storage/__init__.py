"""Snapshot stores: where signed snapshot tarballs live (a local directory, or a Modal Volume)."""

from storage.base import (
    SnapshotCorrupt,
    SnapshotError,
    SnapshotNotFound,
    SnapshotStore,
    snapshot_relpath,
    validate_run_id,
    validate_snapshot_id,
)
from storage.codec import SnapshotCodec
from storage.local import LocalSnapshotStore

__all__ = [
    "LocalSnapshotStore",
    "SnapshotCodec",
    "SnapshotCorrupt",
    "SnapshotError",
    "SnapshotNotFound",
    "SnapshotStore",
    "snapshot_relpath",
    "validate_run_id",
    "validate_snapshot_id",
]
