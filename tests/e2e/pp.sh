#!/usr/bin/env bash
# Pipeline parallelism under real `mpirun` (the executor's non-blocking sends and receives between
# stages, the tied embedding's gradient exchange between the first and the last stage, the loss
# broadcast from the last stage, pipelined evaluation): GPT-2 (tied embeddings) with 8 layers on
# fortunes at pp 2 and pp 4 with gpipe, 1f1b, interleaved (two virtual chunks per stage) and
# zero_bubble (ZB-H1; both also at tp 2 × pp 2 × dp 2), with sequence parallelism (1f1b at
# tp 2 × pp 2 × dp 2, interleaved and zero_bubble at tp 2 × pp 2), pp 4
# split unevenly (parallel.pp_layers 1, 3, 3, 1), and tp 2 × pp 2 × dp 2 = 8 ranks, trains to the
# losses (relative difference ≤ 1e-5 per step over 20 steps), the validation losses and the final
# parameters (gathered from the checkpoint's slices, ‖a − b‖ / ‖b‖ ≤ 1e-5) of pp 1; a checkpoint
# written at pp 4 (1f1b, and interleaved) resumes at pp 1 and one written at pp 1 resumes at pp 4
# on the same trajectory; the memory plan of stage 0 is what it measures; --dry-run draws the
# uneven split's and the interleaved schedule's timelines.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: pp
model: {family: gpt2, layers: 8, hidden: 32, heads: 2, seq_len: 32}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 20, micro_batch: 2, global_batch: 8, seed: 7, threads: 1, grad_clip: 1.0}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 5}
checkpoint: {every: 10, keep: 5}
eval: {every: 10, batches: 1}
log: {every: 1}
YAML

# compare A B [FIRST]: losses and validation losses per step within 1e-5 (relative) from step
# FIRST, and the final parameters (assembled from the checkpoints' slices) within ||a-b||/||b|| <= 1e-5.
compare() {
  $PY "$SRC/tests/e2e/compare_runs.py" "$1" "$2" --first "${3:-1}" --val
}

run_cmd pp1 mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=pp1
expect_status 0
# tp × pp × dp, the schedule, an uneven split (parallel.pp_layers) or - for the even one, and "sp"
# for sequence parallelism (each stage then sends its tp rank's 1/tp of the token rows).
for cfg in "1 2 1 gpipe -" "1 2 1 1f1b -" "1 4 1 gpipe -" "1 4 1 1f1b -" "2 2 2 1f1b -" "1 4 1 1f1b 1,3,3,1" \
  "1 2 1 interleaved -" "1 4 1 interleaved -" "1 2 1 zero_bubble -" "1 4 1 zero_bubble -" \
  "2 2 2 interleaved -" "2 2 2 zero_bubble -" "2 2 2 1f1b - sp" "2 2 1 interleaved - sp" "2 2 1 zero_bubble - sp"; do
  set -- $cfg
  name=tp$1-pp$2-dp$3-$4$([[ $5 != - ]] && echo "-layers${5//,/-}")$([[ ${6:-} == sp ]] && echo "-sp")
  split=()
  [[ $5 != - ]] && split=(--set "parallel.pp_layers=[$5]")
  [[ $4 == interleaved ]] && split+=(--set parallel.virtual_stages=2)
  [[ ${6:-} == sp ]] && split+=(--set parallel.sequence_parallel=true)
  run_cmd $name mpi_run 180 $(($1 * $2 * $3)) "$LLMTRAIN" run r.yaml --set log.dir=$name --set parallel.tp=$1 \
    --set parallel.pp=$2 --set parallel.pp_schedule=$4 "${split[@]}"
  expect_status 0
  expect_out "[rank 0] done: 20 steps"
  expect_out_re "pipeline idle time per stage \(measured\): stage 0 [0-9.]+%, stage 1 [0-9.]+%.*; mean [0-9.]+%, the $4 schedule's bubble [0-9.]+%; at the measured op times [0-9.]+%"
  plan=$(grep -o 'memory per rank: .*' <<<"$out" | sed 's/memory per rank: //')
  measured=$(grep -o 'measured after the first step: .*' <<<"$out" | sed 's/.*first step: //')
  [[ -n $plan && $plan == "$measured" ]] && pass "$name: measured memory is the plan ($plan)" ||
    fail "$name: plan '$plan', measured '$measured'"
  out=$(compare $name pp1 2>&1) && pass "$name matches pp 1: $out" || fail "$name differs from pp 1: $out"
