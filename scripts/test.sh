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
# After ctest it lists the skipped tests with their reasons (scripts/skipped_tests.sh), then runs
# the CUDA backend's tests on the SIMT simulator (build-sim/, cmake -DLLMTRAIN_CUDA=SIM) and the
# sanitizer build (scripts/sanitize.sh: ASan + UBSan unit tests and the fuzz targets, in build-asan/);
# those two builds run in the background from the start, at the lowest CPU priority.
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
sim_targets=(test_cuda_sim test_step_sync_sim test_comm_staged_sim test_kernels test_device_select llmtrain)
if (($# == 0)); then
  cmake -S . -B "$sim" -DCMAKE_BUILD_TYPE=Release -DLLMTRAIN_CUDA=SIM -DLLMTRAIN_TESTS=ON >/dev/null
  setsid nice -n 19 cmake --build "$sim" -j "$jobs" --target "${sim_targets[@]}" >"$build/sim-build.log" 2>&1 &
  sim_build=$!
  background+=("$sim_build")
  setsid nice -n 19 scripts/sanitize.sh --build-all >"$build/asan-build.log" 2>&1 &
  asan_build=$!
  background+=("$asan_build")
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
t0=$SECONDS
(cd "$build" && ctest --output-on-failure -j "$jobs" "${label_filter[@]}" "$@") || status=$?
echo "test: ctest took $((SECONDS - t0)) s"
# ctest says only "***Skipped"; the reasons are in its log.
scripts/skipped_tests.sh "$build"

# The CUDA backend on the SIMT simulator (docs/cuda.md; only for the whole suite): its own build in
# build-sim/ (LLMTRAIN_CUDA=SIM: the .cu files compiled as C++), only the targets its tests need, and
# the tests labelled cuda_sim (the simulator's own, every op case on the simulated device, and
# training tiny on it against the CPU: tests/e2e/cuda_sim.sh).
if (($# == 0)); then
  t0=$SECONDS
  if finished "$sim_build" "the simulator build" "$build/sim-build.log"; then
    (cd "$sim" && ctest --output-on-failure -j "$jobs" -L cuda_sim "${label_filter[@]}") || status=1
  else
    status=1
  fi
  echo "test: the simulator's tests (and the rest of its build) took $((SECONDS - t0)) s"
fi
# The sanitizer build: parser and reader unit tests under ASan + UBSan, each fuzz target over its
# seeds and regression inputs plus 10 s of new ones (only for the whole suite, not for -R runs).
if (($# == 0)); then
  t0=$SECONDS
  fuzz_seconds=10
  ((full)) && fuzz_seconds=60
  if finished "$asan_build" "the sanitizer build" "$build/asan-build.log"; then
    scripts/sanitize.sh "${LLMTRAIN_FUZZ_SECONDS:-$fuzz_seconds}" || status=1
  else
    status=1
  fi
  echo "test: the sanitizer's tests and the fuzz targets (and the rest of its build) took $((SECONDS - t0)) s"
fi
exit $status
