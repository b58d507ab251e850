#!/usr/bin/env bash
# `llmtrain sbatch` and `llmtrain run` inside Slurm, on a real single-node Slurm 22.05 cluster the
# test starts (scripts/ci/cluster.sh: munge, slurmctld, slurmd; CPUs=4, KillWait=30, MpiDefault=pmix),
# with tests/launcher/launch_job as the ranks' program:
#  - the script `llmtrain sbatch` writes; submitted, it runs 4 ranks through `srun --mpi=pmix`;
#  - `scancel --signal=TERM`: every rank checkpoints and exits 75, the script requeues the job, and
#    the requeued job resumes from the checkpoint (the supervisor sees SLURM_RESTART_COUNT) and
#    finishes;
#  - plain `scancel`: the ranks get Slurm's own SIGTERM once (the supervisor does not add a
#    second), checkpoint and exit 75, and the job is not requeued;
#  - SIGTERM to `llmtrain run` in an salloc shell: the supervisor asks the ranks through srun
#    (SIGUSR1, relayed to SIGTERM by each rank), since srun answers SIGTERM with SIGKILL;
#  - an allocation smaller than the recipe's world is refused before srun starts.
source "$(dirname "$0")/lib.sh"
if missing=$(lt_slurm_missing); then skip "Slurm is not installed ($missing missing; scripts/setup.sh installs slurm-wlm munge)"; fi
lt_lock slurm 200 || { fail "could not take the Slurm lock"; finish; }
cleanup_hooks+=(lt_slurm_stop)
lt_slurm_start || { fail "the Slurm cluster did not start"; finish; }
export SLURM_CONF=$LT_SLURM_DIR/slurm.conf
echo "cluster up after $(elapsed): $(sinfo -h -N -o '%N %T %c CPUs')"
RUN=$WORK/run
CKPT=$RUN/ckpt
SBATCH=("$LLMTRAIN" sbatch "$RECIPE" --nodes 1 --set log.dir="$RUN" --set launch.procs_per_node=4)

# --- the script ----------------------------------------------------------------------------------
run_bounded sbatch-print "${SBATCH[@]}" --time 00:30:00 -- "$JOB" --steps 5 --ckpt-dir "$CKPT"
expect_status 0
for line in "#SBATCH --nodes=1" "#SBATCH --ntasks-per-node=4" "#SBATCH --exclusive" "#SBATCH --time=00:30:00" \
  "#SBATCH --signal=TERM@300" "#SBATCH --requeue" "#SBATCH --open-mode=append" "#SBATCH --output=$RUN/slurm-%j.out" \
  "#SBATCH --chdir=$WORK" "$LLMTRAIN run $RECIPE" "--set launch.nodes=1" "-- $JOB --steps 5" "& wait" \
  'scontrol requeue "$SLURM_JOB_ID"'; do
  [[ $line == "& wait" ]] && { expect_out_re 'child=\$!'; continue; }
  expect_out "$line"
done
bash -n <(echo "$out" | grep -v '^# output') && pass "sbatch-print: the script is valid bash" || fail "sbatch-print: bash -n failed"

run_bounded sbatch-gpus "${SBATCH[@]}" --set train.device=cuda --gpus-per-node 2 -- "$JOB"
expect_status 2
expect_out "train.device is cuda with launch.procs_per_node 4 ranks per node, but --gpus-per-node is 2"

# --- submit; scancel --signal=TERM: checkpoint, exit 75, requeue, resume, finish ------------------
# submit NAME ARGS...: `llmtrain sbatch ... --submit`; the job id (its stdout) in $job.
submit() {
  local name=$1
  shift
  job=$(timeout -k 10 60 "${SBATCH[@]}" --submit "$@" 2>"$WORK/$name.err")
  status=$?
  out="$job
$(cat "$WORK/$name.err")"
  last_name=$name
  expect_status 0
  [[ $job =~ ^[0-9]+$ ]] && pass "$name: job id $job" || fail "$name: no job id on stdout: $out"
  expect_out "submitted Slurm job $job: script $RUN/sbatch.sh, output $RUN/slurm-$job.out"
}
submit submit -- "$JOB" --steps 30 --step-ms 100 --ckpt-dir "$CKPT"
OUT=$RUN/slurm-$job.out
lt_slurm_wait_state "$job" RUNNING 30 >/dev/null || fail "submit: job $job did not start"
start_job tail-out tail -F "$OUT"  # only so that wait_out can read the output file
wait_out tail-out '\[rank 0\] step 3 done' 30
scancel --signal=TERM "$job"
state=$(lt_slurm_wait_state "$job" COMPLETED 60 1) && pass "requeue: job $job COMPLETED after 1 restart" ||
  fail "requeue: job $job is $state"
