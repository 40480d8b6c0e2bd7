"""A finished rollout's detail as one compressed record: what the trace writer stores per rollout.

The writer stores three rows per rollout: its `sessions` row, its prompt token ids
(`codec.pack_token_ids`) and this record, every turn's detail in one zstd-compressed JSON
document. The detail tables (`turns`, `messages`, `llm_calls`, `env_steps`, `rewards`,
`streams`) are derived from the record when the DB is first read (`tracing.derive`), not while
the rollout's service runs: encoding one document costs a fraction of encoding and inserting
about eight rows per turn, and that CPU is taken from the cores that serve rollouts.

The record keeps what `rows.detail_rows` needs, as plain JSON values:

- ``decisions``: per decision ``turn``, ``observation`` (images stripped), ``tool_calls``,
  ``error``, ``error_detail``, ``env_ms``, ``call`` (the LLM call, or null) and ``result`` (the
  env's step, or null);
- a call's ``prompt`` is a list of indices into ``messages`` (a message object replayed in a
  later prompt, as an agent's history window is, is kept once), its ``params`` an index into
  ``params`` (the request without its messages and tools, secrets redacted: a rollout's
  requests mostly share them) and its ``tools`` an index into ``tools``;
- ``streams`` (token-in/token-out rollouts), ``total_reward`` and ``achievements``.
"""

from __future__ import annotations

from typing import Any

from grpo_service.tracing.codec import RECORD_CODEC, pack, redact, unpack
from grpo_service.tracing.traces import RolloutTrace, strip_images


class _PromptMessages:
    """A rollout's distinct prompt messages. A message is known by its identity (an agent's
    history window replays the same objects) or, for a plain text message (the system prompt and
    the observations, rebuilt each turn by most agents), by its role and text."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._by_id: dict[int, int] = {}  # the trace holds the messages: no id is reused meanwhile
        self._by_text: dict[tuple[str, str], int] = {}

    def indices(self, prompt: list[Any]) -> list[int]:
        by_id = self._by_id
        out = [by_id.get(id(message), -1) for message in prompt]  # most were in earlier prompts
        if -1 in out:
            for at, message in enumerate(prompt):
                if out[at] == -1:  # new, unless an earlier place in this prompt held it too
                    known = by_id.get(id(message))
                    out[at] = self._add(message) if known is None else known
        return out

    def _add(self, message: Any) -> int:
        values = self.values
        index = len(values)
        if type(message) is dict and len(message) == 2:
            role, content = message.get("role"), message.get("content")
            if type(role) is str and type(content) is str:
                index = self._by_text.setdefault((role, content), index)
        if index == len(values):
            values.append(message)
        self._by_id[id(message)] = index
        return index


def record_of(trace: RolloutTrace) -> dict[str, Any]:
    """The detail of ``trace`` as plain JSON values (the objects it holds are not copied)."""
    messages = _PromptMessages()
    params: list[dict[str, Any]] = []  # distinct consecutive requests' parameters, redacted
    tools: list[Any] = []  # distinct consecutive tool schemas
    last_raw: dict[str, Any] | None = None
    last_tools: Any = None
    decisions = []
    for d in trace.decisions:
        decision, call, result = d.decision, d.decision.llm_call, d.result
        call_record: dict[str, Any] | None = None
        if call is not None:
            request = call.request
            raw = {k: v for k, v in request.items() if k != "messages" and k != "tools"}
            if raw != last_raw:  # most turns send the same parameters: redacted once
                last_raw = raw
                params.append(redact(raw))
            if "tools" in request and request["tools"] is not last_tools:
                if request["tools"] != last_tools:  # the env's tool schemas, the same every turn
                    tools.append(request["tools"])
                last_tools = request["tools"]
            prompt = request.get("messages")
            call_record = {
                "model": call.model,
                "params": len(params) - 1,
                "tools": len(tools) - 1 if "tools" in request else None,
                "prompt": messages.indices(prompt) if isinstance(prompt, list) else None,
                "response": call.response,
                "finish_reason": call.finish_reason,
                "usage": call.usage,
                "latency_ms": call.latency_ms,
                "attempts": call.attempts,
                "error": call.error,
                "completion_token_ids": call.completion_token_ids,
                "completion_logprobs": call.completion_logprobs,
                "weights_version": call.weights_version,
            }
        observation = d.observation
        decisions.append(
            {
                "turn": d.turn,
                "observation": strip_images(observation) if isinstance(observation, dict) else None,
                "tool_calls": decision.tool_calls,
                "error": decision.error,
                "error_detail": decision.error_detail,
                "env_ms": d.env_ms,
                "call": call_record,
                "result": None
                if result is None
                else {
                    "reward": result.reward,
                    "done": result.done,
                    "truncated": result.truncated,
                    "step_idx": result.step_idx,
                    "info": result.info,
                },
            }
        )
    response = trace.response
    return {
        "decisions": decisions,
        "messages": messages.values,
        "tools": tools,
        "params": params,
        "streams": [
            {
                "episode": trajectory.episode,
                "idx": idx,
                "start_reason": stream.start_reason,
                "end_reason": stream.end_reason,
                "token_ids": stream.token_ids,
                "sampled": stream.sampled,
                "logprobs": stream.logprobs,
                "spans": [span.model_dump(mode="json") for span in stream.spans],
            }
            for trajectory in response.trajectories
            for idx, stream in enumerate(trajectory.streams)
        ],
        "total_reward": round(sum(response.metrics.episode_returns), 6),
        "achievements": list(response.metrics.achievements),
    }


def pack_record(record: dict[str, Any]) -> tuple[str, bytes]:
    """``record`` as (codec, data): the columns of its `rollout_records` row."""
    return RECORD_CODEC, pack(record)


def unpack_record(codec: str, data: bytes) -> dict[str, Any]:
    record = unpack(codec, data)
    if not isinstance(record, dict) or not isinstance(record.get("decisions"), list):
        raise ValueError("a rollout record is a JSON object with a list of decisions")
    return record
