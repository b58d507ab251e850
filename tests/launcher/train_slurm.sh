#!/usr/bin/env bash
# Real training through Slurm, on a real single-node Slurm 22.05 cluster the test starts
# (scripts/ci/cluster.sh: munge, slurmctld, slurmd; CPUs=4, KillWait=30, MpiDefault=pmix):
# `llmtrain sbatch r.yaml --nodes 1 --set launch.procs_per_node=4 --submit`; the job trains with 4
# ranks through `srun --mpi=pmix` and writes a checkpoint; `scancel --signal=TERM` (what the time
# limit's --signal and preemption send) makes every rank finish its step, checkpoint and exit 75;
# the script requeues the job; the requeued job resumes from that checkpoint and finishes, with the
# losses of an uninterrupted 4-rank run (relative 1e-5, every step). Job states come from scontrol.
source "$(dirname "$0")/train_lib.sh"
if missing=$(lt_slurm_missing); then skip "Slurm is not installed ($missing missing; scripts/setup.sh installs slurm-wlm munge)"; fi
prep_data
write_recipe r.yaml 300

# The uninterrupted run to compare with: 4 ranks through the local mpirun (the same data-parallel
# arithmetic; srun and mpirun start the same Open MPI ranks).
run_bounded reference "$LLMTRAIN" run r.yaml --nproc 4 --set log.dir=ref
expect_status 0
expect_out "[rank 0] done: 300 steps"
echo "reference done after $(elapsed)"

lt_lock slurm 200 || { fail "could not take the Slurm lock"; finish; }
cleanup_hooks+=(lt_slurm_stop)
lt_slurm_start || { fail "the Slurm cluster did not start"; finish; }
export SLURM_CONF=$LT_SLURM_DIR/slurm.conf
echo "cluster up after $(elapsed): $(sinfo -h -N -o '%N %T %c CPUs')"

RUN=$WORK/slurm
job=$(timeout -k 10 60 "$LLMTRAIN" sbatch r.yaml --nodes 1 --set launch.procs_per_node=4 --set log.dir=slurm --submit \
  2>submit.err)
status=$? out="$job
$(cat submit.err)" last_name=submit
expect_status 0
[[ $job =~ ^[0-9]+$ ]] && pass "submit: job id $job" || { fail "submit: no job id on stdout: $out"; finish; }
OUT=$RUN/slurm-$job.out
lt_slurm_wait_state "$job" RUNNING 30 >/dev/null || fail "submit: job $job did not start"
wait_file "$RUN/ckpt/latest" 60 && pass "the job wrote its first checkpoint ($(cat "$RUN/ckpt/latest"))"
timeout 10 scancel --signal=TERM "$job" && pass "scancel --signal=TERM $job" || fail "scancel --signal=TERM $job failed"
state=$(lt_slurm_wait_state "$job" COMPLETED 90 1) && pass "requeue: job $job COMPLETED after 1 restart" ||
  fail "requeue: job $job is $state; slurmctld log: $(tail -5 "$LT_SLURM_DIR/log/slurmctld.log")"
out=$(cat "$OUT") last_name=slurm-out
expect_out "[launcher] attempt 1 of 1: srun --mpi=pmix --nodes=1 --ntasks=4 --ntasks-per-node=4"
expect_out "[rank 0] llmtrain run launch: 4 rank(s) = tp 1 × pp 1 × dp 4 = 4"
stop=$(grep -oE "\[rank 0\] stop requested \(signal\): writing a checkpoint at step [0-9]+" <<<"$out" | grep -oE '[0-9]+$')
((${stop:-0} >= 20 && ${stop:-0} < 300)) && pass "the ranks stopped after step $stop, after the first checkpoint" ||
  fail "stop step '$stop'; output:
$out"
ckpt=$(printf '%s/ckpt/step_%08d' "$RUN" "${stop:-0}")
expect_out "[rank 0] interrupted at step $stop of 300; resume with the same command"
expect_out "[launcher] the job was interrupted (exit 75)"
expect_out "[sbatch] llmtrain run exited 75"
expect_out "[sbatch] interrupted with a checkpoint written: requeueing job $job to resume"
expect_out "[sbatch] job $job (restart 1)"
expect_out "[launcher] attempt 1 of 1 (Slurm restart 1), resuming from $ckpt: srun --mpi=pmix"
expect_out "[rank 0] resuming from $ckpt at step $stop"
expect_out "[rank 0] done: 300 steps"
expect_out "[sbatch] llmtrain run exited 0"
expect_no "second signal"
res=$(compare_losses "$RUN" ref 2>&1) && pass "slurm: losses equal the uninterrupted run's at every step: $res" ||
  fail "slurm: $res"
res=$(compare_losses "$RUN" ref $((stop + 1)) 2>&1) && pass "slurm: after the resume point: $res" || fail "slurm: $res"
for r in 0 1 2 3; do
  [[ -f $RUN/logs/rank_0000$r.log ]] && pass "rank_0000$r.log exists" || fail "no $RUN/logs/rank_0000$r.log"
done

echo "launcher_train_slurm took $(elapsed)"
finish