kill "$job_pid" 2>/dev/null; job_pid=
out=$(cat "$OUT"); last_name=requeue
expect_out "[launcher] attempt 1 of 1: srun --mpi=pmix --nodes=1 --ntasks=4 --ntasks-per-node=4"
expect_out "--label"
expect_count 4 "^\[rank [0-3]\] rank [0-3] of 4: local [0-3] of 4, .* parent slurmstepd, .* restart 0, sets: none"
expect_count 4 "stopping after step [0-9]+ \(signal 15\): checkpoint written, exit 75"
expect_out "[sbatch] llmtrain run exited 75"
expect_out "[sbatch] interrupted with a checkpoint written: requeueing job $job to resume"
expect_out "[sbatch] job $job (restart 1)"
expect_out_re "attempt 1 of 1 \(Slurm restart 1\), resuming from $CKPT/step_[0-9]{8}: srun .* --set checkpoint.resume=auto --set checkpoint.load_weights_only=false"
expect_count 4 "restart 1, sets: checkpoint.resume=auto checkpoint.load_weights_only=false"
expect_out_re "\[rank 0\] resuming after step [0-9]+"
expect_out "[rank 0] finished 30 steps"
expect_out "[sbatch] llmtrain run exited 0"
grep -q "^rank 3 of 4" "$RUN/logs/rank_00003.log" && pass "requeue: per-rank logs under log.dir" ||
  fail "requeue: rank_00003.log: $(cat "$RUN/logs/rank_00003.log" 2>&1)"

# --- plain scancel: Slurm's own SIGTERM reaches the ranks once; checkpoint; not requeued ----------
rm -rf "$RUN"
submit submit-2 -- "$JOB" --steps 1000 --step-ms 100 --ckpt-dir "$CKPT" --ckpt-ms 1000
OUT=$RUN/slurm-$job.out
lt_slurm_wait_state "$job" RUNNING 30 >/dev/null || fail "scancel: job $job did not start"
start_job tail-out-2 tail -F "$OUT"
wait_out tail-out-2 '\[rank 0\] step 2 done' 30
scancel "$job"
wait_out tail-out-2 '\[sbatch\] (checkpoint written; not requeued|interrupted)' 45
kill "$job_pid" 2>/dev/null; job_pid=
state=$(lt_slurm_wait_state "$job" CANCELLED 30) && pass "scancel: job $job CANCELLED" || fail "scancel: job $job is $state"
out=$(cat "$OUT"); last_name=scancel
expect_out_re "\[launcher\] SIGTERM received while Slurm job $job is (COMPLETING|CANCELLED): Slurm signals the ranks itself"
expect_count 4 "stopping after step [0-9]+ \(signal 15\): checkpoint written, exit 75"
expect_out "[sbatch] llmtrain run exited 75"
expect_out "not requeued: Slurm is ending job $job"
expect_no "second signal"

# --- SIGTERM to llmtrain run inside an allocation (salloc): relayed through srun as SIGUSR1 --------
rm -rf "$RUN"
start_job salloc-stop salloc -n 2 "$LLMTRAIN" run "$RECIPE" --set log.dir="$RUN" --nproc 2 -- "$JOB" --steps 500 \
  --ckpt-dir "$CKPT"
wait_out salloc-stop '\[rank 0\] step 2 done' 30
supervisor=$(pgrep -P "$job_pid" -x llmtrain)
[[ -n $supervisor ]] && kill -TERM "$supervisor" || fail "salloc-stop: no llmtrain under salloc $job_pid"
finish_job salloc-stop 60
expect_status 75
expect_out "[launcher] SIGTERM received: asked every rank, through srun, to write a checkpoint and exit 75"
expect_count 2 "stopping after step [0-9]+ \(signal 15\): checkpoint written, exit 75"
expect_out "the job stopped: every rank wrote its checkpoint and exited 75"

# --- inside an allocation that is too small: refused before srun ---------------------------------
run_bounded small-allocation salloc -n 2 "$LLMTRAIN" run "$RECIPE" --set log.dir="$RUN" --nproc 4 -- "$JOB"
expect_status 2
expect_out_re "the recipe needs 4 ranks \(launch.nodes 1 × launch.procs_per_node 4\) but Slurm job [0-9]+ has 2 task\(s\) \(SLURM_NTASKS=2\)"

run_bounded too-few-cpus salloc -n 2 -c 2 "$LLMTRAIN" run "$RECIPE" --set log.dir="$RUN" --nproc 2 \
  --set train.threads=4 -- "$JOB"
expect_status 2
expect_out "srun would wait for them forever"

echo "launcher_slurm took $(elapsed)"
finish
