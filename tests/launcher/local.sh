#!/usr/bin/env bash
# `llmtrain run` on this host through the real mpirun, with tests/launcher/launch_job as the ranks'
# program (`run RECIPE -- PROGRAM`): a 4-rank job with rank-tagged output and per-rank logs; a rank
# SIGKILLed mid-run and the job restarted from its newest checkpoint; SIGTERM to `llmtrain run`
# reaching every rank, which checkpoint and exit 75 (no restart); Ctrl-C twice; a rank that ignores
# the stop; a user error and crashes (restarts used up); pre-flight failures.
source "$(dirname "$0")/lib.sh"
RUN=$WORK/run
CKPT=$RUN/ckpt
RUN_JOB=("$LLMTRAIN" run "$RECIPE" --set log.dir="$RUN")  # an array, not a function: start_job's $! must be llmtrain
reset_run() { rm -rf "$RUN"; }

# --- a 4-rank job: tagged output, per-rank logs, settings -------------------------------------
# Scratch of a launcher that was killed (its owner provably dead: this host and boot, its pid gone)
# is removed by the next launch; a live owner's is left alone.
boot=$(cat /proc/sys/kernel/random/boot_id)
sh -c 'exit 0' &
dead=$!
wait $dead
self_stat=$(cat /proc/$$/stat)
self_start=$(awk '{ print $20 }' <<<"${self_stat##*) }")
stale=/dev/shm/llmtrain-launch.stale$$ live=/dev/shm/llmtrain-launch.live$$
mkdir -p "$stale" "$live"
echo "$(hostname) $boot $dead 12345" >"$stale/owner"
echo "$(hostname) $boot $$ $self_start" >"$live/owner"
start_job ok-4 "${RUN_JOB[@]}" --nproc 4 -- "$JOB" --steps 3 --ckpt-dir "$CKPT"
launcher_pid=$job_pid
finish_job ok-4 90
expect_status 0
[[ ! -e $stale ]] && pass "ok-4: a dead launcher's scratch was removed" || fail "ok-4: $stale is still there"
[[ -f $live/owner ]] && pass "ok-4: a live launcher's scratch was left alone" || fail "ok-4: $live was removed"
rm -rf "$stale" "$live"
for r in 0 1 2 3; do expect_out "[rank $r] rank $r of 4: local $r of 4"; done
expect_out "[rank 0] finished 3 steps"
threads=$(($(nproc) / 4)); ((threads < 1)) && threads=1
expect_count 4 "parent mpirun, OMP_NUM_THREADS=$threads, restart 0, sets: none"
expect_out "[launcher] attempt 1 of 1: mpirun -np 4"
expect_out "--tag-output"
expect_out "[launcher] the job finished (exit 0)"
for r in 0 1 2 3; do
  f=$RUN/logs/rank_0000$r.log
  grep -q "^rank $r of 4" "$f" && grep -q "^finished 3 steps" "$f" && pass "ok-4: $f holds rank $r's lines, unprefixed" ||
    fail "ok-4: $f: $(cat "$f" 2>&1)"
done
grep -q "mpirun -np 4" "$RUN/logs/launcher.log" && grep -q "the job finished" "$RUN/logs/launcher.log" &&
  pass "ok-4: launcher.log has the command and the outcome" || fail "ok-4: launcher.log: $(cat "$RUN/logs/launcher.log")"
# Only this job's scratch (its owner record names the launcher's pid): other jobs' may be running.
left=$(grep -lsE "^[^ ]+ [^ ]+ $launcher_pid " /dev/shm/llmtrain-launch.*/owner /tmp/llmtrain-launch.*/owner)
[[ -z $left ]] && pass "ok-4: no scratch of this job left" || fail "ok-4: Open MPI scratch left: $left"

run_bounded dry-run-4 "$LLMTRAIN" run "$RECIPE" --nproc 4 --dry-run
expect_status 2; expect_out "cannot run: "  # the recipe's data is not here: the plan is printed, the run would stop
expect_out "launch: local mpirun, 4 rank(s) per node"
[[ $(id -u) == 0 ]] && expect_out "launch environment: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
(($(nproc) < 4)) && expect_out "--oversubscribe --bind-to none" && expect_out "oversubscribed, binding off"

