"""SFT export: OpenAI chat fine-tuning JSONL from a trace DB (or, with ``streams``, the token
streams of rollouts played token-in/token-out: one line per stream).

One example per **turn**: the exact messages the model was sent for that decision (system
prompt, its history window, the current observation) followed by the assistant reply with
its tool call, plus the tool schemas it was offered. Per turn rather than per session because
the policy sends a bounded history window: a whole session as one conversation is a context
the model never saw, while each turn's prompt is precisely what it answered.

Only turns whose decision succeeded are kept (the reply called the tool with valid actions);
every example is validated before it is written. Sessions are filtered on columns the writer
really fills (model, achievements, total reward), and every session or turn left out is
counted under its reason.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grpo_service.tracing.reader import TraceReader
from inference.reasoning import reply_reasoning

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


class UnknownAchievement(ValueError):
    """A ``require_achievements`` name no environment of the DB knows (a typo would keep nothing)."""


class ExportFilters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["rl", "eval"] | None = Field(
        default="rl",
        description="Sessions of this request mode; eval episodes are left out by default (None: all).",
    )
    run_ids: list[str] = Field(default_factory=list, description="Only sessions of these run ids.")
    model: str | None = Field(default=None, description="Keep sessions whose policy model is this.")
    min_achievements: int = Field(default=0, ge=0, description="Distinct achievements unlocked, at least.")
    require_achievements: list[str] = Field(default_factory=list, description="All of these unlocked.")
    min_reward: float | None = Field(default=None, description="Session total reward (outcome), at least.")
    limit: int | None = Field(default=None, ge=1, description="At most this many sessions (oldest first).")


@dataclass
class ExportReport:
    db: Path
    out: Path
    sessions_total: int = 0
    sessions_kept: int = 0
    turns_seen: int = 0
    examples: int = 0
    session_skips: Counter[str] = field(default_factory=Counter)
    turn_skips: Counter[str] = field(default_factory=Counter)
    writer_drops: int = 0
    writer_failures: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "db": str(self.db),
            "out": str(self.out),
            "sessions_total": self.sessions_total,
            "sessions_kept": self.sessions_kept,
            "turns_seen": self.turns_seen,
            "examples": self.examples,
            "session_skips": dict(self.session_skips),
            "turn_skips": dict(self.turn_skips),
            "writer_drops": self.writer_drops,
            "writer_failures": self.writer_failures,
        }


# ---------------------------------------------------------------------------------- filters


def session_skip_reason(session: dict[str, Any], filters: ExportFilters) -> str | None:
    """Why a session is left out (``None``: keep it). The first failing filter names the reason."""
    if filters.mode is not None and (session.get("mode") or "rl") != filters.mode:
        return "mode"
    if filters.run_ids and session.get("run_id") not in filters.run_ids:
        return "run_id"
    if filters.model is not None and session.get("model") != filters.model:
        return "model"
    achievements = set(session.get("achievements") or [])
    if len(achievements) < filters.min_achievements:
        return "min_achievements"
    for name in filters.require_achievements:
        if name not in achievements:
            return f"require_achievement:{name}"
    if filters.min_reward is not None and float(session.get("total_reward") or 0.0) < filters.min_reward:
        return "min_reward"
    return None


def check_achievement_names(names: list[str], sessions: list[dict[str, Any]]) -> None:
    """Refuse names that are neither Crafter's achievements nor unlocked in any session of the DB."""
    if not names:
        return
    from envs.crafter.actions import ACHIEVEMENTS

    known = set(ACHIEVEMENTS) | {a for s in sessions for a in s.get("achievements") or []}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownAchievement(
            f"unknown achievement {', '.join(map(repr, unknown))}; valid: {', '.join(sorted(known))}"
        )


# --------------------------------------------------------------------------------- examples


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """Only the fields of OpenAI's chat format; an assistant tool call carries no null content."""
    out = {k: message[k] for k in MESSAGE_KEYS if k in message}
    if out.get("role") == "assistant" and out.get("tool_calls") and out.get("content") is None:
        out.pop("content", None)
    if not out.get("tool_calls"):
        out.pop("tool_calls", None)
    return out


def _wire_tool_calls(calls: Any) -> Any:
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        if not isinstance(call, dict):
            out.append(call)
            continue
        function = call.get("function") or {}
        out.append(
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {"name": function.get("name"), "arguments": function.get("arguments")},
            }
        )
    return out


