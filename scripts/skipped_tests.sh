#!/usr/bin/env bash
# Lists the tests the last ctest run skipped, each with its reason — ctest itself prints only
# "***Skipped". scripts/test.sh runs it after ctest.
#
#   scripts/skipped_tests.sh [BUILD_DIR]     reads BUILD_DIR/Testing/Temporary/LastTest.log
#
# The reason is what the test printed: a GoogleTest skip's message (GTEST_SKIP() << "reason",
# the lines after "<file>:<line>: Skipped"), or a shell test's "SKIPPED: reason" line before it
# exits 77 (tests/launcher/lib.sh `skip`). A skip that printed neither is listed as giving none.
set -euo pipefail
log=${1:-build}/Testing/Temporary/LastTest.log
[[ -f $log ]] || exit 0
awk '
  function report() {
    if (name != "" && skipped) {
      if (reason == "") reason = "(no reason given)"
      printf "skipped: %s: %s\n", name, reason
    }
  }
  /^[0-9]+\/[0-9]+ Testing: / { report(); name = $0; sub(/^[0-9]+\/[0-9]+ Testing: /, "", name); skipped = 0; reason = ""; in_skip = 0; next }
  /^SKIPPED: / { skipped = 1; if (reason == "") reason = substr($0, 10); next }
  /: Skipped$/ { in_skip = 1; skipped = 1; next }
  /^\[  SKIPPED \] / { skipped = 1; in_skip = 0; next }
  in_skip { if ($0 != "") reason = reason == "" ? $0 : reason " " $0; next }
  END { report() }
' "$log"
