#!/usr/bin/env bash
# PyTorch parity of one model configuration: runs our side (parity_driver, flags after the
# build/source dirs) and the float64 reference (scripts/reference/parity.py) on the same weights
# and batches, and fails when logits, loss, gradients, training losses or final weights differ
# beyond the tolerances documented in parity.py.
#   parity.sh BUILD_DIR SOURCE_DIR --family gpt2 --layers 2 ...
set -euo pipefail
build=$1 src=$2
shift 2
python=$src/.venv/bin/python
[[ -x $python ]] || { echo "missing $python: run scripts/setup.sh"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-parity.XXXXXX")
trap 'rm -rf "$work"' EXIT
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$build/tests/parity_driver" --out "$work" "$@"
cd "$src/scripts/reference"
"$python" parity.py "$work"