def build_example(session: dict[str, Any], turn: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The fine-tuning example of one turn, or the reason there is none."""
    llm = turn["llm"]
    if llm is None:
        return None, "no_llm_call"
    if llm["error"] or llm["response"] is None:
        return None, "llm_error"
    if turn["decision_error"]:
        return None, f"decision_error:{turn['decision_error']}"
    if turn["prompt"] is None or turn["completion"] is None:
        return None, "no_messages"
    completion = _clean(turn["completion"])
    # The reply's reasoning, wherever the server put it, in the field Qwen3's template renders.
    reasoning, content = reply_reasoning(turn["completion"])
    if content is not None:
        completion["content"] = content
    if reasoning:
        completion["reasoning_content"] = reasoning
    if "tool_calls" in completion:
        completion["tool_calls"] = _wire_tool_calls(completion["tool_calls"])
    messages = [_clean(m) for m in turn["prompt"]] + [completion]
    for m in messages[:-1]:
        if "tool_calls" in m:
            m["tool_calls"] = _wire_tool_calls(m["tool_calls"])
    env = turn["env"] or {}
    example: dict[str, Any] = {"messages": messages}
    tools = (llm["request"] or {}).get("tools")
    if tools:
        example["tools"] = tools
    example["metadata"] = {
        "session_id": session["session_id"],
        "run_id": session["run_id"],
        "group_id": session["group_id"],
        "group_index": session["group_index"],
        "turn": turn["turn"],
        "episode": turn["episode"],
        "env_name": session["env_name"],
        "seed": session["seed"],
        "policy_name": session["policy_name"],
        "model": session["model"],
        "step_reward": env.get("reward"),
        "achievements_unlocked": env.get("achievements_unlocked") or [],
        "session_achievements": session["achievements"],
        "session_total_reward": session["total_reward"],
        "stop_reason": session["stop_reason"],
    }
    return example, None


def validate_example(example: dict[str, Any]) -> list[str]:
    """Problems that would make the example unusable for chat fine-tuning (``[]``: valid)."""
    messages = example.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["empty_messages"]
    problems: list[str] = []
    open_calls: set[str] = set()
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            problems.append("bad_role")
            continue
        content = m.get("content")
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                problems.extend(_tool_call_problems(calls))
                open_calls.update(
                    c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)
                )
            if content is not None and not isinstance(content, str):
                problems.append("content_not_string")
            if content is None and not calls:
                problems.append("empty_assistant")
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in open_calls:
                problems.append("tool_without_call")
            else:
                open_calls.discard(call_id)
            if not isinstance(content, str):
                problems.append("content_not_string")
        elif not isinstance(content, str):
            problems.append("content_not_string")
    # The reply trained on: a tool call when the model was offered tools, else its text (the
    # agentgym format's "Action: ..." reply).
    last = messages[-1]
    if not (isinstance(last, dict) and last.get("role") == "assistant"):
        problems.append("last_not_assistant")
    elif example.get("tools") and not last.get("tool_calls"):
        problems.append("last_not_tool_call")
    elif not last.get("tool_calls") and not str(last.get("content") or "").strip():
        problems.append("last_reply_empty")
    tools = example.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        problems.append("bad_tools")
    return problems


def _tool_call_problems(calls: Any) -> list[str]:
    if not isinstance(calls, list) or not calls:
        return ["tool_calls_malformed"]
    problems = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(call, dict)
            and isinstance(call.get("id"), str)
            and call.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
        ):
            problems.append("tool_calls_malformed")
            continue
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            problems.append("arguments_not_string")
            continue
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            problems.append("arguments_not_json")
            continue
        if not isinstance(parsed, dict):
            problems.append("arguments_not_object")
    return problems


# ----------------------------------------------------------------------------------- export


def iter_examples(
    reader: TraceReader,
    filters: ExportFilters,
    report: ExportReport,
    on_session: Callable[[], None] | None = None,
    streams: bool = False,
) -> Iterator[dict[str, Any]]:
    sessions = reader.sessions()
    check_achievement_names(filters.require_achievements, sessions)
    report.sessions_total = len(sessions)
    for session in sessions:
        reason = session_skip_reason(session, filters)
        if reason is None and filters.limit is not None and report.sessions_kept >= filters.limit:
            reason = "limit"
        if reason is not None:
            report.session_skips[reason] += 1
        elif streams:
            report.sessions_kept += 1
            yield from _stream_examples(reader, session, report)
        else:
            report.sessions_kept += 1
            for turn in reader.turns(session["session_id"]):
                report.turns_seen += 1
                example, skip = build_example(session, turn)
                if example is not None:
                    problems = validate_example(example)
                    if problems:
                        example, skip = None, f"invalid_example:{problems[0]}"
                if example is None:
                    report.turn_skips[skip or "unknown"] += 1
                    continue
                report.examples += 1
                yield example
        if on_session is not None:
            on_session()


def _stream_examples(
    reader: TraceReader, session: dict[str, Any], report: ExportReport
) -> Iterator[dict[str, Any]]:
    """One line per token stream of the session: the exact tokens the model was sampled on, the
    ``sampled`` mask the SFT trainer takes its loss on (`training.llm.sft`), the sampler's logprobs
    and spans. A session played per decision has none (counted under ``no_stream``)."""
    found = reader.streams(session["session_id"])
    if not found:
        report.turn_skips["no_stream"] += 1
    for stream in found:
        report.turns_seen += len(stream["spans"])
        report.examples += 1
        yield {
            **{k: stream[k] for k in ("token_ids", "sampled", "logprobs", "spans")},
            "metadata": {
                "session_id": session["session_id"],
                "run_id": session["run_id"],
                "episode": stream["episode"],
                "start_reason": stream["start_reason"],
                "end_reason": stream["end_reason"],
                "env_name": session["env_name"],
                "seed": session["seed"],
                "policy_name": session["policy_name"],
                "model": session["model"],
                "session_total_reward": session["total_reward"],
                "stop_reason": session["stop_reason"],
            },
        }


def export_sft(
    db: str | Path,
    out: str | Path,
    filters: ExportFilters | None = None,
    on_session: Callable[[], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    *,
    streams: bool = False,
) -> ExportReport:
    """Write the examples to ``out`` (atomically: a temp file renamed at the end): one chat example
    per successful turn, or with ``streams`` one line per token stream (every turn of it, the
    model's own tokens; invalid turns included: filter sessions to choose what to imitate)."""
    filters = filters or ExportFilters()
    db, out = Path(db), Path(out)
    report = ExportReport(db=db, out=out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    with TraceReader(db) as reader:
        writers = reader.writers()
        report.writer_drops = sum(w["dropped"] for w in writers)
        report.writer_failures = sum(w["failed"] for w in writers)
        if on_start is not None:
            on_start(reader.count("sessions"))
        try:
            with tmp.open("w", encoding="utf-8") as f:
                for example in iter_examples(reader, filters, report, on_session, streams):
                    f.write(json.dumps(example, ensure_ascii=False) + "\n")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return report
