#!/usr/bin/env bash
# Real training through the local launcher (`llmtrain run --nproc 4`, the real mpirun), on fortunes:
#  - one rank's process is SIGKILLed from outside mid-run (found among mpirun's children by its
#    OMPI_COMM_WORLD_RANK); the supervisor restarts the job from the newest complete checkpoint,
#    says so, and the job finishes with the same losses, step for step after the resume point, and
#    the same final loss as an uninterrupted 4-rank run (relative 1e-5); per-rank logs in
#    <log.dir>/logs/ mark the restart;
#  - SIGTERM to `llmtrain run` while the ranks are still starting up: they train one step,
#    checkpoint it and exit 75 (they used to die of the signal: the trainer's handler came late);
#  - user-visible failures with the training binary: an unwritable checkpoint.dir (before any step,
#    launched and in-process), a layout that does not match the world, missing data (refused
#    before any rank starts), a damaged dataset under launch.max_restarts (a user error in the
#    ranks: not restarted).
source "$(dirname "$0")/train_lib.sh"
prep_data
write_recipe r.yaml 300
RUN4=("$LLMTRAIN" run r.yaml --nproc 4)

# --- the uninterrupted 4-rank run ------------------------------------------------------------------
run_bounded reference "${RUN4[@]}" --set log.dir=ref
expect_status 0
expect_out "[rank 0] llmtrain run launch: 4 rank(s) = tp 1 × pp 1 × dp 4 = 4"
expect_out "[rank 0] done: 300 steps"
echo "reference done after $(elapsed)"

# --- SIGKILL of rank 1 mid-run: restart from the newest checkpoint, same losses ---------------------
RUN=$WORK/killed
start_job killed "${RUN4[@]}" --set log.dir="$RUN" --set launch.max_restarts=1  # bounded by finish_job
sup=$job_pid
wait_file "$RUN/ckpt/latest" 60
victim=$(rank_process "$sup" 1)
done_before=$(grep -c '"loss"' "$RUN/metrics.jsonl")
[[ -n $victim ]] && kill -KILL "$victim" && pass "killed: SIGKILL to rank 1 (pid $victim) after $done_before logged step(s)" ||
  fail "killed: no rank 1 among the children of mpirun under llmtrain $sup: $(ps -ef --forest | grep -A6 "$sup" | head -12)"
