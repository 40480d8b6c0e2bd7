"""The snapshot file format: a tar.gz of ``meta.json``, ``state.bin`` and ``signature``.

The signature is an HMAC-SHA256, keyed by a server secret, over the canonical metadata JSON
(which holds the payload's SHA-256). A tarball is trusted only after the signature checks
out: a modified, truncated or foreign file is refused before its payload is interpreted.
The tar is read in memory, member by member, and never extracted, so no member can escape
anywhere; links, devices, unexpected names and oversized members are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import tarfile
import time
from typing import Any

from storage.base import SnapshotCorrupt

FORMAT = "grpo-snapshot"
FORMAT_VERSION = 1
_MEMBERS = ("meta.json", "state.bin", "signature")
_MAX_META_BYTES = 64 * 1024
_MAX_STATE_BYTES = 32 * 1024 * 1024


def _canonical(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class SnapshotCodec:
    """Packs and verifies signed snapshot tarballs."""

    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError("snapshot signing key must be at least 16 bytes")
        self._key = key

    def _sign(self, meta_bytes: bytes) -> bytes:
        return hmac.new(self._key, b"grpo-snapshot-v1\n" + meta_bytes, hashlib.sha256).hexdigest().encode()

    def pack(self, meta: dict[str, Any], payload: bytes) -> bytes:
        meta = {
            **meta,
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "payload_sha256": hashlib.sha256(payload).hexdigest(),
            "payload_size": len(payload),
        }
        meta_bytes = _canonical(meta)
        buf = io.BytesIO()
        # The payload is already compressed; level 1 keeps the gzip wrapper cheap.
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
            for name, data in zip(_MEMBERS, (meta_bytes, payload, self._sign(meta_bytes)), strict=True):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = int(time.time())
                info.mode = 0o600
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def unpack(self, blob: bytes) -> tuple[dict[str, Any], bytes]:
        """Verify and return ``(meta, payload)``; ``SnapshotCorrupt`` on anything amiss."""
        members = self._read_members(blob)
        meta_bytes, payload, signature = (members[name] for name in _MEMBERS)
        if not hmac.compare_digest(signature.strip(), self._sign(meta_bytes)):
            raise SnapshotCorrupt("snapshot signature does not match: modified, or signed by another server")
        try:
            meta = json.loads(meta_bytes)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise SnapshotCorrupt("snapshot metadata is not valid JSON") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SnapshotCorrupt("not a grpo-service snapshot")
        if meta.get("format_version") != FORMAT_VERSION:
            raise SnapshotCorrupt(f"unsupported snapshot format version {meta.get('format_version')!r}")
        if hashlib.sha256(payload).hexdigest() != meta.get("payload_sha256"):
            raise SnapshotCorrupt("snapshot payload does not match its checksum")
        return meta, payload

    @staticmethod
    def _read_members(blob: bytes) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
                for count, member in enumerate(tar):
                    if count >= len(_MEMBERS):
                        raise SnapshotCorrupt("snapshot has unexpected extra members")
                    if member.name not in _MEMBERS or member.name in found:
                        raise SnapshotCorrupt(f"snapshot has an unexpected member {member.name!r:.80}")
                    if not member.isreg():
                        raise SnapshotCorrupt(f"snapshot member {member.name!r} is not a regular file")
                    limit = _MAX_META_BYTES if member.name != "state.bin" else _MAX_STATE_BYTES
                    if member.size > limit:
                        raise SnapshotCorrupt(f"snapshot member {member.name!r} is too large")
                    fileobj = tar.extractfile(member)
                    if fileobj is None:
                        raise SnapshotCorrupt(f"snapshot member {member.name!r} is unreadable")
                    data = fileobj.read(limit + 1)
                    if len(data) != member.size:
                        raise SnapshotCorrupt(f"snapshot member {member.name!r} is truncated")
                    found[member.name] = data
        except SnapshotCorrupt:
            raise
        except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
            raise SnapshotCorrupt(f"snapshot is not a readable tar.gz: {type(exc).__name__}") from None
        missing = [name for name in _MEMBERS if name not in found]
        if missing:
            raise SnapshotCorrupt(f"snapshot is missing {', '.join(missing)}")
        return found
