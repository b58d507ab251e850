#!/usr/bin/env bash
# A ctest entry for a multi-rank test binary: run_mpi.sh NP PROGRAM [ARGS...] runs PROGRAM under
# `mpirun -np NP` with a time bound (tests/parallel/mpi_env.sh) and returns its status.
set -uo pipefail
source "$(dirname "$0")/mpi_env.sh"
np=$1
shift
mpi_run "${LLMTRAIN_MPI_TEST_SECONDS:-100}" "$np" "$@"
