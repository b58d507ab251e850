#!/usr/bin/env bash
# Asynchronous checkpoints (checkpoint.async) on the real binary, at one rank and at tp 2 × pp 2
# under `mpirun`: a run with async saves, stopped by a SIGTERM that arrives during a background
# write (LLMTRAIN_FAULT=term-in-save: the writer raises it and holds until the loop waits for it),
# exits 75 with both the checkpoint being written and the stop's checkpoint complete and intact
# (`ckpt inspect` verifies every checksum); resumed with the same command it ends bitwise where a
# run with synchronous saves ends: the same loss at every step (as text, every digit) and
# byte-identical shard files at every checkpoint both runs wrote. --dry-run's planned host
# snapshot is the size the run snapshots. A full disk under a background write is a warning and
# training goes on; a rank killed inside one leaves that step uncommitted.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
prep_fortunes

cat >r.yaml <<'YAML'
name: async
model: {family: llama, layers: 4, hidden: 32, heads: 4, kv_heads: 2, seq_len: 16}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 8, micro_batch: 2, global_batch: 4, seed: 7, threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}
checkpoint: {every: 2, keep: 10}
eval: {every: 0, batches: 1}
log: {every: 1}
YAML

# losses RUN: "step loss grad_norm" per training record of RUN/metrics.jsonl, as written (every digit).
losses() {
  python3 -c 'import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if "loss" in r: print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1/metrics.jsonl"
}

# same_shards A B STEP: every shard file of step STEP byte-identical in runs A and B.
same_shards() {
  local a=$1/ckpt/$(printf 'step_%08d' "$3") b=$2/ckpt/$(printf 'step_%08d' "$3") f n=0
  for f in "$a"/rank_*.safetensors; do
    cmp -s "$f" "$b/$(basename "$f")" || return 1
    n=$((n + 1))
  done
  [[ $n -gt 0 && $(ls "$b"/rank_*.safetensors | wc -l) == "$n" ]]
}

