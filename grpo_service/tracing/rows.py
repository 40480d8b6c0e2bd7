"""The rows of the trace tables: what the writer stores of a finished `RolloutTrace`
(`written_rows`), and the detail tables derived from its record (`detail_rows`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_service.tracing.codec import (
    RECORD_CODEC,
    canonical,
    dumps,
    dumps_redacted,
    pack_token_ids,
    split_message,
)
from grpo_service.tracing.record import pack_record, record_of
from grpo_service.tracing.traces import RolloutTrace

SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "logprobs",
    "top_logprobs",
)


def _columns(names: str) -> list[str]:
    return names.split()


SESSION_COLUMNS = _columns(
    "session_id run_id group_id group_index rl_run_id mode env_name env_config seed policy_name "
    "policy_config model sampling started_at finished_at status stop_reason error num_turns "
    "num_steps num_episodes total_reward mean_return achievements achievements_count llm_calls "
    "prompt_tokens completion_tokens metrics request writer_id recorded_at parent_index fork_turn"
)
TURN_COLUMNS = _columns(
    "session_id turn episode observation tool_calls decision_error decision_error_detail "
    "prompt_messages completion_message"
)
MESSAGE_COLUMNS = _columns("session_id idx turn source role content tool_calls tool_call_id name extra")
LLM_COLUMNS = _columns(
    "session_id turn model request response finish_reason prompt_tokens completion_tokens "
    "total_tokens usage latency_ms attempts error prompt_token_ids completion_token_ids "
    "completion_logprobs weights_version"
)
ENV_STEP_COLUMNS = _columns(
    "session_id turn episode actions actions_executed reward done truncated step_idx "
    "achievements_unlocked env_ms info"
)
REWARD_COLUMNS = _columns("session_id scope turn episode kind value annotation")
STREAM_COLUMNS = _columns("session_id episode idx start_reason end_reason token_ids sampled logprobs spans")
PROMPT_IDS_COLUMNS = _columns("session_id codec data")
RECORD_COLUMNS = _columns("session_id codec data error")

TABLE_COLUMNS: dict[str, list[str]] = {
    "sessions": SESSION_COLUMNS,
    "turns": TURN_COLUMNS,
    "messages": MESSAGE_COLUMNS,
    "llm_calls": LLM_COLUMNS,
    "env_steps": ENV_STEP_COLUMNS,
    "rewards": REWARD_COLUMNS,
    "streams": STREAM_COLUMNS,
    "prompt_token_ids": PROMPT_IDS_COLUMNS,
    "rollout_records": RECORD_COLUMNS,
}
# What a record becomes when derived (`tracing.derive`).
DERIVED_TABLES = ("turns", "messages", "llm_calls", "env_steps", "rewards", "streams")


def insert_sql(table: str) -> str:
    columns = TABLE_COLUMNS[table]
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


@dataclass
class TraceRows:
    """Rows per table (parents first), as tuples in `TABLE_COLUMNS` order."""

    tables: dict[str, list[tuple[Any, ...]]] = field(
        default_factory=lambda: {name: [] for name in TABLE_COLUMNS}
    )

    def extend(self, other: TraceRows) -> None:
        for name, rows in other.tables.items():
            self.tables[name].extend(rows)

    def count(self) -> int:
        return sum(len(rows) for rows in self.tables.values())


def _message_key(message: dict[str, Any], source: str) -> Any:
    """What identifies a message: its plain role and text when that is all it has (most of a
    prompt, replayed each turn: no JSON encoding), else its canonical JSON."""
    if len(message) == 2 and type(message.get("role")) is str and type(message.get("content")) is str:
        return (source, message["role"], message["content"])
    return f"{source}:{canonical(message)}"


class _Messages:
    """A session's distinct messages: a message seen again in a later prompt is stored once."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.index: dict[Any, int] = {}
        self.rows: list[tuple[Any, ...]] = []
        # The same message object in later prompts (an agent replays its history window's
        # messages as the same dicts): its index without encoding it again. The object is kept,
        # so its id is not reused while this is alive.
        self._seen: dict[tuple[int, str], tuple[Any, int]] = {}

    def add(self, message: Any, turn: int, source: str) -> int:
        seen = self._seen.get((id(message), source))
        if seen is not None:
            return seen[1]
        original = message
        if not isinstance(message, dict):
            message = {"role": "", "$content": message}
        key = _message_key(message, source)
        found = self.index.get(key)
        if found is not None:
            self._seen[(id(original), source)] = (original, found)
            return found
        idx = len(self.rows)
        role, columns, extra = split_message(message)
        self.rows.append(
            (
                self.session_id,
                idx,
                turn,
                source,
                role,
                columns.get("content"),
                dumps(columns.get("tool_calls")),
                columns.get("tool_call_id"),
                columns.get("name"),
                dumps(extra),
            )
        )
        self.index[key] = idx
        self._seen[(id(original), source)] = (original, idx)
        return idx