run_bounded dry-run-restartable-1 "$LLMTRAIN" run "$RECIPE" --set launch.max_restarts=2 --dry-run
expect_status 2; expect_out "cannot run: "  # the recipe's data is not here: the plan is printed, the run would stop
expect_out "launch command: mpirun -np 1"
expect_out "one rank under mpirun so that the launcher can restart it"

# --- SIGKILL of one rank: restart from the newest checkpoint -------------------------------------
reset_run
start_job sigkill "${RUN_JOB[@]}" --nproc 4 --set launch.max_restarts=2 -- "$JOB" --steps 30 --ckpt-dir "$CKPT"
wait_out sigkill '\[rank 0\] step 4 done' 30
victim=$(rank_pid sigkill 2)
[[ -n $victim ]] && kill -KILL "$victim"
finish_job sigkill 60
expect_status 0
expect_out "exit 137 (killed by signal 9, Killed); restart 1 of 2 in 1.0s, resuming from $CKPT/step_000000"
expect_out_re "attempt 2 of 3, resuming from $CKPT/step_[0-9]{8}: mpirun .* --set checkpoint.resume=auto --set checkpoint.load_weights_only=false"
expect_out_re "\[rank 0\] resuming after step [0-9]+"
expect_count 4 "restart 1, sets: checkpoint.resume=auto checkpoint.load_weights_only=false"
expect_out "[rank 0] finished 30 steps"
expect_out "[launcher] the job finished (exit 0)"
grep -q -- "--- .* attempt 2 of 3, resuming from" "$RUN/logs/rank_00002.log" &&
  pass "sigkill: rank 2's log marks the restart" || fail "sigkill: rank_00002.log: $(cat "$RUN/logs/rank_00002.log")"

# A restart with no complete checkpoint starts over, without the resume overrides.
reset_run
run_bounded restart-no-checkpoint "${RUN_JOB[@]}" --nproc 2 --set launch.max_restarts=1 -- "$JOB" --steps 3 --ckpt-dir "$CKPT" \
  --ckpt-every 1000 --fail-rank 1 --fail-at 2 --fail kill --fail-once
expect_status 0
expect_out "restart 1 of 1 in 1.0s, from the beginning (no complete checkpoint in $CKPT)"
expect_count 2 "restart 1, sets: none"

# --- SIGTERM to llmtrain run: every rank checkpoints and exits 75; no restart ---------------------
reset_run
start_job sigterm "${RUN_JOB[@]}" --nproc 4 --set launch.max_restarts=2 -- "$JOB" --steps 500 --ckpt-dir "$CKPT" --ckpt-ms 500
wait_out sigterm '\[rank 0\] step 3 done' 30
kill -TERM "$job_pid"
finish_job sigterm 60
expect_status 75
expect_out "[launcher] SIGTERM received: sent SIGTERM to the 4 rank process(es)"
expect_count 4 "stopping after step [0-9]+ \(signal 15\): checkpoint written, exit 75"
steps=$(grep -oE "stopping after step [0-9]+" <<<"$out" | sort -u | wc -l)
[[ $steps == 1 ]] && pass "sigterm: every rank stopped after the same step" || fail "sigterm: ranks stopped at different steps"
expect_out "the job stopped: every rank wrote its checkpoint and exited 75"
expect_no "restart 1 of"
expect_no "Primary job"  # mpirun's banners about the ranks' exit 75, which was asked for
expect_no "mpirun detected that one or more processes exited"
stopped=$(grep -oE "stopping after step [0-9]+" <<<"$out" | head -1 | grep -oE '[0-9]+$')
[[ $(cat "$CKPT/latest" 2>/dev/null) == "$(printf 'step_%08d' "$stopped")" ]] &&
  pass "sigterm: the checkpoint of step $stopped is the latest" || fail "sigterm: latest is $(cat "$CKPT/latest")"

