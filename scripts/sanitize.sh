#!/usr/bin/env bash
# The sanitizer build: the unit tests of everything that reads files or input from users, under
# AddressSanitizer + UndefinedBehaviorSanitizer (any report fails the test), then every libFuzzer
# target over its seeds and regression inputs plus a few seconds of new inputs. scripts/test.sh runs
# it beside the main tests; it builds with clang in its own directory (build-asan/).
#
#   scripts/sanitize.sh [FUZZ_SECONDS]        unit tests, then scripts/fuzz.sh FUZZ_SECONDS (default 10)
#   scripts/sanitize.sh --build-only TARGET.. only configure and build those targets (scripts/fuzz.sh)
#   scripts/sanitize.sh --build-all           only configure and build every target the first form runs
#                                             (scripts/test.sh starts it early, in the background)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${LLMTRAIN_ASAN_BUILD_DIR:-build-asan}
jobs=${LLMTRAIN_JOBS:-$(nproc)}
# The unit tests of parsers and file readers: recipes, YAML, hostfiles, sbatch scripts, checkpoint
# directories and locks, safetensors, manifests, tokenizers, indexed datasets, prep's inputs.
unit_tests=(test_trainer test_cli test_indexed_dataset test_common test_launcher test_tokenizer test_prep_input)

configure() {
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLMTRAIN_SANITIZE=ON \
    -DLLMTRAIN_CUDA=OFF -DLLMTRAIN_TESTS=ON >/dev/null
}

fuzz_targets=(fuzz_recipe fuzz_safetensors fuzz_manifest fuzz_idx fuzz_tokenizer fuzz_tokenizer_text fuzz_prep_jsonl
  fuzz_hf_config fuzz_plot_metrics fuzz_hf_index fuzz_derived_recipe fuzz_device_rates)

if [[ ${1:-} == --build-only ]]; then
  shift
  configure
  cmake --build "$build" -j "$jobs" --target "$@" >/dev/null
  exit 0
fi
if [[ ${1:-} == --build-all ]]; then
  configure
  cmake --build "$build" -j "$jobs" --target "${unit_tests[@]}" "${fuzz_targets[@]}"
  exit 0
fi

fuzz_seconds=${1:-10}
configure
echo "sanitize: building ${unit_tests[*]} and the fuzz targets in $build with $jobs jobs"
cmake --build "$build" -j "$jobs" --target "${unit_tests[@]}" "${fuzz_targets[@]}" >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}
# One test binary per core at once; each reports when it ends.
source scripts/per_core.sh
sanitized_test() {
  local t=$1 start=$(date +%s)
  if "$build/tests/$t" --gtest_brief=1 >"$build/$t.log" 2>&1; then
    echo "sanitize: $t passed under ASan + UBSan in $(($(date +%s) - start)) s"
  else
    echo "sanitize: $t FAILED under ASan + UBSan (log: $build/$t.log):"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|\[  FAILED  \])' "$build/$t.log" | head -10 | sed 's/^/  /'
    return 1
  fi
}
status=0
per_core sanitized_test "${unit_tests[@]}" || status=1
scripts/fuzz.sh "$fuzz_seconds" || status=1
exit $status
