# Helpers for the end-to-end shell tests: each test sources this with the build dir and the
# source dir as $1 and $2, runs the real binary and checks what a user would see.
set -uo pipefail
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
LLMTRAIN=$BUILD/llmtrain
WORK=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-e2e.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# run_cmd NAME CMD...: runs CMD, keeping its status in $status and its stdout+stderr in $out.
run_cmd() {
  local name=$1; shift
  out=$("$@" 2>&1); status=$?
  last_name=$name
}
expect_status() { [[ $status == "$1" ]] && pass "$last_name: exit $1" || fail "$last_name: expected exit $1, got $status; output:
$out"; }
expect_out() { grep -qF -- "$1" <<<"$out" && pass "$last_name: says \"$1\"" || fail "$last_name: expected \"$1\" in output:
$out"; }
expect_out_re() { grep -qE -- "$1" <<<"$out" && pass "$last_name: matches /$1/" || fail "$last_name: expected /$1/ in output:
$out"; }
finish() {
  if ((failures)); then echo "$failures failure(s)"; exit 1; fi
  echo "all passed"
}

# The layout tests' common start (tests/e2e/{dp,zero,tp,pp,precision}.sh): Python with numpy and
# safetensors ($PY: the project's venv, else the system's), and Debian's fortunes prepared with the
# byte tokenizer into data/{train,valid} (5% held out).
use_python() {
  PY=$SRC/.venv/bin/python
  [[ -x $PY ]] || PY=/usr/bin/python3
}
prep_fortunes() {
  "$LLMTRAIN" prep --input $(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese) --separator % \
    --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1 || { echo "FAIL: prep"; exit 1; }
}
