#!/usr/bin/env bash
# A failing rank ends the whole job, promptly, saying which rank failed and why (DESIGN §3
# "Errors"): rank 1 of an mpirun job throws, calls exit(3), segfaults, lets an exception escape a
# thread, or stops responding while the other ranks are inside a collective (or a recv). Each job
# must end within 30 s with the failing rank and the cause in its output; a rank that stops
# responding makes the others hit parallel.timeout (2 s here) with an error naming the operation
# and group. Also: bootstrap without a launcher leaves MPI alone, and a plain srun is refused.
source "$(dirname "$0")/../e2e/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
FAULTS=$BUILD/tests/mpi_faults

# job NAME NP MODE: runs the fault program under mpirun; $status, $out, $elapsed.
job() {
  local name=$1 np=$2 mode=$3 t0=$EPOCHREALTIME
  run_cmd "$name" mpi_run 60 "$np" "$FAULTS" "$mode"
  elapsed=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
}
expect_prompt() {
  awk -v e="$elapsed" 'BEGIN { exit !(e < 30) }' && pass "$last_name: the job ended in ${elapsed}s" ||
    fail "$last_name: the job took ${elapsed}s (limit 30s)"
}

job ok 3 ok
expect_status 0; expect_out "completed 5 steps on 3 ranks"

job info-mpirun 2 info
expect_status 0; expect_out "mpi_initialized=1 RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2"
expect_out "via mpirun"

run_cmd info-no-launcher "$FAULTS" info
expect_status 0; expect_out "mpi_initialized=0 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1"
expect_out "no launcher (MPI not initialised)"

job throw 3 throw
expect_status 2; expect_prompt
expect_out "[rank 1] error: injected failure on rank 1 at step 3"
expect_out "[rank 1] ending the job (exit status 2)"

job exit 3 exit
expect_status 3; expect_prompt
expect_out "[rank 1] fatal: rank 1 called exit(3) before the job finished"

job segv 3 segv
[[ $status != 0 ]] && pass "segv: exit $status" || fail "segv: the job exited 0"
expect_prompt
expect_out_re '\[rank 1\] fatal: rank 1 \(pid [0-9]+ on .*\) received signal 11 \(Segmentation fault\)'

job terminate 3 terminate
expect_status 1; expect_prompt
expect_out "[rank 1] fatal: uncaught exception: injected exception in a thread"

job hang 3 hang
expect_status 1; expect_prompt
expect_out_re "\[rank [02]\] error: timed out after 2\.0s waiting for all_reduce\(sum, 1000 fp32\) on group 'dp' \(3 ranks; this is its rank [02]\)"
expect_out "raise parallel.timeout"

job hang-recv 2 hang-recv
expect_status 1; expect_prompt
expect_out "[rank 0] error: timed out after 2.0s waiting for recv(1000 fp32, tag 3) from rank 1 (world rank 1) of group 'pp' (2 ranks; this is its rank 0)"

job size-mismatch 2 size-mismatch
expect_status 1; expect_prompt
expect_out "MPI says this is rank 0 of 2, but the launcher's environment says rank 0 of 3"

# A plain srun (no PMIx): refused with the fix, by the rank program and by `llmtrain run`.
run_cmd srun-no-pmix env SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=4 "$FAULTS" ok
expect_status 2; expect_out "srun without PMIx"; expect_out "srun --mpi=pmix"
run_cmd srun-no-pmix-run env SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=4 \
  "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run
expect_status 2; expect_out "srun without PMIx"; expect_out "srun --mpi=pmix"

finish
