"""The snapshot file format: a standard ``.tar.gz`` of ``meta.json`` and ``state.bin``, signed.

The signature is an HMAC-SHA256, keyed by a server secret, over the file's compressed bytes. It
sits in the gzip header's extra field (RFC 1952 ``FEXTRA``, subfield ``GS``), so the file stays a
plain ``.tar.gz`` to every tool, and it is checked over the raw bytes **before anything is
decompressed or parsed**: a modified, truncated or foreign file costs one HMAC and is refused.
Only then is the gzip inflated, into a bounded buffer, and the tar read header by header: only
regular members with the expected names and sizes are accepted (a GNU long-name or pax header, a
link or a device is refused at its 512-byte header), and nothing is ever extracted to disk. The
metadata holds the payload's SHA-256.

Format 1 (the signature a tar member inside the gzip) is still read, through the same bounded
inflate and header-by-header tar reader, so snapshots written before stay restorable.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import struct
import tarfile
import time
import zlib
from typing import Any

from storage.base import SnapshotCorrupt

FORMAT = "grpo-snapshot"
FORMAT_VERSION = 2
_MEMBERS = ("meta.json", "state.bin")
_LEGACY_MEMBERS = ("meta.json", "state.bin", "signature")
_MAX_META_BYTES = 64 * 1024
_MAX_STATE_BYTES = 32 * 1024 * 1024
# The largest tar a snapshot can be: its members, their headers, padding and tar's end blocks.
_MAX_TAR_BYTES = _MAX_STATE_BYTES + 2 * _MAX_META_BYTES + 64 * 1024
_BLOCK = 512

# gzip header: magic, deflate, FLG.FEXTRA, mtime, XFL 0, OS 255 (unknown), XLEN, then the one
# extra subfield "GS" holding the hex signature.
_SIG_LEN = 64
_GZIP_PREFIX = b"\x1f\x8b\x08\x04"
_EXTRA = struct.pack("<H", 4 + _SIG_LEN) + b"GS" + struct.pack("<H", _SIG_LEN)
_HEADER_LEN = 10 + len(_EXTRA) + _SIG_LEN


def _canonical(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _inflate(data: bytes, wbits: int) -> bytes:
    """Decompress at most ``_MAX_TAR_BYTES`` (a bomb is cut there, not held in memory)."""
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, _MAX_TAR_BYTES + 1)
    except zlib.error:
        raise SnapshotCorrupt("snapshot is not a readable tar.gz: bad deflate data") from None
    if len(out) > _MAX_TAR_BYTES or inflater.unconsumed_tail:
        raise SnapshotCorrupt(f"snapshot decompresses to more than {_MAX_TAR_BYTES} bytes")
    if not inflater.eof:
        raise SnapshotCorrupt("snapshot is truncated")
    return out


def _read_tar(data: bytes, names: tuple[str, ...]) -> dict[str, bytes]:
    """The members of an in-memory tar, header by header: each must be a regular file named in
    ``names``, at most once, within its size limit; anything else is refused at its header."""
    found: dict[str, bytes] = {}
    offset = 0
    while offset + _BLOCK <= len(data):
        block = data[offset : offset + _BLOCK]
        if not block.strip(b"\0"):
            break  # end of archive
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
        except (tarfile.HeaderError, UnicodeDecodeError):
            raise SnapshotCorrupt("snapshot has a corrupt tar header") from None
        if info.name not in names or info.name in found:
            raise SnapshotCorrupt(f"snapshot has an unexpected member {info.name!r:.80}")
        if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise SnapshotCorrupt(f"snapshot member {info.name!r} is not a regular file")
        limit = _MAX_STATE_BYTES if info.name == "state.bin" else _MAX_META_BYTES
        if info.size > limit:
            raise SnapshotCorrupt(f"snapshot member {info.name!r} is too large")
        start = offset + _BLOCK
        if start + info.size > len(data):
            raise SnapshotCorrupt(f"snapshot member {info.name!r} is truncated")
        found[info.name] = data[start : start + info.size]
        offset = start + -(-info.size // _BLOCK) * _BLOCK
    missing = [name for name in names if name not in found]
    if missing:
        raise SnapshotCorrupt(f"snapshot is missing {', '.join(missing)}")
    return found


class SnapshotCodec:
    """Packs and verifies signed snapshot tarballs."""

    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError("snapshot signing key must be at least 16 bytes")
        self._key = key

    def _sign(self, data: bytes, domain: bytes = b"grpo-snapshot-v2\n") -> bytes:
        return hmac.new(self._key, domain + data, hashlib.sha256).hexdigest().encode()

    def pack(self, meta: dict[str, Any], payload: bytes) -> bytes:
        meta = {
            **meta,
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "payload_sha256": hashlib.sha256(payload).hexdigest(),
            "payload_size": len(payload),
        }
        tar = _tar({"meta.json": _canonical(meta), "state.bin": payload})
        # The payload is already compressed; level 1 keeps the gzip wrapper cheap.
        deflate = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
        body = deflate.compress(tar) + deflate.flush()
        body += struct.pack("<II", zlib.crc32(tar), len(tar) & 0xFFFFFFFF)
        header = _GZIP_PREFIX + struct.pack("<I", int(time.time())) + b"\x00\xff" + _EXTRA
        return header + self._sign(body) + body

    def unpack(self, blob: bytes) -> tuple[dict[str, Any], bytes]:
        """Verify and return ``(meta, payload)``; ``SnapshotCorrupt`` on anything amiss."""
        if blob[:4] == _GZIP_PREFIX and blob[10 : 10 + len(_EXTRA)] == _EXTRA:
            signature, body = blob[10 + len(_EXTRA) : _HEADER_LEN], blob[_HEADER_LEN:]
            if not hmac.compare_digest(signature, self._sign(body)):
                raise SnapshotCorrupt(
                    "snapshot signature does not match: modified, or signed by another server"
                )
            tar = _inflate(body[:-8], -zlib.MAX_WBITS)
            if len(body) < 8 or struct.unpack("<II", body[-8:]) != (zlib.crc32(tar), len(tar) & 0xFFFFFFFF):
                raise SnapshotCorrupt("snapshot fails its gzip checksum")
            members = _read_tar(tar, _MEMBERS)
            meta = self._meta(members["meta.json"], FORMAT_VERSION)
        else:
            members = _read_tar(_inflate(blob, 16 + zlib.MAX_WBITS), _LEGACY_MEMBERS)
            if not hmac.compare_digest(
                members["signature"].strip(), self._sign(members["meta.json"], b"grpo-snapshot-v1\n")
            ):
                raise SnapshotCorrupt(
                    "snapshot signature does not match: modified, or signed by another server"
                )
            meta = self._meta(members["meta.json"], 1)
        payload = members["state.bin"]
        if hashlib.sha256(payload).hexdigest() != meta.get("payload_sha256"):
            raise SnapshotCorrupt("snapshot payload does not match its checksum")
        return meta, payload

    @staticmethod
    def _meta(meta_bytes: bytes, version: int) -> dict[str, Any]:
        try:
            meta = json.loads(meta_bytes)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise SnapshotCorrupt("snapshot metadata is not valid JSON") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SnapshotCorrupt("not a grpo-service snapshot")
        if meta.get("format_version") != version:
            raise SnapshotCorrupt(f"unsupported snapshot format version {meta.get('format_version')!r}")
        return meta
