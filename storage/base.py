"""The `SnapshotStore` contract and the path layout every store shares.

Layout: ``runs/{rl_run_id}/{kind}/{shard}/{snapshot_id}.tar.gz`` under the store
root, where ``shard`` is the first two hex digits of the id. Ids and run ids are validated
against strict patterns before they ever touch a path, so no caller input can escape the root.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal, Protocol

SnapshotKind = Literal["env", "policy"]
KINDS: tuple[str, ...] = ("env", "policy")

SNAPSHOT_ID_RE = re.compile(r"^[0-9a-f]{32}$")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class SnapshotError(Exception):
    """Base class of snapshot storage errors."""


class SnapshotNotFound(SnapshotError):
    """No snapshot with that id (in that run and kind)."""


class SnapshotCorrupt(SnapshotError):
    """A snapshot that fails its integrity check, is malformed, or belongs elsewhere."""


def validate_snapshot_id(snapshot_id: str) -> str:
    if not isinstance(snapshot_id, str) or not SNAPSHOT_ID_RE.fullmatch(snapshot_id):
        raise SnapshotNotFound(f"invalid snapshot id {snapshot_id!r:.60}: expected 32 lowercase hex digits")
    return snapshot_id


def validate_run_id(rl_run_id: str) -> str:
    if not isinstance(rl_run_id, str) or not RUN_ID_RE.fullmatch(rl_run_id) or ".." in rl_run_id:
        raise ValueError(
            f"invalid rl_run_id {rl_run_id!r:.60}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'"
        )
    return rl_run_id


def validate_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"invalid snapshot kind {kind!r}: expected one of {KINDS}")
    return kind


def snapshot_relpath(rl_run_id: str, kind: str, snapshot_id: str) -> PurePosixPath:
    validate_run_id(rl_run_id)
    validate_kind(kind)
    validate_snapshot_id(snapshot_id)
    return PurePosixPath("runs", rl_run_id, kind, snapshot_id[:2], f"{snapshot_id}.tar.gz")


class SnapshotStore(Protocol):
    """Where snapshot tarballs are kept. Implementations are synchronous (call from a thread)."""

    def put(self, rl_run_id: str, kind: str, snapshot_id: str, blob: bytes) -> str:
        """Write atomically; return the path it is stored at."""
        ...

    def get(self, rl_run_id: str, kind: str, snapshot_id: str) -> bytes:
        """The stored bytes, or ``SnapshotNotFound``."""
        ...

    def locate(self, kind: str, snapshot_id: str) -> str | None:
        """The ``rl_run_id`` holding this snapshot, if any (for restores that give only an id)."""
        ...

    def delete(self, rl_run_id: str, kind: str, snapshot_id: str) -> bool: ...

    def describe(self) -> str:
        """A human-readable location, for /info."""
        ...
