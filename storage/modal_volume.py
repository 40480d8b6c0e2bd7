"""A `SnapshotStore` on a mounted Modal Volume, and copying finished SQLite files onto it.

A Volume is a directory in every container that mounts it, but one container's writes reach
the others only after it ``commit()``s and they ``reload()``. So this store is the local store
plus those two calls: every write is committed at once, and a read that misses reloads and
tries again once (the snapshot may have been written by another container). Snapshot names
are unique (uuid ids), so concurrent writers never touch the same file and the Volume's
last-commit-wins rule cannot lose one.

``reload()`` fails while any file on the Volume is open, so every file operation here holds
one lock, and the Volume must hold no live files: never a live SQLite database (the trace DB
stays on local disk; `export_sqlite` copies a finished one over).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import Protocol

from storage.base import SnapshotNotFound, snapshot_relpath, validate_kind, validate_snapshot_id
from storage.local import LocalSnapshotStore

log = logging.getLogger(__name__)


class VolumeLike(Protocol):
    """The two calls this module needs from a `modal.Volume` (blocking; call from a thread)."""

    def commit(self) -> None: ...

    def reload(self) -> None: ...


class ModalVolumeSnapshotStore(LocalSnapshotStore):
    """Snapshots under ``root``, the mount point of ``volume`` (or a directory under it)."""

    def __init__(
        self,
        root: str | Path,
        volume: VolumeLike,
        *,
        volume_name: str = "",
        max_blob_bytes: int = 64 * 1024 * 1024,
    ):
        super().__init__(root, max_blob_bytes=max_blob_bytes)
        self.volume = volume
        self.volume_name = volume_name
        self._lock = threading.RLock()
        self._reloads = 0  # bumped by every reload: concurrent misses share one

    def put(self, rl_run_id: str, kind: str, snapshot_id: str, blob: bytes) -> str:
        with self._lock:
            path = super().put(rl_run_id, kind, snapshot_id, blob)
            self.volume.commit()
        return path

    def get(self, rl_run_id: str, kind: str, snapshot_id: str) -> bytes:
        snapshot_relpath(rl_run_id, kind, snapshot_id)  # invalid input never costs a reload
        seen = self._reloads
        try:
            with self._lock:
                return super().get(rl_run_id, kind, snapshot_id)
        except SnapshotNotFound:
            self._reload_since(seen)
        with self._lock:
            return super().get(rl_run_id, kind, snapshot_id)

    def locate(self, kind: str, snapshot_id: str) -> str | None:
        validate_kind(kind)
        validate_snapshot_id(snapshot_id)
        seen = self._reloads
        with self._lock:
            found = super().locate(kind, snapshot_id)
        if found is not None:
            return found
        self._reload_since(seen)
        with self._lock:
            return super().locate(kind, snapshot_id)

    def delete(self, rl_run_id: str, kind: str, snapshot_id: str) -> bool:
        with self._lock:
            existed = super().delete(rl_run_id, kind, snapshot_id)
            if existed:
                self.volume.commit()
        return existed

    def describe(self) -> str:
        name = f"{self.volume_name}:" if self.volume_name else ""
        return f"modal-volume:{name}{self.root}"

    def _reload_since(self, seen: int) -> None:
        """Reload, unless another miss already did since ``seen``. A failed reload is logged,
        not raised: the caller then reports the snapshot as not found."""
        with self._lock:
            if self._reloads != seen:
                return
            try:
                self.volume.reload()
            except Exception as exc:
                log.warning("Volume reload failed (%s); answering from the current view", exc)
            self._reloads += 1


def export_sqlite(src: str | Path, dest_dir: str | Path, volume: VolumeLike, *, name: str) -> Path:
    """Copy the SQLite database ``src`` to ``dest_dir/name`` on a Volume and commit.

    The copy is made with SQLite's backup API on local disk first (a consistent file, WAL
    included, even if a reader still has ``src`` open), then written to the Volume under a
    temporary name and renamed, so the Volume never holds an open or partial database.
    """
    src, dest_dir = Path(src), Path(dest_dir)
    if not src.is_file():
        raise FileNotFoundError(f"no SQLite file at {src}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / name
    fd, local_copy = tempfile.mkstemp(prefix=f".{src.name}.", suffix=".export", dir=src.parent)
    os.close(fd)
    volume_tmp = dest_dir / f".{name}.tmp"
    try:
        source = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        target = sqlite3.connect(local_copy)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        shutil.copyfile(local_copy, volume_tmp)
        os.replace(volume_tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(volume_tmp)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local_copy)
    volume.commit()
    return final
