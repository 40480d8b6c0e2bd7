"""Synth's trace schema v3, as SQL views over our trace DB, and a Synth-shaped copy of a DB.

Synth's tools (its SFT exporter, its dashboards) read ``session_traces``, ``session_timesteps``,
``events``, ``messages``, ``outcome_rewards`` and ``event_rewards``. Our schema holds the same
facts, normalized differently (docs/workflow.md, "Synth's schema v3"), and maps onto theirs
faithfully:

- ``session_traces``: ``sessions`` (metadata: run, policy, env, seed, model, group, achievements);
- ``session_timesteps``: ``turns`` (``step_id = 'decision_<turn>'``);
- ``events`` of type ``cais``: ``llm_calls`` with the turn's prompt ``messages`` as ``call_records``;
- ``events`` of type ``environment``: ``env_steps`` (reward, terminated, truncated, state text);
- ``messages``: ``messages`` (``tool`` is ``tool_result``; an assistant tool call is ``assistant``
  with ``metadata.is_tool_call``, as Synth's own task app writes it);
- ``outcome_rewards``: ``sessions`` (total reward, achievements, steps);
- ``event_rewards``: ``rewards`` of scope ``step`` (kinds ``env`` → ``sparse``, ``achievements`` →
  ``achievement_delta`` with ``annotation.achievements``).

What has no counterpart is NULL: per-turn wall-clock times (we keep latencies), ``provider``,
``cost_usd``, span/trace ids, embeddings, experiments. Integer ids are derived from the session's
rowid and the turn, so they are stable for a given DB.

`install_views` adds the views to a DB as ``synth_<table>`` (our ``messages`` table holds the
name ``messages``); `export_synth_db` writes a separate SQLite file whose tables carry Synth's
own names, which Synth's exporter reads as it is.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from grpo_service.tracing.derive import derive_file

# ids: a timestep is rowid * 100000 + turn; a turn's cais event is 2 * that, its environment event + 1.
_TIMESTEP_ID = "(s.rowid * 100000 + {turn})"
_CREATED_AT = "strftime('%Y-%m-%d %H:%M:%f', s.started_at, 'unixepoch')"

VIEWS: dict[str, str] = {
    "session_traces": f"""
        SELECT s.session_id,
               {_CREATED_AT} AS created_at,
               s.num_turns AS num_timesteps,
               (SELECT COUNT(*) FROM llm_calls l WHERE l.session_id = s.session_id)
                 + (SELECT COUNT(*) FROM env_steps e WHERE e.session_id = s.session_id) AS num_events,
               (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.session_id) AS num_messages,
               json_object('run_id', s.run_id, 'policy_name', s.policy_name, 'env_name', s.env_name,
                           'seed', s.seed, 'model', s.model, 'group_id', s.group_id,
                           'group_index', s.group_index, 'rl_run_id', s.rl_run_id, 'mode', s.mode,
                           'stop_reason', s.stop_reason,
                           'final_achievements', json(s.achievements)) AS metadata,
               NULL AS experiment_id,
               NULL AS embedding
        FROM sessions s""",
    "session_timesteps": f"""
        SELECT {_TIMESTEP_ID.format(turn="t.turn")} AS id,
               t.session_id,
               'decision_' || t.turn AS step_id,
               t.turn AS step_index,
               t.turn AS turn_number,
               NULL AS started_at,
               NULL AS completed_at,
               (SELECT COUNT(*) FROM llm_calls l WHERE l.session_id = t.session_id AND l.turn = t.turn)
                 + (SELECT COUNT(*) FROM env_steps e WHERE e.session_id = t.session_id AND e.turn = t.turn)
                 AS num_events,
               (SELECT COUNT(*) FROM messages m WHERE m.session_id = t.session_id AND m.turn = t.turn)
                 AS num_messages,
               json_object('episode', t.episode, 'decision_error', t.decision_error) AS step_metadata
        FROM turns t JOIN sessions s ON s.session_id = t.session_id""",
    "events": f"""
        SELECT 2 * {_TIMESTEP_ID.format(turn="l.turn")} AS id,
               l.session_id,
               {_TIMESTEP_ID.format(turn="l.turn")} AS timestep_id,
               'cais' AS event_type,
               'policy:' || s.policy_name AS system_instance_id,
               s.started_at AS event_time,
               l.turn AS message_time,
               {_CREATED_AT} AS created_at,
               l.model AS model_name,
               NULL AS provider,
               l.prompt_tokens AS input_tokens,
               l.completion_tokens AS output_tokens,
               l.total_tokens,
               NULL AS cost_usd,
               l.latency_ms,
               NULL AS span_id,
               NULL AS trace_id,
               json_array(json_object(
                   'model_name', l.model,
                   'input_messages', (
                       SELECT json_group_array(json_object(
                           'role', m.role,
                           'parts', json_array(json_object('type', 'text', 'text', COALESCE(m.content, '')))))
                       FROM (SELECT m.role, m.content FROM json_each(t.prompt_messages) j
                             JOIN messages m ON m.session_id = t.session_id AND m.idx = j.value
                             ORDER BY j.key) m),
                   'output_text', c.content,
                   'output_tool_calls', (
                       SELECT json_group_array(json_object(
                           'name', json_extract(tc.value, '$.function.name'),
                           'arguments_json', json_extract(tc.value, '$.function.arguments'),
                           'call_id', json_extract(tc.value, '$.id'),
                           'index', tc.key))
                       FROM json_each(c.tool_calls) tc),
                   'usage', json(l.usage),
                   'request_params', json(l.request),
                   'finish_reason', l.finish_reason,
                   'latency_ms', l.latency_ms)) AS call_records,
               NULL AS reward,
               NULL AS terminated,
               NULL AS truncated,
               NULL AS system_state_before,
               NULL AS system_state_after,
               json_object('turn', l.turn, 'run_id', s.run_id, 'attempts', l.attempts,
                           'error', l.error) AS metadata,
               NULL AS event_metadata,
               NULL AS embedding
        FROM llm_calls l
        JOIN sessions s ON s.session_id = l.session_id
        JOIN turns t ON t.session_id = l.session_id AND t.turn = l.turn
        LEFT JOIN messages c ON c.session_id = t.session_id AND c.idx = t.completion_message
        UNION ALL
        SELECT 2 * {_TIMESTEP_ID.format(turn="e.turn")} + 1,
               e.session_id,
               {_TIMESTEP_ID.format(turn="e.turn")},
               'environment',
               'environment:' || s.env_name,
               s.started_at,
               e.turn,
               {_CREATED_AT},
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               e.reward,
               e.done,
               e.truncated,
               json_object('text', json_extract(t.observation, '$.text')),
               json_object('text', json_extract(nt.observation, '$.text')),
               json_object('turn', e.turn, 'run_id', s.run_id, 'actions', json(e.actions),
                           'achievements_unlocked', json(e.achievements_unlocked), 'step_idx', e.step_idx),
               NULL,
               NULL
        FROM env_steps e
        JOIN sessions s ON s.session_id = e.session_id
        JOIN turns t ON t.session_id = e.session_id AND t.turn = e.turn
        LEFT JOIN turns nt ON nt.session_id = e.session_id AND nt.turn = e.turn + 1""",
    "messages": f"""
        SELECT s.rowid * 1000000 + m.idx AS id,
               m.session_id,
               {_TIMESTEP_ID.format(turn="m.turn")} AS timestep_id,
               CASE m.role WHEN 'tool' THEN 'tool_result' WHEN 'developer' THEN 'system' ELSE m.role END
                 AS message_type,
               COALESCE(m.content, m.tool_calls, '') AS content,
               {_CREATED_AT} AS timestamp,
               s.started_at AS event_time,
               m.turn AS message_time,
               json_object('source', m.source, 'is_tool_call', m.tool_calls IS NOT NULL,
                           'tool_calls', json(m.tool_calls), 'tool_call_id', m.tool_call_id) AS metadata,
               NULL AS embedding
        FROM messages m JOIN sessions s ON s.session_id = m.session_id""",
    "outcome_rewards": f"""
        SELECT s.rowid AS id,
               s.session_id,
               CAST(s.total_reward AS INTEGER) AS total_reward,
               s.achievements_count,
               s.num_steps AS total_steps,
               {_CREATED_AT} AS created_at,
               json_object('final_achievements', json(s.achievements), 'total_reward', s.total_reward,
                           'stop_reason', s.stop_reason) AS reward_metadata
        FROM sessions s""",
    "event_rewards": f"""
        SELECT r.id,
               2 * {_TIMESTEP_ID.format(turn="r.turn")} + 1 AS event_id,
               r.session_id,
               NULL AS message_id,
               r.turn AS turn_number,
               r.value AS reward_value,
               CASE r.kind WHEN 'env' THEN 'sparse' WHEN 'achievements' THEN 'achievement_delta'
                 ELSE r.kind END AS reward_type,
               r.kind AS "key",
               r.annotation,
               'environment' AS source,
               {_CREATED_AT} AS created_at
        FROM rewards r JOIN sessions s ON s.session_id = r.session_id
        WHERE r.scope = 'step'""",
}

VIEW_PREFIX = "synth_"


def install_views(conn: sqlite3.Connection, *, temporary: bool = False) -> list[str]:
    """(Re)create the ``synth_*`` views in ``conn``'s DB (``temporary``: for this connection only)."""
    names = []
    for table, select in VIEWS.items():
        name = VIEW_PREFIX + table
        schema = "temp." if temporary else ""
        conn.execute(f"DROP VIEW IF EXISTS {schema}{name}")
        conn.execute(f"CREATE {'TEMP ' if temporary else ''}VIEW {name} AS {select}")
        names.append(name)
    return names


def export_synth_db(source: str | Path, dest: str | Path) -> dict[str, int]:
    """Write ``dest``, a new SQLite file with Synth's v3 tables filled from ``source``; row counts."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists; choose a new file")
    dest.parent.mkdir(parents=True, exist_ok=True)
    derive_file(source)
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        install_views(conn, temporary=True)
        conn.execute("ATTACH DATABASE ? AS synth", (str(dest),))
        counts = {}
        with conn:
            for table in VIEWS:
                conn.execute(f"CREATE TABLE synth.{table} AS SELECT * FROM temp.{VIEW_PREFIX}{table}")
                counts[table] = conn.execute(f"SELECT COUNT(*) FROM synth.{table}").fetchone()[0]
        conn.execute("DETACH DATABASE synth")
    finally:
        conn.close()
    return counts