# check NAME NP [--set ...]: the sync run, the async run stopped during the background write of
# step 4, its resumption, and the comparisons.
check() {
  local name=$1 np=$2
  shift 2
  run_cmd "$name sync" mpi_run 180 "$np" "$LLMTRAIN" run r.yaml --set log.dir="$name-sync" "$@"
  expect_status 0
  run_cmd "$name async, SIGTERM during the write of step 4" env LLMTRAIN_FAULT=term-in-save@4:0 bash -c \
    "source '$SRC/tests/parallel/mpi_env.sh'; mpi_run 180 $np '$LLMTRAIN' run r.yaml --set log.dir=$name-async \
     --set checkpoint.async=true $*"
  expect_status 75
  expect_out "writing it in the background"
  expect_out_re "checkpoint .*step_00000004 written in .* behind training"
  local ck=$name-async/ckpt stop
  stop=$(cat "$ck/latest")
  # The stop comes at the first step boundary after the signal: 4 or 5, or 6 at the latest, where
  # the next save waits for this one (the writer raises SIGTERM before it holds).
  [[ -f $ck/step_00000004/manifest.json && $stop =~ ^step_0000000[456]$ && -f $ck/$stop/manifest.json ]] &&
    pass "$name: step 4 (written when SIGTERM came) committed; latest is the stop's $stop" ||
    fail "$name: $(ls "$ck") latest=$stop"
  for d in step_00000004 "$stop"; do
    run_cmd "$name: ckpt inspect $d" "$LLMTRAIN" ckpt inspect "$ck/$d"
    expect_status 0
  done
  ls -d "$ck"/*.partial >/dev/null 2>&1 && fail "$name: a .partial directory is left: $(ls "$ck")"
  run_cmd "$name async resumed" mpi_run 180 "$np" "$LLMTRAIN" run r.yaml --set log.dir="$name-async" \
    --set checkpoint.async=true "$@"
  expect_status 0
  expect_out "resuming from"
  local a b
  a=$(losses "$name-sync") b=$(losses "$name-async" | sort -n -u)
  [[ -n $a ]] || fail "$name: no losses in $name-sync/metrics.jsonl"
  [[ $(wc -l <<<"$a") == 8 && $a == "$b" ]] && pass "$name: async + SIGTERM + resume has every loss and gradient norm of sync, bitwise" ||
    fail "$name: losses differ:
sync:
$a
async:
$b"
  for s in 2 4 6 8; do
    [[ -d $name-async/ckpt/$(printf 'step_%08d' $s) ]] || continue
    same_shards "$name-sync" "$name-async" $s && pass "$name: step $s's shards are byte-identical to sync's" ||
      fail "$name: step $s's shards differ from sync's"
  done
}

check dp1 1

# A full disk under a background write (LLMTRAIN_FAULT=full-disk-in-save: the shard of step 4
# cannot be created, ENOSPC): a warning names the path and the error, `latest` keeps step 2 until
# step 6 commits, training goes on to the end (exit 0) on the synchronous run's losses, and no
# step 4 or `.partial` is left.
run_cmd "full disk async" env LLMTRAIN_FAULT=full-disk-in-save@4 "$LLMTRAIN" run r.yaml --set log.dir=full \
  --set checkpoint.async=true
expect_status 0
expect_out_re "warning: checkpoint .*/step_00000004.partial was not written: .*No space left on device"
expect_out "\`latest\` still names step_00000002; training goes on and the next save is tried"
[[ ! -e full/ckpt/step_00000004 && -f full/ckpt/step_00000006/manifest.json && $(cat full/ckpt/latest) == step_00000008 ]] &&
  ! ls -d full/ckpt/*.partial >/dev/null 2>&1 && pass "full disk async: step 4 skipped, 6 and 8 committed, nothing left" ||
  fail "full disk async: $(ls full/ckpt) latest=$(cat full/ckpt/latest)"
[[ $(losses dp1-sync) == "$(losses full)" ]] && pass "full disk async: every loss of sync, bitwise" ||
  fail "full disk async: losses differ from sync's"

# A rank killed inside a background write (LLMTRAIN_FAULT=kill-in-save: SIGKILL once the writer has
# written step 4's shard, before its fsync): step 4 is never committed, `latest` names step 2, and
# the next run resumes there and ends bitwise on the synchronous run's losses.
run_cmd "kill-in-save async" env LLMTRAIN_FAULT=kill-in-save@4 "$LLMTRAIN" run r.yaml --set log.dir=killed \
  --set checkpoint.async=true
[[ $status != 0 && $status != 124 ]] && pass "kill-in-save async: the run died (exit $status)" ||
  fail "kill-in-save async: exit $status
$out"
[[ ! -e killed/ckpt/step_00000004 && $(cat killed/ckpt/latest) == step_00000002 ]] &&
  pass "kill-in-save async: step 4 not committed, latest is step 2" ||
  fail "kill-in-save async: $(ls killed/ckpt) latest=$(cat killed/ckpt/latest)"
run_cmd "kill-in-save async resumed" "$LLMTRAIN" run r.yaml --set log.dir=killed --set checkpoint.async=true
expect_status 0
expect_out "at step 2"
a=$(losses dp1-sync) b=$(losses killed | sort -n -u)
[[ $a == "$b" ]] && pass "killed in a background write, resumed: every loss of sync, bitwise" ||
  fail "killed in a background write, resumed: losses differ:
$a
--
$b"
# The planned host snapshot (rank 0: stage 0, tp rank 0) is what the run copied.
run_cmd dry-run "$LLMTRAIN" run r.yaml --dry-run --set checkpoint.async=true
expect_status 0
planned=$(grep -o 'checkpoint snapshot [0-9.]* [KMG]*i*B' <<<"$out" | head -1 | sed 's/checkpoint snapshot //')
taken=$(grep -o 'snapshot of [0-9.]* [KMG]*i*B' dp1-async/train.log | head -1 | sed 's/snapshot of //')
[[ -n $planned && $planned == "$taken" ]] && pass "dry-run plans the snapshot the run took ($planned)" ||
  fail "dry-run plans '$planned', the run took '$taken'"

check tp2-pp2 4 --set parallel.tp=2 --set parallel.pp=2

finish
