#!/usr/bin/env bash
# Fuzzes llmtrain's readers of untrusted files with libFuzzer, under AddressSanitizer + UBSan.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]    each target for SECONDS (default 60); targets:
#                                            recipe safetensors manifest idx tokenizer tokenizer_text
#                                            prep_jsonl hf_config plot_metrics hf_index derived_recipe device_rates
#
# Builds the sanitizer build (build-asan/, clang; scripts/sanitize.sh's) if needed. Each target
# starts from its seeds (tests/fuzz/corpus/<target>/) and the inputs that once broke it
# (tests/fuzz/regressions/<target>/); what it learns stays in build-asan/fuzz-corpus/<target>/. An
# input that crashes, trips a sanitizer, throws anything but llmtrain::Error, runs over 10 s or
# takes over 2 GiB is written to tests/fuzz/regressions/<target>/ (crash-<sha1>): fix the reader and
# commit the file, and every later run (scripts/test.sh's included) replays it. Exit status 1 when a
# target found something.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(recipe safetensors manifest idx tokenizer tokenizer_text prep_jsonl hf_config plot_metrics
  hf_index derived_recipe device_rates)
build=${LLMTRAIN_ASAN_BUILD_DIR:-build-asan}

scripts/sanitize.sh --build-only "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}
# One target per core at once (libFuzzer runs one thread); each reports when it ends.
source scripts/per_core.sh
fuzz_one() {
  local t=$1
  local seeds=tests/fuzz/corpus/$t regressions=tests/fuzz/regressions/$t learned=$build/fuzz-corpus/$t
  mkdir -p "$learned" "$regressions"
  local log=$build/fuzz-$t.log start=$(date +%s)
  if "$build/tests/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$regressions/" "$learned" "$seeds" "$regressions" >"$log" 2>&1; then
    local runs cov
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -ao 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    echo "fuzz: $t: no finding in $(($(date +%s) - start)) s, ${runs:-?} inputs, coverage ${cov:-?} edges"
  else
    echo "fuzz: $t: FOUND A PROBLEM (log: $log); the input is in $regressions/:"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|terminate called|artifact_prefix|Test unit written)' "$log" | head -8 | sed 's/^/  /'
    return 1
  fi
}
status=0
per_core fuzz_one "${targets[@]}" || status=1
exit $status
