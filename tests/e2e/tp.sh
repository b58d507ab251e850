#!/usr/bin/env bash
# Tensor parallelism under real `mpirun` (MpiComm's all-reduces in the model, the vocab-parallel
# loss, the checkpointer writing shards): GPT-2 on fortunes at tp 2, tp 4 and tp 2 × dp 2, with and
# without sequence parallelism (MpiComm's reduce-scatters and all-gathers), and tp 2 × dp 2 × ZeRO 3 with it, trains to
# the losses (relative difference ≤ 1e-5 per step over 20 steps) and the parameters (gathered from
# the checkpoint's shards, ‖a − b‖ / ‖b‖ ≤ 1e-5, every parameter) of tp 1; a checkpoint written at
# tp 4 resumes at tp 1 and one written at tp 1 resumes at tp 4 on the same trajectory; LLaMA with kv_heads 2 at tp 4 (replicated key/value
# heads), with and without sequence parallelism, matches tp 1; --dry-run reports the head's logits at 1/tp.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: tp
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 64}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 20, micro_batch: 2, global_batch: 8, seed: 7, threads: 1, grad_clip: 1.0}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 5}
checkpoint: {every: 10, keep: 5}
eval: {every: 10, batches: 1}
log: {every: 1}
YAML

# compare A B [FIRST]: losses per step within 1e-5 (relative) from step FIRST, and the final
# parameters (assembled from the checkpoints' slices) within ||a-b||/||b|| <= 1e-5.
compare() {
  $PY "$SRC/tests/e2e/compare_runs.py" "$1" "$2" --first "${3:-1}"
}

run_cmd tp1 mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=tp1
expect_status 0
# tp x dp x zero: the last case shards parameters, gradients and optimizer state over dp (ZeRO 3)
# on top of tensor and sequence parallelism.
for cfg in "2 1 false 0" "4 1 false 0" "2 2 false 0" "2 1 true 0" "4 1 true 0" "2 2 true 0" "2 2 true 3"; do
  set -- $cfg
  name=tp$1-dp$2$([[ $3 == true ]] && echo -sp)$([[ $4 != 0 ]] && echo -zero$4)
  run_cmd $name mpi_run 180 $(($1 * $2)) "$LLMTRAIN" run r.yaml --set log.dir=$name --set parallel.tp=$1 \
    --set parallel.sequence_parallel=$3 --set parallel.zero=$4
  expect_status 0
  expect_out "[rank 0] done: 20 steps"
  plan=$(grep -o 'memory per rank: .*' <<<"$out" | sed 's/memory per rank: //')
  measured=$(grep -o 'measured after the first step: .*' <<<"$out" | sed 's/.*first step: //')
  [[ -n $plan && $plan == "$measured" ]] && pass "$name: measured memory is the plan ($plan)" ||
    fail "$name: plan '$plan', measured '$measured'"
  out=$(compare $name tp1 2>&1) && pass "$name matches tp 1: $out" || fail "$name differs from tp 1: $out"
done

# A checkpoint written at tp 4 resumes at tp 1 and continues tp 4's trajectory.
mkdir -p resume1/ckpt
cp -r tp4-dp1/ckpt/step_00000010 resume1/ckpt/
echo step_00000010 >resume1/ckpt/latest
cp tp4-dp1/metrics.jsonl resume1/
run_cmd resume-tp1 mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=resume1
expect_status 0
expect_out "at step 10"
out=$(compare resume1 tp4-dp1 11 2>&1) && pass "tp 4 checkpoint resumed at tp 1: $out" ||
  fail "tp 4 checkpoint resumed at tp 1 diverges: $out"
# And one written at tp 1 resumes at tp 4 with sequence parallelism, on tp 1's trajectory.
mkdir -p resume4/ckpt
cp -r tp1/ckpt/step_00000010 resume4/ckpt/
echo step_00000010 >resume4/ckpt/latest
cp tp1/metrics.jsonl resume4/
run_cmd resume-tp4 mpi_run 180 4 "$LLMTRAIN" run r.yaml --set log.dir=resume4 --set parallel.tp=4 \
  --set parallel.sequence_parallel=true
expect_status 0
expect_out "at step 10"
out=$(compare resume4 tp1 11 2>&1) && pass "tp 1 checkpoint resumed at tp 4 (sequence parallel): $out" ||
  fail "tp 1 checkpoint resumed at tp 4 diverges: $out"

# LLaMA with kv_heads 2 at tp 4: each key/value head replicated on two ranks, their gradients reduced.
for cfg in "1 false" "4 false" "4 true"; do
  set -- $cfg
  run_cmd llama-tp$1-$2 mpi_run 180 $1 "$LLMTRAIN" run r.yaml --set log.dir=llama-tp$1-$2 --set parallel.tp=$1 \
    --set model.family=llama --set model.kv_heads=2 --set parallel.sequence_parallel=$2
  expect_status 0
done
for sp in false true; do
  out=$(compare llama-tp4-$sp llama-tp1-false 2>&1) && pass "llama kv_heads 2 at tp 4 (sequence_parallel $sp) matches tp 1: $out" ||
    fail "llama kv_heads 2 at tp 4 (sequence_parallel $sp) differs from tp 1: $out"
done

# The head's activations: its logits at tp 4 are a quarter of tp 1's, as --dry-run reports them.
head1=$("$LLMTRAIN" run r.yaml --dry-run 2>&1 | grep -o 'head activations per rank: .*')
head4=$("$LLMTRAIN" run r.yaml --dry-run --nproc 4 --set parallel.tp=4 2>&1 | grep -o 'head activations per rank: .*')
[[ $head1 == *"[128 tokens, 384 vocabulary columns] = 192.0 KiB"* && $head4 == *"[128 tokens, 96 vocabulary columns] = 48.0 KiB"* ]] &&
  pass "--dry-run: head logits 192.0 KiB at tp 1, 48.0 KiB at tp 4" || fail "--dry-run head lines: '$head1' / '$head4'"

finish