# Ctrl-C twice: the second kills the job at once.
reset_run
start_job sigint2 "${RUN_JOB[@]}" --nproc 2 -- "$JOB" --steps 500 --ckpt-dir "$CKPT" --ckpt-ms 20000
wait_out sigint2 '\[rank 0\] step 2 done' 30
kill -INT "$job_pid"
wait_out sigint2 'SIGINT received' 10
kill -INT "$job_pid"
finish_job sigint2 30
expect_status 130
expect_out "second SIGINT: killing the job now, without waiting for a checkpoint"

# A rank that does not stop is killed after --stop-grace.
reset_run
start_job grace "${RUN_JOB[@]}" --nproc 2 --stop-grace 2 -- "$JOB" --steps 500 --ignore-stop
wait_out grace '\[rank 0\] step 2 done' 30
kill -TERM "$job_pid"
finish_job grace 30
[[ $status != 0 && $status != 75 ]] && pass "grace: exit $status" || fail "grace: exit $status"
expect_out "the ranks did not exit within 2.0s of the stop request: killing the job"
expect_out "after the stop request (75 was expected"

# --- failures that are not restarted, and restarts used up ---------------------------------------
reset_run
run_bounded user-error "${RUN_JOB[@]}" --nproc 2 --set launch.max_restarts=3 -- "$JOB" --steps 5 --fail-rank 1 --fail-at 2 \
  --fail user-error
expect_status 2
expect_out "[rank 1] error: injected user error"
expect_out "the job stopped on a user error (exit 2): not restarted"
expect_no "attempt 2 of"

reset_run
run_bounded crash-exhausted "${RUN_JOB[@]}" --nproc 2 --set launch.max_restarts=1 -- "$JOB" --steps 5 --fail-rank 1 --fail-at 1 \
  --fail exit:3
expect_status 1  # one rule for a failed job (torchrun's): 1, the rank's own status named below
expect_out "[rank 1] fatal: rank 1 called exit(3) before the job finished"
expect_out "the job failed: exit 3; restart 1 of 1 in 1.0s"
expect_out "the job failed: exit 3, and all 1 restart(s) (launch.max_restarts) are used up; giving up (rank logs: $RUN/logs/rank_*.log)"

reset_run
run_bounded crash-no-restarts "${RUN_JOB[@]}" --nproc 2 -- "$JOB" --steps 5 --fail-rank 0 --fail-at 1 --fail segv
expect_status 1  # not 139: that would read as if llmtrain itself had crashed
expect_out "the job failed: exit 139 (killed by signal 11, Segmentation fault); set launch.max_restarts to restart"

# --- a failed attempt's leftovers end before the restart ----------------------------------------
# Rank 1 leaves a process behind (own process group, deaf to SIGTERM), then fails: mpirun ends the
# ranks but not it. The supervisor, its subreaper, kills it before the restart and says so.
reset_run
mkdir -p "$RUN"
run_bounded leftovers "${RUN_JOB[@]}" --nproc 2 --set launch.max_restarts=1 -- "$JOB" --steps 3 --fail-rank 1 \
  --fail-at 1 --fail exit:3 --fail-once --ckpt-dir "$CKPT" --leave-behind "$RUN/leftover.pid"
expect_status 0
leftover=$(cat "$RUN/leftover.pid")
expect_out "killed 1 process(es) the attempt left behind: $leftover (launch_job)"
expect_out "[launcher] attempt 2 of 2"
kill -0 "$leftover" 2>/dev/null && fail "leftovers: process $leftover of the failed attempt is still alive"

# --- a hang: found, reported, flight records written, the job restarted ---------------------------
# Rank 1 stops making progress at step 2 (it sleeps; rank 0 waits in the step's all-reduce). With
# launch.hang_timeout 3s the supervisor names rank 1 and rank 0's collective, has both write their
# flight records, ends the attempt and restarts it (the hang fires once), and the job finishes.
reset_run
run_bounded hang "${RUN_JOB[@]}" --nproc 2 --set launch.hang_timeout=3s --set launch.max_restarts=1 -- "$JOB" \
  --steps 4 --fail-rank 1 --fail-at 2 --fail hang --fail-once --ckpt-dir "$CKPT"
