"""JSON encoding for trace columns, secret redaction, the message ⇄ row mapping, and the packed
form of a rollout's prompt token ids."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Mapping
from typing import Any

import orjson
import zstandard

REDACTED = "[redacted]"
_SECRET_MARKERS = ("key", "secret", "password", "authorization")

# Message fields with their own column; everything else goes to ``extra``.
MESSAGE_COLUMNS = ("content", "tool_calls", "tool_call_id", "name")


# Non-string keys become strings and numpy values lists or numbers, as `json.dumps` had them;
# orjson writes strict JSON (a NaN becomes null) several times faster: every turn of every
# rollout is encoded here. With non-string keys allowed orjson takes a slower path for every
# dict, so it is asked for only when a value has such keys.
_STR_KEYS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _default(value: Any) -> Any:
    # numpy values orjson does not take, sets, bytes: whatever the trace carries, never fail.
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return str(value)


def dumps(value: Any) -> str | None:
    return None if value is None else dumps_bytes(value).decode()


def dumps_bytes(value: Any) -> bytes:
    """`dumps` as UTF-8 bytes (``null`` for None)."""
    try:
        return orjson.dumps(value, default=_default, option=_STR_KEYS_OPTIONS)
    except orjson.JSONEncodeError:  # a dict with keys that are not strings
        return orjson.dumps(value, default=_default, option=_OPTIONS)


def loads(text: str | None) -> Any:
    # The standard parser: DBs written before orjson may hold NaN, which it still reads.
    return None if text is None else json.loads(text)


def canonical(value: Any) -> str:
    return orjson.dumps(value, default=_default, option=_OPTIONS | orjson.OPT_SORT_KEYS).decode()


# Every turn's request is redacted with the same few keys: each key is judged once.
_SECRET_KEYS: dict[str, bool] = {}
_MAX_KNOWN_KEYS = 4_096


def is_secret_key(name: str) -> bool:
    secret = _SECRET_KEYS.get(name)
    if secret is None:
        lowered = name.lower()
        secret = any(marker in lowered for marker in _SECRET_MARKERS)
        if len(_SECRET_KEYS) < _MAX_KNOWN_KEYS:
            _SECRET_KEYS[name] = secret
    return secret


def redact(value: Any) -> Any:
    """A copy with every value under a secret-looking key (``api_key``, ...) replaced."""
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if v is not None and is_secret_key(k if type(k) is str else str(k)):
                out[k] = REDACTED
            elif isinstance(v, dict | list | tuple):
                out[k] = redact(v)
            else:
                out[k] = v
        return out
    if isinstance(value, list | tuple):
        return [redact(v) if isinstance(v, dict | list | tuple) else v for v in value]
    return value


_SECRET_MARKER_BYTES = tuple(marker.encode() for marker in _SECRET_MARKERS)


def dumps_redacted(value: Any) -> str | None:
    """``dumps(redact(value))``. Most values (a session's request, configs) hold no secret-looking
    key: encoded once, an ASCII value whose JSON has no marker anywhere (keys are written as they
    are, lowercased here) has nothing to redact, and is not walked again in Python. Non-ASCII text
    is walked: Unicode's lowercasing can make a marker of it (the Kelvin sign lowers to "k")."""
    if value is None:
        return None
    text = dumps_bytes(value)
    if text.isascii():
        lowered = text.lower()
        if not any(marker in lowered for marker in _SECRET_MARKER_BYTES):
            return text.decode()
    return dumps(redact(value))


def split_message(message: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """(role, column values, extra) for one chat message; `join_message` inverts it exactly.

    Keys that are absent, or explicitly null, are told apart in ``extra`` so that the DB gives
    back the very messages the model was sent.
    """
    extra: dict[str, Any] = {k: v for k, v in message.items() if k != "role" and k not in MESSAGE_COLUMNS}
    role = message.get("role")
    if not isinstance(role, str):
        extra["$role"] = role
        role = "" if role is None else str(role)
    columns: dict[str, Any] = {}
    absent: list[str] = []
    null: list[str] = []
    for key in MESSAGE_COLUMNS:
        value = message.get(key)
        if key not in message:
            if key == "content":
                absent.append(key)
            continue
        if value is None and key != "content":
            null.append(key)
        elif key in ("content", "tool_call_id", "name") and not isinstance(value, str):
            extra[f"${key}"] = value  # e.g. multimodal content parts
            value = None
        columns[key] = value
    if absent:
        extra["$absent"] = absent
    if null:
        extra["$null"] = null
    return role, columns, extra or None


def join_message(role: str, columns: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    extra = dict(extra or {})
    message: dict[str, Any] = {"role": extra.pop("$role", role)}
    absent = extra.pop("$absent", [])
    null = extra.pop("$null", [])
    for key in MESSAGE_COLUMNS:
        if f"${key}" in extra:
            message[key] = extra.pop(f"${key}")
        elif columns.get(key) is not None:
            message[key] = columns[key]
        elif key in null or (key == "content" and key not in absent):
            message[key] = None
    message.update(extra)
    return message


# A rollout's records (`prompt_token_ids`, `rollout_records`): one JSON document each,
# compressed by zstd. Each prompt repeats most of the one before it (the system prompt, the
# history window), so across a rollout they compress tens of times over.
RECORD_CODEC = "zstd+json"
_ZSTD_LEVEL = 1  # level 3 saves ~1 % more for a third more CPU
MAX_RECORD_BYTES = 1 << 30  # what a record may unpack to (a corrupt header cannot ask more)


# A compressor and a decompressor per thread (neither may be shared by two threads at once): a
# new one costs its first use a third more than the work itself, in setting up its tables.
_zstd = threading.local()


def pack(value: Any) -> bytes:
    """``value`` as one compressed record (`unpack` inverts it)."""
    compressor = getattr(_zstd, "compressor", None)
    if compressor is None:
        compressor = _zstd.compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
    return compressor.compress(dumps_bytes(value))


def unpack(codec: str, data: bytes) -> Any:
    if codec != RECORD_CODEC:
        raise ValueError(f"unknown record codec {codec!r}; this version reads {RECORD_CODEC!r}")
    decompressor = getattr(_zstd, "decompressor", None)
    if decompressor is None:
        decompressor = _zstd.decompressor = zstandard.ZstdDecompressor()
    try:
        text = decompressor.decompress(data, max_output_size=MAX_RECORD_BYTES)
    except zstandard.ZstdError as exc:
        raise ValueError(f"a corrupt record: {exc}") from None
    return orjson.loads(text)


def pack_token_ids(by_turn: Mapping[int, list[int] | bytes]) -> bytes:
    """A rollout's prompt token ids, turn → ids, as one record (`unpack_token_ids` inverts it).
    A turn's ids may come as their compact JSON already (`LLMCall.prompt_token_ids_json`): the
    record is the same. Row by row, as JSON text, they were most of a trace's bytes and of
    SQLite's CPU."""
    # The keys as strings, as JSON has them: orjson's path for other keys is slower for the ids
    # too (about two thirds more per rollout).
    return pack(
        {str(turn): orjson.Fragment(ids) if type(ids) is bytes else ids for turn, ids in by_turn.items()}
    )


def unpack_token_ids(codec: str, data: bytes) -> dict[int, list[int]]:
    return {int(turn): ids for turn, ids in unpack(codec, data).items()}