def _completion_message(response: dict[str, Any] | None) -> dict[str, Any] | None:
    """The assistant message of the first choice, without the null fields SDKs add."""
    if not isinstance(response, dict):
        return None
    choices = response.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    return {k: v for k, v in message.items() if v is not None or k == "content"}


def _episodes(decisions: list[dict[str, Any]]) -> list[int]:
    """The episode of each decision: a new one starts after a step that ended an episode."""
    episode, out = 0, []
    for d in decisions:
        out.append(episode)
        if d["result"] is not None and d["result"]["done"]:
            episode += 1
    return out


def _model_and_sampling(trace: RolloutTrace) -> tuple[str | None, dict[str, Any]]:
    for d in trace.decisions:
        call = d.decision.llm_call
        if call is not None:
            request = call.request
            sampling = {k: request[k] for k in SAMPLING_KEYS if k in request}
            return request.get("model") or call.model, sampling
    config = trace.policy_config
    return config.get("model"), {k: config[k] for k in SAMPLING_KEYS if k in config}


def written_rows(
    trace: RolloutTrace, session_id: str, writer_id: int | None, recorded_at: float
) -> TraceRows:
    """What the writer stores for ``trace``: its `sessions` row, its prompt token ids and its
    detail as one record (`record.record_of`), from which `detail_rows` derives the rest."""
    out = TraceRows()
    t = out.tables
    prompt_token_ids: dict[int, list[int] | bytes] = {}
    for d in trace.decisions:
        call = d.decision.llm_call
        if call is not None and call.prompt_token_ids is not None:
            prompt_token_ids[d.turn] = call.prompt_token_ids_json or call.prompt_token_ids
    t["sessions"].append(_session_row(trace, session_id, writer_id, recorded_at))
    if prompt_token_ids:
        t["prompt_token_ids"].append((session_id, RECORD_CODEC, pack_token_ids(prompt_token_ids)))
    t["rollout_records"].append((session_id, *pack_record(record_of(trace)), None))
    return out


def _session_row(
    trace: RolloutTrace, session_id: str, writer_id: int | None, recorded_at: float
) -> tuple[Any, ...]:
    response, metrics, request = trace.response, trace.response.metrics, trace.request
    model, sampling = _model_and_sampling(trace)
    achievements = list(metrics.achievements)
    return (
        session_id,
        response.run_id,
        response.group_id,
        response.group_index,
        request.rl_run_id,
        request.mode,
        trace.env_name,
        dumps_redacted(trace.env_config if trace.env_config is not None else request.env.config),
        trace.seed,
        trace.policy_name,
        dumps_redacted(trace.policy_config),
        model,
        dumps(sampling),
        trace.started_at,
        trace.finished_at,
        response.status,
        response.stop_reason,
        response.error,
        len(trace.decisions),
        metrics.num_steps,
        metrics.num_episodes,
        round(sum(metrics.episode_returns), 6),
        metrics.mean_return,
        dumps(achievements),
        len(achievements),
        metrics.llm_calls,
        metrics.prompt_tokens,
        metrics.completion_tokens,
        dumps(metrics.model_dump(mode="json")),
        dumps_redacted(request.model_dump(mode="json", exclude_none=True)),
        writer_id,
        recorded_at,
        response.parent_index,
        response.fork_turn,
    )


