#!/usr/bin/env bash
# Data parallelism under real `mpirun`: dp = 1, 2, 4 train to the same losses and parameters; a
# checkpoint written at dp = 4 resumes at dp = 2 and dp = 1 on the same trajectory; and a rank that
# is killed, crashes, exits, throws or stops responding ends the whole job promptly, named; a rank
# killed in the middle of a checkpoint save leaves the previous checkpoint to resume from.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: dp
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 64}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 20, micro_batch: 2, global_batch: 8, seed: 7, threads: 1}
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

for n in 1 2 4; do
  run_cmd "dp$n" mpi_run 180 $n "$LLMTRAIN" run r.yaml --set log.dir=dp$n
  expect_status 0
done
expect_out "[rank 0] done: 20 steps"
for n in 2 4; do
  out=$(compare dp$n dp1 2>&1) && pass "dp=$n matches dp=1: $out" || fail "dp=$n differs from dp=1: $out"
done

# A checkpoint written at dp = 4 resumes at dp = 2 and dp = 1 and continues dp = 4's trajectory.
for n in 2 1; do
  mkdir -p resume$n/ckpt
  cp -r dp4/ckpt/step_00000010 resume$n/ckpt/
  echo step_00000010 >resume$n/ckpt/latest
  cp dp4/metrics.jsonl resume$n/
  run_cmd "resume-dp$n" mpi_run 180 $n "$LLMTRAIN" run r.yaml --set log.dir=resume$n
  expect_status 0
  expect_out "at step 10"
  out=$(compare resume$n dp4 11 2>&1) && pass "dp=4 checkpoint resumed at dp=$n: $out" ||
    fail "dp=4 checkpoint resumed at dp=$n diverges: $out"
done

# A rank that computes 10× as long as the others (LLMTRAIN_FAULT=slow, from step 3 on rank 1) is named
# as the straggler; its compute time excludes waits for the others, which make every wall time equal.
run_cmd straggler env LLMTRAIN_FAULT=slow@3:1 bash -c "source '$SRC/tests/parallel/mpi_env.sh'; mpi_run 120 2 '$LLMTRAIN' \
  run r.yaml --set log.dir=straggler --set checkpoint.resume=none --set train.steps=6 --set log.every=2"
expect_status 0
expect_out "rank 1 is a straggler"
out=$($PY - straggler/metrics.jsonl <<'PY' 2>&1
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
by = {r["step"]: r for r in recs}
for s in (4, 6):
    assert by[s].get("stragglers") == [1], by[s]
    assert by[s]["slowest_vs_median"] > 1.5, by[s]
for r in recs:
    for k in ("t_data_ms", "t_forward_ms", "t_backward_ms", "t_grad_sync_ms", "t_optimizer_ms"):
        assert r[k] >= 0, (k, r)
    assert r["t_forward_ms"] > 0 and r["t_backward_ms"] > 0, r
print("stragglers at steps 4 and 6: [1]")
PY
) && pass "straggler: $out" || fail "straggler: $out"

# Failures end the whole job, within 30 s, naming the rank and the cause.
fault() {  # NAME FAULT EXPECTED-TEXT [extra run args]
  local name=$1 spec=$2 text=$3
  shift 3
  local t0=$SECONDS
  run_cmd "$name" env LLMTRAIN_FAULT=$spec bash -c "source '$SRC/tests/parallel/mpi_env.sh'; mpi_run 60 3 '$LLMTRAIN' run r.yaml \
    --set log.dir=f-$name --set checkpoint.resume=none --set train.global_batch=6 $*"
  local took=$((SECONDS - t0))
  [[ $status != 0 && $status != 124 ]] && pass "$name: job failed (exit $status)" || fail "$name: exit $status
$out"
  ((took <= 30)) && pass "$name: ended in ${took}s" || fail "$name: took ${took}s"
  expect_out_re "$text"
}
fault killed kill@3:1 "rank 1.*(signal 9|Killed)"
fault segfault segv@3:1 "rank 1.*(Segmentation fault|signal 11|SIGSEGV)"
fault exited exit@3:1 "rank 1.*(exit|3)"
fault threw throw@3:1 "\[rank 1\] .*injected fault"
fault hung hang@3:1 "timed out after 3.0s waiting for .* on group" --set parallel.timeout=3s

# A rank killed in the middle of a checkpoint save under mpirun (rank 0 has written its shard of
# step 20, not yet fsynced it): the job fails, step 20 never commits, `latest` still names step 10,
# and the next run resumes there and continues on the uninterrupted dp = 2 run's losses.
run_cmd kill-in-save env LLMTRAIN_FAULT=kill-in-save@20:0 bash -c "source '$SRC/tests/parallel/mpi_env.sh'; \
  mpi_run 120 2 '$LLMTRAIN' run r.yaml --set log.dir=mid-save"
[[ $status != 0 && $status != 124 ]] && pass "kill-in-save: the job failed (exit $status)" ||
  fail "kill-in-save: exit $status
$out"
[[ ! -e mid-save/ckpt/step_00000020 && $(cat mid-save/ckpt/latest) == step_00000010 ]] &&
  pass "kill-in-save: step 20 not committed, latest is step 10" ||
  fail "kill-in-save: $(ls mid-save/ckpt) latest=$(cat mid-save/ckpt/latest)"
run_cmd resume-mid-save mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=mid-save
expect_status 0
expect_out "at step 10"
out=$(compare mid-save dp2 11 2>&1) && pass "killed mid-save, resumed: $out" || fail "killed mid-save, resumed: $out"

finish
