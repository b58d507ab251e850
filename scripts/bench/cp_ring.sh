#!/usr/bin/env bash
# How much of ring attention's transfer time hides behind attention (tests/parallel/bench_cp_ring.cpp
# says how it is measured): one 16K-token sequence at cp 2 and 4 under mpirun, forward only.
#
#   scripts/bench/cp_ring.sh [SEQ] [HEADS] [HEAD_DIM] [REPS]   (default 16384 4 16 5)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${LLMTRAIN_BUILD_DIR:-$src/build}
source "$src/tests/parallel/mpi_env.sh"
# Not part of the default build: built here.
cmake --build "$build" --target bench_cp_ring -j "$(nproc)" >/dev/null
for cp in 2 4; do
  mpi_run 1200 $cp "$build/tests/bench_cp_ring" "${1:-16384}" "${2:-4}" "${3:-16}" "${4:-5}"
done
