"""Tracing v3 for grpo-service: every finished rollout appended to a SQLite DB.

- `schema`: the versioned DDL and its migrations.
- `rows`: one `RolloutTrace` → rows of every table.
- `writer`: `TraceWriter`, the task app's `TraceSink` (one writer task, bounded queue).
- `reader`: `TraceReader`, for the exporter, the CLI and tests.
- `export`: OpenAI chat fine-tuning JSONL from a trace DB.
"""

from grpo_service.tracing.reader import TraceDBError, TraceReader
from grpo_service.tracing.schema import SCHEMA_VERSION, SchemaTooNew
from grpo_service.tracing.writer import TraceWriter

__all__ = ["SCHEMA_VERSION", "SchemaTooNew", "TraceDBError", "TraceReader", "TraceWriter"]
