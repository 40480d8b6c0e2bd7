"""A rollout's answer as JSON bytes: what pydantic's ``model_dump_json`` writes, encoded by orjson.

A trained rollout's answer is mostly token ids (about 2,000 per decision in a long chat), which
pydantic's serializer writes several times slower than orjson. `answer_json` gives the same bytes:
each model is encoded as its fields in order, a float field holding an int written as a float
(as pydantic does), and anything orjson would write differently from pydantic (a datetime, a
dataclass, a set, a non-string key, a model class with serializers, aliases, extras, computed
fields or subclasses, a lone surrogate...) sends the whole answer to ``model_dump_json``
instead. Integer fields and token id lists are trusted to hold ints, not bools (pydantic's
validation makes them so; the call records built without it take them from the inference
client's checked replies).
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import annotated_types
import orjson
from pydantic import AfterValidator, BaseModel, BeforeValidator, PlainValidator, WrapValidator

# How a field's value is written, when pydantic writes its numbers as floats: a float, a list or a
# dict of them (items that may be null: "items?"); the field itself may be null ("?").
_Kind = Literal["", "float", "float?", "items", "items?", "nullable items", "values", "values?"]
_FLOAT_KINDS: dict[Any, _Kind] = {
    float: "float",
    float | None: "float?",
    list[float]: "items",
    list[float] | None: "items?",
    list[float | None]: "nullable items",
    dict[str, float]: "values",
    dict[str, float] | None: "values?",
}
# orjson writes these types itself, differently from pydantic: they reach `_fields` instead.
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS

# Field metadata that leaves serialization alone (constraints and validators); anything else (a
# serializer, `SerializeAsAny`...) leaves the class to pydantic.
_VALIDATION_ONLY = (
    annotated_types.BaseMetadata,  # Ge, MaxLen, Strict, pydantic's Field(...) constraints
    AfterValidator,
    BeforeValidator,
    PlainValidator,
    WrapValidator,
)

_plans: dict[type[BaseModel], tuple[tuple[str, _Kind], ...] | None] = {}


class _NotPlain(TypeError):
    """The answer holds something only pydantic writes as pydantic does."""


def answer_json(model: BaseModel) -> bytes:
    """``model.model_dump_json().encode()``, by orjson when the model tree allows it."""
    try:
        return orjson.dumps(model, default=_fields, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError, _NotPlain
        return model.model_dump_json().encode()


def _fields(value: Any) -> dict[str, Any]:
    if not isinstance(value, BaseModel):
        raise _NotPlain(type(value).__name__)
    cls = type(value)
    try:
        plan = _plans[cls]
    except KeyError:
        plan = _plans[cls] = _plan(cls)
    fields = value.__dict__
    if plan is None or len(fields) != len(plan) or value.__pydantic_extra__:
        raise _NotPlain(cls.__name__)
    out = fields
    for name, kind in plan:
        if kind:
            v = fields[name]
            w = _as_floats(v, kind)
            if w is not v:
                if out is fields:
                    out = dict(fields)
                out[name] = w
    return out


def _as_floats(v: Any, kind: _Kind) -> Any:
    """``v`` with its numbers as floats, as pydantic writes a field of this kind."""
    if v is None and kind.endswith("?"):
        return v
    if kind.startswith("float"):
        return v if type(v) is float else float(v)
    if kind.startswith("values"):
        return v if set(map(type, v.values())) <= {float} else {k: float(x) for k, x in v.items()}
    if kind == "nullable items":
        return v if set(map(type, v)) <= {float, type(None)} else [None if x is None else float(x) for x in v]
    return v if set(map(type, v)) <= {float} else [float(x) for x in v]


def _plan(cls: type[BaseModel]) -> tuple[tuple[str, _Kind], ...] | None:
    """Per field, in order, how its value is written; None when the class is not plain."""
    decorators = cls.__pydantic_decorators__
    if decorators.field_serializers or decorators.model_serializers or decorators.computed_fields:
        return None
    config = cls.model_config
    if (
        cls.__pydantic_root_model__
        or config.get("extra") == "allow"
        or any(key.startswith("ser_json") or key == "json_encoders" for key in config)
    ):
        return None
    plan = []
    for name, field in cls.model_fields.items():
        if (
            field.exclude
            or getattr(field, "exclude_if", None) is not None
            or (field.serialization_alias or field.alias or name) != name
            or not all(isinstance(m, _VALIDATION_ONLY) for m in field.metadata)
        ):
            return None
        annotation = field.annotation
        kind = _FLOAT_KINDS.get(annotation, "")
        if not kind and not _plain_type(annotation):
            return None
        plan.append((name, kind))
    return tuple(plan)


def _plain_type(annotation: Any) -> bool:
    """Whether orjson writes any value of this declared type as pydantic does: no float inside
    (pydantic writes an int there as a float), and no model class that has subclasses (pydantic
    writes a subclass's value with the declared class's fields)."""
    if annotation is float:
        return False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return not annotation.__subclasses__()
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return True
    if origin is typing.Annotated:
        return False
    args = typing.get_args(annotation)
    if origin in (list, dict, typing.Union, types.UnionType):
        return all(_plain_type(a) for a in args)
    return annotation in (str, int, bool, type(None), Any)
