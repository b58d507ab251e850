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

# For benchmarks: Open MPI's shared-memory transport as `llmtrain run` sets it up
# (launcher/launch_plan.cpp): single-copy cross-memory attach where the kernel permits
# process_vm_readv, a copy through a shared buffer where it does not. Prints which.
mpi_transport_as_llmtrain_run() {
  if /usr/bin/python3 - <<'PY'; then
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
src, dst = ctypes.create_string_buffer(b"probe", 8), ctypes.create_string_buffer(8)
local, remote = iovec(ctypes.addressof(dst), 8), iovec(ctypes.addressof(src), 8)
libc.process_vm_readv.restype = ctypes.c_ssize_t
n = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
sys.exit(0 if n == 8 and dst.value == b"probe" else 1)
PY
    unset OMPI_MCA_btl_vader_single_copy_mechanism
    echo "shared-memory transport: single copy (process_vm_readv is permitted), as llmtrain run uses it"
  else
    echo "shared-memory transport: copies through a buffer (process_vm_readv is not permitted here)"
  fi
}
