"""Tracing v3 for grpo-service: every finished rollout appended to a SQLite DB.

- `schema`: the versioned DDL and its migrations.
- `traces`: `RolloutTrace` (what a finished rollout hands over) and the `TraceSink` protocol.
- `record`: a rollout's detail as one compressed record (what the writer stores of it).
- `rows`: the rows of every table: what is written of a `RolloutTrace`, what its record derives.
- `writer`: `TraceWriter`, the task app's `TraceSink` (one writer task, bounded queue).
- `derive`: the detail tables filled from the records, when a DB is read.
- `reader`: `TraceReader`, for the exporter, the CLI and tests.
- `export`: OpenAI chat fine-tuning JSONL from a trace DB.

The names below are imported on first use: reading a DB never loads the async writer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_service.tracing.reader import TraceDBError as TraceDBError
    from grpo_service.tracing.reader import TraceReader as TraceReader
    from grpo_service.tracing.schema import SCHEMA_VERSION as SCHEMA_VERSION
    from grpo_service.tracing.schema import SchemaTooNew as SchemaTooNew
    from grpo_service.tracing.writer import TraceWriter as TraceWriter

_EXPORTS = {
    "SCHEMA_VERSION": "schema",
    "SchemaTooNew": "schema",
    "TraceDBError": "reader",
    "TraceReader": "reader",
    "TraceWriter": "writer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
