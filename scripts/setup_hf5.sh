#!/usr/bin/env bash
# transformers 5 for the llama family's tests (tests/e2e/hf_families.sh: Llama 3.1, Qwen2, Qwen3 and
# Mistral as transformers 5 writes them), in its own venv .venv-hf5: it needs PyTorch 2, from PyPI
# with its CUDA libraries (about 5 GB; 2 min 20 s to install on the development machine). Called by
# scripts/setup.sh; scripts/test.sh runs it in the background while the build runs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-hf5
if [[ ! -x $venv/bin/python ]]; then
  echo "setup: creating Python venv $venv (transformers 5.24.0, PyTorch 2.15.0 from PyPI)"
  /usr/bin/python3 -m venv "$venv"
fi
if "$venv/bin/python" -c "import torch, safetensors, transformers; assert transformers.__version__ == '5.24.0'" 2>/dev/null; then
  echo "setup: transformers 5.24.0 already installed in $venv"
  exit 0
fi
echo "setup: installing from PyPI into $venv: torch==2.15.0 transformers==5.24.0 safetensors"
"$venv/bin/pip" install -q --disable-pip-version-check "torch==2.15.0" "transformers==5.24.0" safetensors
