#!/usr/bin/env bash
# `llmtrain run --set log.tensorboard=true` end to end: a few short steps of recipes/tiny.yaml write
# <log.dir>/tensorboard/events.out.tfevents.*, and TensorBoard's own reader
# (tests/trainer/report/tensorboard_oracle.py with .venv/bin/python) finds every logged step's train/*
# scalars and every evaluation's val/* equal to metrics.jsonl's, to float precision. A run killed
# after its checkpoint and resumed adds a second file, and TensorBoard then shows each step once.
source "$(dirname "$0")/lib.sh"
ORACLE="$SRC/.venv/bin/python $SRC/tests/trainer/report/tensorboard_oracle.py"

"$LLMTRAIN" prep --input /usr/share/games/fortunes/fortunes --separator % --tokenizer byte --output data/ \
  --valid-fraction 0.05 >/dev/null 2>&1 || { echo "FAIL: prep"; exit 1; }
# tiny.yaml, shortened to seconds: 6 steps of 2 sequences × 32 tokens, logged every 2 steps,
# evaluated and checkpointed every 3; one thread (OpenMP threads on a busy machine only slow it down).
short=(--set data.train=data/train --set data.valid=data/valid --set model.seq_len=32 --set train.micro_batch=2
  --set train.global_batch=2 --set optimizer.warmup=1 --set eval.batches=1 --set log.peak_tflops=1 --set train.threads=1)
run() {
  "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set log.dir="$1" --set log.tensorboard=true "${short[@]}" \
    --set train.steps=6 --set log.every=2 --set eval.every=3 --set checkpoint.every=3 "${@:2}"
}

# 1. A whole run: one events file that TensorBoard reads as metrics.jsonl says.
run_cmd tensorboard run A
expect_status 0
[[ $(ls A/tensorboard | grep -c '^events\.out\.tfevents\.') == 1 ]] && pass "one events file in A/tensorboard" ||
  fail "A/tensorboard holds: $(ls A/tensorboard 2>&1)"
check=$($ORACLE run A 1 2>&1) && pass "TensorBoard reads A: $check" || fail "TensorBoard's reader on A: $check"

# 2. Killed after step 5 (checkpoint at 3; step 4 already logged), then resumed: a second file,
#    and TensorBoard shows steps 2, 4, 6 once each with metrics.jsonl's values.
export LLMTRAIN_FAULT=kill@5
run_cmd killed run B
unset LLMTRAIN_FAULT
expect_status 137
run_cmd resumed run B
expect_status 0
expect_out "at step 3"
check=$($ORACLE run B 2 2>&1) && pass "TensorBoard reads the resumed run: $check" || fail "TensorBoard's reader on B: $check"

# 3. Off by default: no tensorboard directory.
run_cmd default "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set log.dir=C "${short[@]}" --set train.steps=1
expect_status 0
[[ ! -e C/tensorboard ]] && pass "no tensorboard directory without log.tensorboard" || fail "C/tensorboard exists"

finish
