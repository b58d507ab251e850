#!/usr/bin/env bash
# Communication benchmark of the MPI backend (parallel/comm/comm_mpi.h): all-reduce through MpiComm
# (nonblocking + polled, bounded wait) against a plain MPI_Allreduce, and the gradient bucket
# reducer's hidden vs exposed communication against no overlap, both measured in the same run.
#
#   scripts/bench/comm_mpi.sh [NP]      (default 2; needs a build in ${LLMTRAIN_BUILD_DIR:-build})
set -euo pipefail
cd "$(dirname "$0")/../.."
np=${1:-2}
build=${LLMTRAIN_BUILD_DIR:-build}
bin=$build/tests/bench_comm_mpi
# Not part of the default build (scripts/test.sh): built here.
cmake --build "$build" --target bench_comm_mpi -j "$(nproc)" >/dev/null
source tests/parallel/mpi_env.sh
echo "# $(date -u +%FT%TZ) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
mpi_run 300 "$np" "$bin"
