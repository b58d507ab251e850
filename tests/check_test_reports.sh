#!/usr/bin/env bash
# What ctest shows about our own tests must be readable:
#  - value-parameterized tests carry their name generator's names (Families/ModelTest.X/llama),
#    never gtest's "GetParam() = 4-byte object <03-00 00-00>" (tests/CMakeLists.txt discovers
#    them with NO_PRETTY_VALUES; every INSTANTIATE_TEST_SUITE_P names its cases);
#  - every skip gives its reason: each GTEST_SKIP() streams one (GTEST_SKIP() << "no AVX-512 on
#    this CPU"), and scripts/skipped_tests.sh, which scripts/test.sh runs after ctest, lists the
#    skipped tests with those reasons (ctest itself prints only "***Skipped").
# Run with the build dir and the source dir; the names are read from the test lists that
# gtest_discover_tests wrote for the test binaries built so far.
set -uo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
bad=0
fail() { echo "FAIL: $*"; bad=1; }

cd "$src"
# An INSTANTIATE_TEST_SUITE_P names its cases when it has a fourth argument (the name generator).
unnamed=$(python3 - tests <<'PY'
import pathlib, re, sys
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.cpp")):
    text = path.read_text()
    for m in re.finditer(r"INSTANTIATE_TEST_SUITE_P\s*\(", text):
        depth, args, i, quote = 1, 1, m.end(), None
        while depth and i < len(text):
            c = text[i]
            if quote:
                if c == "\\": i += 1
                elif c == quote: quote = None
            elif c in "\"'": quote = c
            elif c in "([{": depth += 1
            elif c in ")]}": depth -= 1
            elif c == "," and depth == 1: args += 1
            i += 1
        if args < 4:
            print(f"{path}:{text.count(chr(10), 0, m.start()) + 1}")
PY
)
[[ -z $unnamed ]] || fail "value-parameterized tests without a name generator (a fourth argument):
$unnamed"
unexplained=$(grep -rn 'GTEST_SKIP()' tests --include='*.cpp' --include='*.h' | grep -v 'GTEST_SKIP() *<<')
[[ -z $unexplained ]] || fail "GTEST_SKIP() without a reason (GTEST_SKIP() << \"why\"):
$unexplained"

shopt -s nullglob
lists=("$build"/tests/*_tests.cmake)
if ((${#lists[@]} == 0)); then
  fail "no test lists under $build/tests: build the test binaries first"
else
  ugly=$(grep -ohE 'add_test\( *\[=\[[^]]*\]=\]' "${lists[@]}" | grep -iE 'GetParam|byte object')
  [[ -z $ugly ]] || fail "test names carry gtest's parameter dump:
$ugly"
fi

# skipped_tests.sh on a ctest log of one gtest skip with a reason, one without, a shell skip and a pass.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/Testing/Temporary"
cat >"$tmp/Testing/Temporary/LastTest.log" <<'LOG'
Start testing: Nov 23 17:16 UTC
----------------------------------------------------------
1/4 Testing: Forms/Attention.Forward/avx512
1/4 Test: Forms/Attention.Forward/avx512
Output:
----------------------------------------------------------
[ RUN      ] Forms/Attention.Forward/avx512
tests/kernels/test_attention.cpp:70: Skipped
no AVX-512 on this CPU
[  SKIPPED ] Forms/Attention.Forward/avx512 (0 ms)
<end of output>
Test Pass Reason:
Skip regular expression found in output. Regex=[\[  SKIPPED \]]
----------------------------------------------------------

2/4 Testing: Suite.Silent
2/4 Test: Suite.Silent
Output:
----------------------------------------------------------
[ RUN      ] Suite.Silent
t.cpp:6: Skipped

[  SKIPPED ] Suite.Silent (0 ms)
<end of output>
----------------------------------------------------------

3/4 Testing: launcher_ssh_hosts
3/4 Test: launcher_ssh_hosts
Output:
----------------------------------------------------------
SKIPPED: network namespaces are not permitted here (unshare: Operation not permitted)
<end of output>
Test Passed.
----------------------------------------------------------

4/4 Testing: Suite.Passes
4/4 Test: Suite.Passes
Output:
----------------------------------------------------------
[ RUN      ] Suite.Passes
[       OK ] Suite.Passes (0 ms)
<end of output>
Test Passed.
----------------------------------------------------------
End testing: Nov 23 17:16 UTC
LOG
got=$("$src/scripts/skipped_tests.sh" "$tmp")
want="skipped: Forms/Attention.Forward/avx512: no AVX-512 on this CPU
skipped: Suite.Silent: (no reason given)
skipped: launcher_ssh_hosts: network namespaces are not permitted here (unshare: Operation not permitted)"
[[ $got == "$want" ]] || fail "scripts/skipped_tests.sh printed:
$got
expected:
$want"

((bad)) && exit 1
echo "ok: parameterized test names, skip reasons"
