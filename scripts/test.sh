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
# sanitizer build (scripts/sanitize.sh: ASan + UBSan unit tests and the fuzz targets, in build-asan/).
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

scripts/setup.sh
build=${LLMTRAIN_BUILD_DIR:-build}
jobs=${LLMTRAIN_JOBS:-$(nproc)}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLMTRAIN_TESTS=ON >/dev/null
echo "test: building in $build with $jobs jobs"
t0=$SECONDS
cmake --build "$build" -j "$jobs"
echo "test: the build took $((SECONDS - t0)) s"
status=0
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
  sim=${LLMTRAIN_SIM_BUILD_DIR:-build-sim}
  cmake -S . -B "$sim" -DCMAKE_BUILD_TYPE=Release -DLLMTRAIN_CUDA=SIM -DLLMTRAIN_TESTS=ON >/dev/null
  cmake --build "$sim" -j "$jobs" --target test_cuda_sim test_step_sync_sim test_comm_staged_sim test_kernels test_device_select llmtrain
  (cd "$sim" && ctest --output-on-failure -j "$jobs" -L cuda_sim "${label_filter[@]}") || status=1
  echo "test: the simulator build and its tests took $((SECONDS - t0)) s"
fi
# The sanitizer build: parser and reader unit tests under ASan + UBSan, each fuzz target over its
# seeds and regression inputs plus 10 s of new ones (only for the whole suite, not for -R runs).
if (($# == 0)); then
  t0=$SECONDS
  fuzz_seconds=10
  ((full)) && fuzz_seconds=60
  scripts/sanitize.sh "${LLMTRAIN_FUZZ_SECONDS:-$fuzz_seconds}" || status=1
  echo "test: the sanitizer build, its tests and the fuzz targets took $((SECONDS - t0)) s"
fi
exit $status
