#!/usr/bin/env bash
# README's first command: on a fresh Debian 12 machine, installs what is missing, builds llmtrain,
# prepares Debian's English fortunes as a byte-level dataset, trains recipes/tiny.yaml on the CPU
# (about a minute on 2 cores; the whole demo about 3½ minutes), shows the validation loss going down, samples text from the trained
# model, and draws the loss curves into runs/tiny/loss.png.
#
#   scripts/demo.sh                  the whole demo
#   scripts/demo.sh --set k=v ...    recipe overrides for the training run (e.g. --set train.steps=100)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

scripts/setup.sh --minimal
build=${LLMTRAIN_BUILD_DIR:-build}
echo "demo: building llmtrain in $build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target llmtrain
llmtrain=$root/$build/llmtrain

# The English fortunes (one fortune per document, separated by lines of "%").
mapfile -t corpus < <(dpkg -L fortunes-min fortunes | grep -E '^/usr/share/games/fortunes/[a-z-]+$')
echo "demo: preparing ${#corpus[@]} files of Debian's fortunes"
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/fortunes/ --valid-fraction 0.05

# A fresh run each time the demo is started.
rm -rf runs/tiny
"$llmtrain" run recipes/tiny.yaml "$@"

echo
echo "demo: validation loss (nats per byte) during training:"
sed -n 's/.*"step":\([0-9]*\).*"val_loss":\([0-9.e+-]*\).*/\1 \2/p' runs/tiny/metrics.jsonl |
  while read -r step loss; do printf '  step %5d: %.3f\n' "$step" "$loss"; done
echo
echo "demo: a sample from the trained model:"
"$llmtrain" generate runs/tiny/ckpt --prompt "The meaning of life is" --max-tokens 100 --temperature 0.8 --top-k 40 --seed 1
echo
echo
"$llmtrain" plot runs/tiny -o runs/tiny/loss.png
echo "demo: the training and validation loss curves are in $root/runs/tiny/loss.png"
