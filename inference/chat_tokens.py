"""The served model's chat template and tokenizer, on the policy's side of a token stream.

A token-in/token-out rollout renders, itself, what the server would render for a chat request:
the first prompt, and the tokens between two completions (the environment's reply and the next
assistant header). `ChatTokens` does that for a local checkpoint directory (its tokenizer and
chat template, loaded with ``local_files_only``: never from a hub) or for the fake server's toy
tokenizer (``"toy"``).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any, Protocol

from inference import toy_tokenizer

TOY = "toy"
# Where an assistant turn's content goes in a render, to find what the template puts after it.
_MARK = "\u2063STREAM\u2063MARK\u2063"


class ChatTokens(Protocol):
    """What a token stream needs of the model's tokenizer."""

    turn_close: str
    """The text that closes an assistant turn (``<|im_end|>``): a completion that stopped on it
    holds it as its last token(s)."""

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def closes_turn(self, completion_ids: list[int]) -> bool:
        """Whether the completion ends with the end-of-turn token(s)."""
        ...


class HFChatTokens:
    """A checkpoint directory's tokenizer and chat template (what vLLM and serve-model render)."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.turn_close = "<|im_end|>"
        ends = {self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids(self.turn_close)}
        self._end_ids = {i for i in ends if isinstance(i, int) and i != self.tokenizer.unk_token_id}
        self._lock = threading.Lock()  # fast tokenizers are not safe across threads

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        with self._lock:
            return str(
                self.tokenizer.apply_chat_template(
                    messages,
                    tools=tools or None,
                    add_generation_prompt=add_generation_prompt,
                    tokenize=False,
                    **template_kwargs,
                )
            )

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def closes_turn(self, completion_ids: list[int]) -> bool:
        return bool(completion_ids) and completion_ids[-1] in self._end_ids


class ToyChatTokens:
    """The fake server's toy tokenizer and its ChatML-like rendering."""

    turn_close = "<|im_end|>"

    def __init__(self) -> None:
        self._close_ids = toy_tokenizer.encode(self.turn_close)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        return toy_tokenizer.render_chat(messages, tools, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return toy_tokenizer.encode(text)

    def closes_turn(self, completion_ids: list[int]) -> bool:
        n = len(self._close_ids)
        return completion_ids[-n:] == self._close_ids


@functools.lru_cache(maxsize=8)
def chat_tokens(spec: str) -> ChatTokens:
    """``"toy"``, or a local directory holding a tokenizer (a checkpoint made by ``init-model``,
    the directory vLLM or serve-model serves). ValueError when it is neither."""
    if spec == TOY:
        return ToyChatTokens()
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ValueError(f"tokenizer {spec!r} is neither 'toy' nor a local directory")
    try:
        return HFChatTokens(path)
    except ImportError:
        raise ValueError(
            f"tokenizer {spec!r}: a checkpoint's tokenizer needs transformers (grpo-service[train])"
        ) from None
    except Exception as exc:  # a directory without a usable tokenizer
        raise ValueError(f"cannot load a tokenizer from {spec!r}: {type(exc).__name__}: {exc}") from None


def between_text(
    tokens: ChatTokens,
    tail: list[dict[str, Any]],
    template_kwargs: dict[str, Any],
    closed: bool,
) -> str:
    """What the chat template puts after an assistant turn's content when ``tail`` (the
    environment's reply messages, the next user message) follows it, through the next assistant
    header: ``<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`` for Qwen3.
    Without the turn's close when the completion already ``closed`` it (its stop token)."""
    head = [{"role": "user", "content": "-"}, {"role": "assistant", "content": _MARK}]
    text = tokens.render(head + tail, None, add_generation_prompt=True, template_kwargs=template_kwargs)
    after = text[text.rindex(_MARK) + len(_MARK) :]
    if closed and after.startswith(tokens.turn_close):
        after = after[len(tokens.turn_close) :]
    return after


def reply_text(
    tokens: ChatTokens,
    message: dict[str, Any],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> str:
    """An assistant ``message`` as the text a model writes after the generation prompt, through its
    end-of-turn token: the chat template's rendering of the message as the last turn, after the
    prompt it answers (Qwen3's: ``<think>\\n\\n</think>\\n\\nAction: ...<|im_end|>``, the empty block
    the template gives the last turn). ValueError when the template renders the prompt differently
    once the reply follows."""
    head = [{"role": "user", "content": "-"}]
    prompt = tokens.render(head, tools, add_generation_prompt=True, template_kwargs=template_kwargs)
    full = tokens.render(
        [*head, message], tools, add_generation_prompt=False, template_kwargs=template_kwargs
    )
    end = full.rfind(tokens.turn_close)
    if not full.startswith(prompt) or end < len(prompt):
        raise ValueError("the chat template renders the prompt differently once a reply follows")
    return full[len(prompt) : end + len(tokens.turn_close)]