expect_status 0
expect_out_re "no progress for [0-9.]+s \(launch.hang_timeout 3.0s\): rank\(s\) 1 behind$"
expect_out_re "rank 0: step 1, train, in all_reduce #2 on group 'world' \(2 ranks, 8 B\) for [0-9.]+s"
expect_out "rank 1: step 1, train, not in a collective"
expect_out "flight records of 2 rank(s) (their last communication operations): $RUN/flight/"
expect_out "the job failed: it hung (no progress for launch.hang_timeout 3.0s"
expect_out "[launcher] attempt 2 of 2, resuming from $CKPT/step_00000001"
expect_out "[launcher] the job finished (exit 0)"
# Rank 0's record ends with the all-reduce it was waiting in (end -1: in flight); rank 1's does not.
tail -1 "$RUN/flight/rank_00000000.txt" | grep -qE '^2 all_reduce world 2 8 -1 [0-9.]+ -1.000$' &&
  pass "hang: rank 0's flight record ends in the pending all_reduce" ||
  fail "hang: rank 0's flight record: $(cat "$RUN/flight/rank_00000000.txt")"
tail -1 "$RUN/flight/rank_00000001.txt" | grep -qE '^1 all_reduce world 2 8 -1 [0-9.]+ [0-9.]+$' &&
  pass "hang: rank 1's flight record ends with its last finished all_reduce" ||
  fail "hang: rank 1's flight record: $(cat "$RUN/flight/rank_00000001.txt")"

# --- pre-flight: nothing starts ------------------------------------------------------------------
reset_run
run_bounded no-mpirun env PATH=/nonexistent "$LLMTRAIN" run "$RECIPE" --set log.dir="$RUN" --nproc 2 -- "$JOB"
expect_status 1
expect_out "error: mpirun (Open MPI's launcher) was not found on PATH"
expect_out "apt-get install openmpi-bin"

run_bounded no-srun env PATH=/nonexistent SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=1 "$LLMTRAIN" run "$RECIPE" \
  --set log.dir="$RUN" --nproc 2 -- "$JOB"
expect_status 1
expect_out "error: srun (Slurm's launcher, needed inside an allocation) was not found on PATH"

touch "$WORK/a-file"
run_bounded ckpt-not-writable "${RUN_JOB[@]}" --nproc 2 --set checkpoint.dir="$WORK/a-file/ckpt" -- "$JOB"
expect_status 1
expect_out "error: checkpoint.dir $WORK/a-file/ckpt: cannot create it: Not a directory"
expect_out "--set checkpoint.dir=PATH"

reset_run
run_bounded cuda-devices "${RUN_JOB[@]}" --nproc 4 --set train.device=cuda -- "$JOB"
expect_status 1
expect_out "train.device is cuda and 4 rank(s) run on this host (launch.procs_per_node 4), but"
expect_out "CUDA device(s) are visible"
# The output folders are created last: a job refused by pre-flight leaves no run directory.
[[ ! -e $RUN ]] && pass "cuda-devices: no run directory" || fail "cuda-devices: left $(find "$RUN")"

run_bounded no-program "${RUN_JOB[@]}" --nproc 2 -- no-such-program-here
expect_status 2
expect_out "error: the rank program no-such-program-here was not found on PATH"

run_bounded nothing-after-dashes "$LLMTRAIN" run "$RECIPE" --nproc 2 --
expect_status 2
expect_out "nothing after \`--\`"

run_bounded nodes-without-slurm "${RUN_JOB[@]}" --nproc 2 --set launch.nodes=2 -- "$JOB"
expect_status 2
expect_out "launch.nodes is 2 but this is one host, outside any Slurm allocation"
[[ -d $RUN/logs ]] && fail "pre-flight failures started something: $(ls "$RUN/logs")" || pass "pre-flight: no logs, nothing started"

echo "launcher_local took $(elapsed)"
finish
