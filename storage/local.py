"""A `SnapshotStore` on a local directory (the default; also the base of the Modal Volume store)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from storage.base import (
    SnapshotNotFound,
    snapshot_relpath,
    validate_kind,
    validate_snapshot_id,
)


class LocalSnapshotStore:
    """Snapshots as files under ``root``, written to a temp name, fsynced, then renamed."""

    def __init__(self, root: str | Path, *, max_blob_bytes: int = 64 * 1024 * 1024):
        self.root = Path(root).resolve()
        self.max_blob_bytes = max_blob_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, rl_run_id: str, kind: str, snapshot_id: str) -> Path:
        path = (self.root / snapshot_relpath(rl_run_id, kind, snapshot_id)).resolve()
        if not path.is_relative_to(self.root):  # belt and braces: ids are already validated
            raise SnapshotNotFound("snapshot path escapes the store root")
        return path

    def put(self, rl_run_id: str, kind: str, snapshot_id: str, blob: bytes) -> str:
        path = self.path_for(rl_run_id, kind, snapshot_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{snapshot_id}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return str(path)

    def get(self, rl_run_id: str, kind: str, snapshot_id: str) -> bytes:
        path = self.path_for(rl_run_id, kind, snapshot_id)
        try:
            if path.is_symlink() or not path.is_file():
                raise FileNotFoundError
            if path.stat().st_size > self.max_blob_bytes:
                raise SnapshotNotFound(f"snapshot {snapshot_id} is larger than {self.max_blob_bytes} bytes")
            return path.read_bytes()
        except FileNotFoundError:
            raise SnapshotNotFound(f"no {kind} snapshot {snapshot_id} in run {rl_run_id!r}") from None

    def locate(self, kind: str, snapshot_id: str) -> str | None:
        validate_kind(kind)
        validate_snapshot_id(snapshot_id)
        runs = self.root / "runs"
        if not runs.is_dir():
            return None
        for match in runs.glob(f"*/{kind}/{snapshot_id[:2]}/{snapshot_id}.tar.gz"):
            return match.parent.parent.parent.name
        return None

    def delete(self, rl_run_id: str, kind: str, snapshot_id: str) -> bool:
        try:
            self.path_for(rl_run_id, kind, snapshot_id).unlink()
            return True
        except FileNotFoundError:
            return False

    def describe(self) -> str:
        return f"local:{self.root}"
