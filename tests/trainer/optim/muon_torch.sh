#!/usr/bin/env bash
# Muon against PyTorch 2's torch.optim.Muon (tests/trainer/optim/muon_torch.py, in .venv-hf5):
#   muon_torch.sh BUILD_DIR SOURCE_DIR [DEVICE]
set -euo pipefail
build=$1 src=$2 device=${3:-cpu}
python=$src/.venv-hf5/bin/python
"$python" -c "import torch.optim; torch.optim.Muon" 2>/dev/null ||
  { echo "FAIL: $python with torch.optim.Muon (PyTorch 2) is missing: run scripts/setup.sh"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-muon.XXXXXX")
trap 'rm -rf "$work"' EXIT
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$python" "$src/tests/trainer/optim/muon_torch.py" "$build/tests/muon_driver" \
  "$work" "$device"
