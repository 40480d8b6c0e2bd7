"""`strict_json` parses with orjson first: it answers every body as `json`'s strict path does,
the same value (types included) or the same error."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from grpo_service.api.limits import _stdlib_strict_json, _within_depth, strict_json
from inference.nesting import MAX_JSON_DEPTH

EDGES = [
    b'{"type": "step", "data": {"action": "craft 1 stick using 1 planks"}}',
    b"  [1, -0, 0.5, -0.0, 1E5, 2e-3, true, false, null]  ",
    b'"\\u00e9\\u4e2d\\ud83d\\ude00"',  # escapes, a surrogate pair
    b'"\\ud800"',  # a lone surrogate escape
    b'"\\udc00x"',
    b"123456789012345678901234567890",  # past 64 bits: `json` keeps an int
    b"-9223372036854775808",
    b"18446744073709551616",
    b"1" + b"0" * 400 + b".0",  # a float that overflows
    b"1e400",
    b"NaN",
    b"[Infinity]",
    b'{"a": 1, "a": 2}',
    b"\xef\xbb\xbf{}",  # a BOM
    '{"k": "ü"}'.encode("utf-16"),
    b'{"k": "\xff"}',  # not UTF-8
    b"[1, 2",
    b"{} {}",
    b"",
    b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
    b"[" * 5000 + b"]" * 5000,
    b'"\\u0000 tab\\t"',
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(2**70), 2**70) if rng.random() < 0.2 else rng.randint(-1000, 1000)
    if kind == 2:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-300, 300)
    if kind in (3, 4):
        return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0, 0x10FFFF)])) for _ in range(5))
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{rng.randint(0, 9)}": _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _stdlib_only(raw: bytes) -> Any:
    return _within_depth(raw, _stdlib_strict_json(raw))


def _outcome(parse: Any, raw: bytes) -> tuple[str, Any]:
    try:
        value = parse(raw)
    except json.JSONDecodeError as exc:
        return "error", str(exc)
    return "value", json.dumps(value, ensure_ascii=False, default=repr) + repr(_types(value))


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def _corpus() -> list[bytes]:
    rng = random.Random(7)
    generated = []
    for _ in range(400):
        text = json.dumps(_value(rng), ensure_ascii=rng.random() < 0.5)
        raw = text.encode("utf-8", "surrogatepass")
        generated.append(raw)
        cut = rng.randrange(len(raw) + 1)  # and a damaged copy
        generated.append(raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1 :])
    return EDGES + generated


@pytest.mark.parametrize("chunk", range(4))
def test_strict_json_answers_as_jsons_strict_path(chunk: int) -> None:
    corpus = _corpus()[chunk::4]
    for raw in corpus:
        assert _outcome(strict_json, raw) == _outcome(_stdlib_only, raw), raw[:80]


def test_strict_json_refuses_what_standard_json_refuses() -> None:
    for raw in (b"NaN", b"[Infinity]", b"1e400", b'"\\ud800"', b"[1, 2", b"[" * 5000 + b"]" * 5000):
        with pytest.raises(json.JSONDecodeError):
            strict_json(raw)
    assert strict_json(b"123456789012345678901234567890") == 123456789012345678901234567890
    assert strict_json('{"a": "é"}') == {"a": "é"}