done

# A checkpoint written at pp 4 resumes at pp 1 and continues pp 4's trajectory.
mkdir -p resume1/ckpt
cp -r tp1-pp4-dp1-1f1b/ckpt/step_00000010 resume1/ckpt/
echo step_00000010 >resume1/ckpt/latest
cp tp1-pp4-dp1-1f1b/metrics.jsonl resume1/
run_cmd resume-pp1 mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=resume1
expect_status 0
expect_out "at step 10"
out=$(compare resume1 tp1-pp4-dp1-1f1b 11 2>&1) && pass "pp 4 checkpoint resumed at pp 1: $out" ||
  fail "pp 4 checkpoint resumed at pp 1 diverges: $out"
# A checkpoint written by the interleaved schedule at pp 4 (blocks 0, 4 on stage 0, ...) resumes at
# pp 1 on its trajectory.
mkdir -p resume1i/ckpt
cp -r tp1-pp4-dp1-interleaved/ckpt/step_00000010 resume1i/ckpt/
echo step_00000010 >resume1i/ckpt/latest
cp tp1-pp4-dp1-interleaved/metrics.jsonl resume1i/
run_cmd resume-pp1-interleaved mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=resume1i
expect_status 0
expect_out "at step 10"
out=$(compare resume1i tp1-pp4-dp1-interleaved 11 2>&1) && pass "interleaved pp 4 checkpoint resumed at pp 1: $out" ||
  fail "interleaved pp 4 checkpoint resumed at pp 1 diverges: $out"
# And one written at pp 1 resumes at pp 4, on pp 1's trajectory.
mkdir -p resume4/ckpt
cp -r pp1/ckpt/step_00000010 resume4/ckpt/
echo step_00000010 >resume4/ckpt/latest
cp pp1/metrics.jsonl resume4/
run_cmd resume-pp4 mpi_run 180 4 "$LLMTRAIN" run r.yaml --set log.dir=resume4 --set parallel.pp=4
expect_status 0
expect_out "at step 10"
out=$(compare resume4 pp1 11 2>&1) && pass "pp 1 checkpoint resumed at pp 4: $out" ||
  fail "pp 1 checkpoint resumed at pp 4 diverges: $out"

# --dry-run: the blocks per stage, the activations each keeps, the timeline and the bubble.
run_cmd dry "$LLMTRAIN" run r.yaml --dry-run --nproc 4 --set parallel.pp=4 --set "parallel.pp_layers=[1,3,3,1]"
expect_status 0
expect_out "pipeline: 1f1b, 4 stages holding 1, 3, 3, 1 blocks, 4 micro-batches per step; micro-batches whose activations each stage keeps: 4, 3, 2, 1"
expect_out "stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .  ."
expect_out "pipeline bubble: 42.9% of the step's stage-time idle"
expect_out "pp_layers: [1, 3, 3, 1]"
run_cmd dry-interleaved "$LLMTRAIN" run r.yaml --dry-run --nproc 2 --set parallel.pp=2 \
  --set parallel.pp_schedule=interleaved --set parallel.virtual_stages=2
expect_status 0
expect_out "pipeline: interleaved, 2 stages holding 2×2, 2×2 blocks, 4 micro-batches per step"
expect_out_re "pipeline bubble: [0-9.]+% of the step's stage-time idle; \(p − 1\)/\(v·m \+ p − 1\) = 11.1% with p 2, v 2, m 4"
run_cmd dry-zb "$LLMTRAIN" run r.yaml --dry-run --nproc 2 --set parallel.pp=2 --set parallel.pp_schedule=zero_bubble
expect_status 0
expect_out "stage 1 | .  F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3"
expect_out_re "pipeline bubble: 7.7% of the step's stage-time idle = \(p − 1\)/\(3m \+ p − 1\) with p 2, m 4"
run_cmd zb-recompute-refused "$LLMTRAIN" run r.yaml --dry-run --nproc 2 --set parallel.pp=2 \
  --set parallel.pp_schedule=zero_bubble --set train.activation_checkpointing=full
expect_out "not supported yet: parallel.pp_schedule: zero_bubble with train.activation_checkpointing: full"
run_cmd bad-split "$LLMTRAIN" run r.yaml --dry-run --nproc 4 --set parallel.pp=4 --set "parallel.pp_layers=[1,3,3]"
expect_status 2
expect_out "3 block counts for pp 4"

finish