def detail_rows(record: dict[str, Any], session_id: str) -> TraceRows:
    """The rows of the detail tables (all but `sessions` and the records) of one rollout's record."""
    out = TraceRows()
    t = out.tables
    record_messages: list[Any] = record["messages"]
    messages = _Messages(session_id)
    decisions: list[dict[str, Any]] = record["decisions"]
    episode_totals: dict[int, dict[str, Any]] = {}

    for d, episode in zip(decisions, _episodes(decisions), strict=True):
        turn, call = d["turn"], d["call"]
        prompt_ids: list[int] | None = None
        completion_idx: int | None = None
        if call is not None:
            if call["prompt"] is not None:
                prompt_ids = [messages.add(record_messages[i], turn, "prompt") for i in call["prompt"]]
            completion = _completion_message(call["response"])
            if completion is not None:
                completion_idx = messages.add(completion, turn, "completion")
            params = dict(record["params"][call["params"]])
            if call["tools"] is not None:
                params["tools"] = record["tools"][call["tools"]]
            usage = call["usage"] or {}
            t["llm_calls"].append(
                (
                    session_id,
                    turn,
                    params.get("model") or call["model"],
                    dumps(params),
                    dumps(call["response"]),
                    call["finish_reason"],
                    usage.get("prompt_tokens"),
                    usage.get("completion_tokens"),
                    usage.get("total_tokens"),
                    dumps(call["usage"]),
                    call["latency_ms"],
                    call["attempts"],
                    call["error"],
                    None,  # in the session's `prompt_token_ids` record
                    dumps(call["completion_token_ids"]),
                    dumps(call["completion_logprobs"]),
                    call["weights_version"],
                )
            )
        t["turns"].append(
            (
                session_id,
                turn,
                episode,
                dumps(d["observation"]),
                dumps(d["tool_calls"]),
                d["error"],
                d["error_detail"],
                dumps(prompt_ids),
                completion_idx,
            )
        )
        result = d["result"]
        if result is None:
            continue
        info = result["info"] or {}
        unlocked = info.get("achievements_unlocked")
        reward = float(result["reward"])
        t["env_steps"].append(
            (
                session_id,
                turn,
                episode,
                dumps(list(info.get("actions", []))),
                info.get("actions_executed"),
                reward,
                int(result["done"]),
                int(result["truncated"]),
                result["step_idx"],
                dumps(unlocked),
                d["env_ms"],
                dumps(info),
            )
        )
        t["rewards"].append((session_id, "step", turn, episode, "env", reward, None))
        if unlocked:
            annotation = dumps({"achievements": list(unlocked)})
            t["rewards"].append(
                (session_id, "step", turn, episode, "achievements", float(len(unlocked)), annotation)
            )
        totals = episode_totals.setdefault(
            episode, {"return": 0.0, "achievements": [], "length": 0, "done": False, "truncated": False}
        )
        totals["return"] += reward
        totals["achievements"].extend(a for a in unlocked or [] if a not in totals["achievements"])
        totals["length"] += 1
        totals["done"], totals["truncated"] = bool(result["done"]), bool(result["truncated"])

    for episode, totals in sorted(episode_totals.items()):
        value = round(totals.pop("return"), 6)
        t["rewards"].append((session_id, "episode", None, episode, "return", value, dumps(totals)))
        count = float(len(totals["achievements"]))
        t["rewards"].append((session_id, "episode", None, episode, "achievements", count, None))

    achievements = record["achievements"]
    t["rewards"].append(
        (
            session_id,
            "session",
            None,
            None,
            "return",
            record["total_reward"],
            dumps({"achievements": achievements}),
        )
    )
    t["rewards"].append((session_id, "session", None, None, "achievements", float(len(achievements)), None))
    t["messages"] = messages.rows
    for stream in record["streams"]:
        t["streams"].append(
            (
                session_id,
                stream["episode"],
                stream["idx"],
                stream["start_reason"],
                stream["end_reason"],
                dumps(stream["token_ids"]),
                dumps(stream["sampled"]),
                dumps(stream["logprobs"]),
                dumps(stream["spans"]),
            )
        )
    return out
