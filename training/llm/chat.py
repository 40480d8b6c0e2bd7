"""The chat format of models made here: Qwen3's own chat template.

``templates/qwen3.jinja`` is the chat template the Qwen3 model family ships (Qwen/Qwen3-0.6B's
``tokenizer_config.json``), byte for byte as TRL stores it (``trl/chat_templates/qwen3.jinja``):
TRL recognises a tokenizer by the exact text of its template, and vLLM, TRL and the service then
render the same prompts for a checkpoint made here as for a real Qwen3. Do not edit it.

Its conventions: ChatML turns; a tool call written by the model as
``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`` (Hermes, what vLLM's ``hermes``
tool-call parser reads); tool results in a user turn wrapped in ``<tool_response>``; reasoning in
``<think>...</think>`` at the start of an assistant turn, which the template drops from turns
before the last user query (``enable_thinking=False`` pre-fills an empty block). A model may emit
the block or not: `inference.reasoning.split_reasoning` reads both, as vLLM's ``qwen3`` reasoning parser does.
"""

from __future__ import annotations

from importlib import resources

from inference.reasoning import THINK_CLOSE, THINK_OPEN
from inference.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
# Single tokens that are not special (decoded as text, as in Qwen3's tokenizer).
FORMAT_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)
FORMAT_TOKENS += (THINK_OPEN, THINK_CLOSE)

CHAT_TEMPLATE = resources.files("training.llm").joinpath("templates/qwen3.jinja").read_text(encoding="utf-8")
