# Sourced by the multi-rank test scripts: how to run an MPI program in a test (RUNBOOK "Open MPI as
# root on 2 cores").
#   mpi_run SECONDS NP PROGRAM [ARGS...]
# runs it under `mpirun -np NP` bounded by `timeout` (mpirun never times out a hang itself; timeout
# signals its whole process group, ranks included). Open MPI's shared-memory segments and session
# directory go to a private scratch folder removed afterwards, so a killed run leaves nothing in
# /dev/shm or /tmp and never touches another job's files.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1           # more ranks than cores
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # containers often block CMA

mpi_run() {
  local seconds=$1 np=$2 scratch status
  shift 2
  scratch=$(mktemp -d /dev/shm/llmtrain-mpi.XXXXXX 2>/dev/null || mktemp -d "${TMPDIR:-/tmp}/llmtrain-mpi.XXXXXX")
  OMPI_MCA_btl_vader_backing_directory=$scratch OMPI_MCA_orte_tmpdir_base=$scratch \
    timeout -k 5 "$seconds" mpirun -np "$np" --bind-to none "$@"
  status=$?
  rm -rf "$scratch"
  return $status
}