finish_job killed 120
expect_status 0
expect_out_re "\[launcher\] the job failed: exit 137 \(killed by signal 9, Killed\); restart 1 of 1 in 1.0s, resuming from $RUN/ckpt/step_[0-9]{8} \(checkpoint.resume=auto\)"
from=$(grep -oE "restart 1 of 1 in 1.0s, resuming from $RUN/ckpt/step_[0-9]{8}" <<<"$out" | grep -oE '[0-9]{8}$')
from=$((10#${from:-0}))
((from >= 20 && from < 300)) && pass "killed: restarted from the checkpoint of step $from" || fail "killed: restart step '$from'"
expect_out "[launcher] attempt 2 of 2, resuming from $(printf '%s/ckpt/step_%08d' "$RUN" "$from"): mpirun -np 4"
expect_out "--set checkpoint.resume=auto --set checkpoint.load_weights_only=false"
expect_out "[rank 0] resuming from $(printf '%s/ckpt/step_%08d' "$RUN" "$from") at step $from"
expect_out "[rank 0] done: 300 steps"
expect_out "[launcher] the job finished (exit 0)"
expect_count 1 "the job failed"
res=$(compare_losses "$RUN" ref 2>&1) && pass "killed: losses equal the uninterrupted run's at every step: $res" ||
  fail "killed: $res"
res=$(compare_losses "$RUN" ref $((from + 1)) 2>&1) && pass "killed: after the resume point: $res" || fail "killed: $res"
for r in 0 1 2 3; do
  f=$RUN/logs/rank_0000$r.log
  grep -q -- "--- .* attempt 2 of 2, resuming from $RUN/ckpt/step_" "$f" 2>/dev/null &&
    pass "killed: $f marks the restart" || fail "killed: $f: $(tail -5 "$f" 2>&1)"
done
grep -q "^done: 300 steps" "$RUN/logs/rank_00000.log" && pass "killed: rank 0's log holds its unprefixed lines" ||
  fail "killed: rank_00000.log: $(tail -5 "$RUN/logs/rank_00000.log")"
grep -q "restart 1 of 1" "$RUN/logs/launcher.log" && pass "killed: launcher.log records the restart" ||
  fail "killed: launcher.log: $(cat "$RUN/logs/launcher.log")"
echo "kill and restart done after $(elapsed)"

# --- SIGTERM while the ranks start up, before their first step: checkpoint and 75, not death --------
# (log.peak_tflops auto: each rank reads its CPU and measures its clock before training, a longer start-up.)
RUN=$WORK/early
start_job early "${RUN4[@]}" --set log.dir="$RUN" --set log.peak_tflops=auto
wait_ranks_listening "$job_pid" 4 60
[[ -e $RUN/metrics.jsonl ]] && fail "early: the first step was already done when the ranks were ready (too late to test)"
kill -TERM "$job_pid"
finish_job early 60
expect_status 75
expect_out "[rank 0] stop requested (signal): writing a checkpoint at step 1"
expect_out "[launcher] the job stopped: every rank wrote its checkpoint and exited 75"
[[ $(cat "$RUN/ckpt/latest" 2>/dev/null) == step_00000001 ]] && pass "early: the checkpoint of step 1 is the latest" ||
  fail "early: latest is $(cat "$RUN/ckpt/latest" 2>&1)"

# --- failures a user can act on, with the training binary --------------------------------------------
touch a-file
run_bounded ckpt-not-writable "${RUN4[@]}" --set log.dir=f1 --set checkpoint.dir=a-file/ckpt
expect_status 1
expect_out "error: checkpoint.dir $WORK/a-file/ckpt: cannot create it: Not a directory"
expect_out "hint: choose a folder this user can write (--set checkpoint.dir=PATH)"
expect_no "step 1/"

run_bounded ckpt-not-writable-1 "$LLMTRAIN" run r.yaml --set log.dir=f2 --set checkpoint.dir=a-file/ckpt
expect_status 1
expect_out "error: checkpoint.dir $WORK/a-file/ckpt: cannot create it: Not a directory"
expect_no "step 1/"

run_bounded world-vs-layout "${RUN4[@]}" --set log.dir=f3 --set parallel.dp=2
expect_status 2
expect_out "world size 4 (launch.nodes 1 × launch.procs_per_node 4) != tp 1 × pp 1 × dp 2 = 2"
expect_out "hint: make tp × pp × dp equal the number of ranks, or set parallel.dp: auto"

run_bounded batch-vs-world "$LLMTRAIN" run r.yaml --nproc 3 --set log.dir=f4
expect_status 2
expect_out_re "global_batch.*8.*(micro_batch 2|2).*(dp 3|3)"

# Missing data is refused before any rank starts, and nothing is created.
run_bounded missing-data "${RUN4[@]}" --set log.dir=f5 --set launch.max_restarts=2 --set data.train=nowhere/train
expect_status 2
expect_out "data.train: dataset $WORK/nowhere/train: $WORK/nowhere/train.bin and $WORK/nowhere/train.idx do not exist"
expect_no "\[rank [0-3]\]"
[[ ! -e f5 ]] && pass "missing-data: no run directory" || fail "missing-data: f5 created: $(find f5)"

# Data the ranks cannot read (a damaged index) is a user error inside the ranks: not restarted.
printf 'garbage' >bad.idx && : >bad.bin
run_bounded damaged-data "${RUN4[@]}" --set log.dir=f6 --set launch.max_restarts=2 --set data.train=bad
expect_status 2
expect_out_re "\[rank [0-3]\] error: $WORK/bad.idx: "
expect_out "the job stopped on a user error (exit 2): not restarted"
expect_no "attempt 2 of"

# --- a hung rank in real training: found and named, the job ended --------------------------------
# LLMTRAIN_FAULT=hang@3:2 stops rank 2 (SIGSTOP) after step 3; the others wait in step 4's first
# collective. launch.hang_timeout 10s ends the job naming rank 2 (silent: a stopped process
# reports nothing), each live rank writes its flight record; without restarts the job fails.
LLMTRAIN_FAULT=hang@3:2 run_bounded train-hang "${RUN4[@]}" --set log.dir=hang --set launch.hang_timeout=10s
[[ $status != 0 ]] && pass "train-hang: the job failed (exit $status)" || fail "train-hang: exit 0 after a hang"
expect_out_re "no progress for [0-9.]+s \(launch.hang_timeout 10.0s\): rank\(s\) 2 behind"
expect_out_re "rank 0: step 3, train, in [a-z_]+ #[0-9]+ on group '[a-z. ]+'"
expect_out_re "rank 2: silent for [0-9.]+s \(stopped or gone\); last report: step [0-3], "
expect_out "the job failed: it hung (no progress for launch.hang_timeout 10.0s"
[[ -s hang/flight/rank_00000000.txt ]] && pass "train-hang: rank 0's flight record written" ||
  fail "train-hang: no hang/flight/rank_00000000.txt: $(ls -R hang)"

echo "launcher_train_local took $(elapsed)"
finish
