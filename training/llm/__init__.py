"""Causal-LM training on the task app's data: a small model made here (or any local checkpoint),
a CPU model server in vLLM's shape, SFT on exported traces and GRPO against the task app.

Nothing here loads anything from a hub: every ``from_pretrained`` is a local directory and the
modules set ``HF_HUB_OFFLINE=1`` before transformers is imported.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
