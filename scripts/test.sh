#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures, builds and runs every test. README's test command;
# CI (.ci/run) runs exactly this.
#
#   scripts/test.sh                 every test CI runs (not those labelled `full`)
#   scripts/test.sh --full          every test, with the long layout matrices labelled `full` (run it
#                                   before resolving an issue), and 60 s per fuzz target
#   scripts/test.sh -R <regex>      only the ctest entries matching <regex> (ctest's own flags pass through)
#                                   and no sanitizer build
#
# After ctest it lists the skipped tests with their reasons (scripts/skipped_tests.sh) and shows the
# CUDA backend's tests on the SIMT simulator (build-sim/, cmake -DLLMTRAIN_CUDA=SIM) and the
# sanitizer build's (scripts/sanitize.sh: ASan + UBSan unit tests and the fuzz targets, in
# build-asan/): those two builds run in the background from the start, at the lowest CPU priority,
# and their tests beside ctest, at nice 10.
#
# The CUDA parts are compiled for sm_90 only here, to keep the build short; GPU tests report
# "skipped: no GPU" on machines without one.
set -euo pipefail
cd "$(dirname "$0")/.."

full=0
if [[ ${1:-} == --full ]]; then
  full=1
  shift
fi
# ctest's label filter: the default suite leaves out the tests labelled `full`.
label_filter=(-LE '^full$')
((full)) && label_filter=()

# transformers 5 and PyTorch 2 (scripts/setup_hf5.sh: a download of about 5 GB, little CPU) install
# beside the build, below.
LLMTRAIN_SETUP_HF5=0 scripts/setup.sh
build=${LLMTRAIN_BUILD_DIR:-build}
sim=${LLMTRAIN_SIM_BUILD_DIR:-build-sim}
jobs=${LLMTRAIN_JOBS:-$(nproc)}
# LLMTRAIN_UNITY: each library compiled as a few merged sources, for a shorter fresh build.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLMTRAIN_TESTS=ON \
  -DLLMTRAIN_UNITY=ON >/dev/null

# For the whole suite, the simulator's build (build-sim/) and the sanitizer's (build-asan/) start
# now, in the background at the lowest CPU priority (nice 19): they take the cycles the main build
# and ctest leave idle (links, mpirun's start-up and waits, one-rank tests) and hardly slow either.
# Each runs in a process group of its own, stopped if this script ends first.
background=()
stop_background() {
  local pgid
  for pgid in "${background[@]}"; do kill -- "-$pgid" 2>/dev/null || true; done
}
trap stop_background EXIT
setsid nice -n 10 scripts/setup_hf5.sh >"$build/hf5-setup.log" 2>&1 &
hf5_setup=$!
background+=("$hf5_setup")
sim_targets=(test_cuda_sim test_step_sync_sim test_comm_staged_sim test_comm_nccl_sim test_kernels test_device_select device_rates
  ranks_in_process llmtrain muon_driver)
# Each build writes its exit status to <log>.rc when it ends (the tests that need it wait for that).
if (($# == 0)); then
  rm -f "$build/sim-build.log.rc" "$build/asan-build.log.rc"
  cmake -S . -B "$sim" -DCMAKE_BUILD_TYPE=Release -DLLMTRAIN_CUDA=SIM -DLLMTRAIN_TESTS=ON >/dev/null
  setsid nice -n 19 bash -c 'cmake --build "$1" -j "$2" --target "${@:4}" >"$3" 2>&1; echo $? >"$3.rc"' _ \
    "$sim" "$jobs" "$build/sim-build.log" "${sim_targets[@]}" &
  background+=("$!")
  setsid nice -n 19 bash -c 'scripts/sanitize.sh --build-all >"$1" 2>&1; echo $? >"$1.rc"' _ "$build/asan-build.log" &
  background+=("$!")
fi

echo "test: building in $build with $jobs jobs"
t0=$SECONDS
cmake --build "$build" -j "$jobs"
echo "test: the build took $((SECONDS - t0)) s"
status=0
# Waits for a background job; on failure shows the end of its log.
finished() {  # PID NAME LOG
  local t0=$SECONDS
  if wait "$1"; then
    echo "test: waited $((SECONDS - t0)) s for $2 to finish"
  else
    echo "test: $2 FAILED (log: $3):"
    tail -30 "$3" | sed 's/^/  /'
    return 1
  fi
}
finished "$hf5_setup" "the transformers 5 venv (scripts/setup_hf5.sh)" "$build/hf5-setup.log" || status=1

# The simulator's tests and the sanitizer's (only for the whole suite) run beside ctest, in the
# background at nice 10: ctest's serial tests (one test at a time, many of them a single process,
# with mpirun's start-up and waits) leave a core idle for much of its time, and these fill it.
#  - the CUDA backend on the SIMT simulator (docs/cuda.md): build-sim/ (LLMTRAIN_CUDA=SIM: the .cu
#    files compiled as C++), the tests labelled cuda_sim (the simulator's own, every op case on the
#    simulated device, and training on it against the CPU: tests/e2e/cuda_sim.sh);
#  - the sanitizer build: parser and reader unit tests under ASan + UBSan, each fuzz target over its
#    seeds and regression inputs plus 10 s of new ones (60 with --full).
# Their output goes to $build/late-tests.log, shown when ctest is done.
late_tests() {  # BUILD SIM JOBS FUZZ_SECONDS LABEL_FILTER...
  local build=$1 sim=$2 jobs=$3 fuzz=$4 status=0 t0=$SECONDS
  shift 4
  built() {  # LOG NAME: waits for the build's status; on failure shows the end of its log
    while [[ ! -s $1.rc ]]; do sleep 2; done
    [[ $(cat "$1.rc") == 0 ]] && return 0
    echo "test: $2 FAILED (log: $1):"
    tail -30 "$1" | sed 's/^/  /'
    return 1
  }
  if built "$build/sim-build.log" "the simulator build"; then
    (cd "$sim" && ctest --output-on-failure -j "$jobs" -L cuda_sim "$@") || status=1
  else
    status=1
  fi
  echo "test: the simulator's tests (and the rest of its build) took $((SECONDS - t0)) s"
  t0=$SECONDS
  if built "$build/asan-build.log" "the sanitizer build"; then
    scripts/sanitize.sh "$fuzz" || status=1
  else
    status=1
  fi
  echo "test: the sanitizer's tests and the fuzz targets (and the rest of its build) took $((SECONDS - t0)) s"
  return $status
}
if (($# == 0)); then
  fuzz_seconds=10
  ((full)) && fuzz_seconds=60
  setsid nice -n 10 bash -c "$(declare -f late_tests); late_tests \"\$@\"" _ "$build" "$sim" "$jobs" \
    "${LLMTRAIN_FUZZ_SECONDS:-$fuzz_seconds}" "${label_filter[@]}" >"$build/late-tests.log" 2>&1 &
  late=$!
  background+=("$late")
fi

t0=$SECONDS
(cd "$build" && ctest --output-on-failure -j "$jobs" "${label_filter[@]}" "$@") || status=$?
echo "test: ctest took $((SECONDS - t0)) s"
# ctest says only "***Skipped"; the reasons are in its log.
scripts/skipped_tests.sh "$build"

if (($# == 0)); then
  t0=$SECONDS
  wait "$late" || status=1
  echo "test: waited $((SECONDS - t0)) s for the simulator's and the sanitizer's tests; their output:"
  cat "$build/late-tests.log"
fi
exit $status
