#!/usr/bin/env bash
# The bundle a GPU machine runs (scripts/gpu_bundle.sh, then BUNDLE=... scripts/gpu_check.sh;
# docs/cuda.md "On a GPU"), end to end on the simulator: packed from this SIM build, within 60 MiB,
# its README naming the commit and a simulator build; gpu_check.sh takes it (unpacked in a temporary
# folder, nothing built) and passes parts 1, 2 and 4 in a short form (the linear, AdamW and cuBLASLt
# op cases; tiny for 2 steps on cuda against cpu; dp 2 as two ranks that are threads of one process
# on the one simulated device, against one rank); a part that runs out of its time limit is reported
# as timed out and the next part still runs. The GPU build's bundle: tests/e2e/gpu_bundle.sh.
source "$(dirname "$0")/lib.sh"
use_python
export TMPDIR=$WORK  # gpu_check keeps its unpacked copy; lib.sh removes $WORK

run_cmd "gpu_bundle.sh from the SIM build" env BUILD="$BUILD" NO_BUILD=1 OUTPUT="$WORK/sim.tar.xz" "$SRC/scripts/gpu_bundle.sh"
expect_status 0
expect_out "sim build"
size=$(stat -c %s "$WORK/sim.tar.xz" 2>/dev/null || echo 0)
((size > 0 && size <= 60 * 1048576)) && pass "the bundle is $((size / 1048576)) MiB, within 60 MiB" ||
  fail "the bundle is $size bytes, not within 60 MiB"
mkdir unpacked && tar -xf "$WORK/sim.tar.xz" -C unpacked
readme=unpacked/llmtrain-bundle/README
grep -qx "simulator=yes" "$readme" && pass "README: a simulator build" || fail "README does not say simulator=yes"
grep -qx "commit=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)" "$readme" && pass "README: the commit" || fail "README names another commit"
grep -q "^build_type=Release$" "$readme" && pass "README: Release" || fail "README: no build_type=Release"
grep -q "BUNDLE=.* scripts/gpu_check.sh" "$readme" && pass "README: how to run it" || fail "README: no run line"
for b in llmtrain tests/test_kernels tests/device_rates tests/ranks_in_process; do
  [[ -x unpacked/llmtrain-bundle/$b ]] && pass "bundle holds $b" || fail "bundle lacks $b"
done

check=(BUNDLE="$WORK/sim.tar.xz" PYTHON="$PY" STEPS=2 OPS_FILTER='Linear.*:AdamW.*:Cublaslt*' LIMIT_PART1=300)
SECONDS=0
run_cmd "gpu_check.sh with the bundle, parts 1, 2 and 4" env "${check[@]}" PARTS="1 2 4" LIMIT_PART2=300 \
  LIMIT_PART4=300 RANK_LAYOUTS=dp2 RANK_STEPS=2 "$SRC/scripts/gpu_check.sh"
echo "   parts 1, 2 and 4: ${SECONDS}s"
expect_status 0
expect_out "bundle: sim.tar.xz: commit"
expect_out_re "ops: test_kernels exit 0; [1-9][0-9]* op cases compared on the device; 0 failed lines"
expect_out_re "tiny, 2 steps, cuda against cpu: loss difference"
expect_out "ranks: ranks as threads of one process on one shared simulated device"
expect_out_re "ranks, dp2 \(2 threads\) against one rank: .*device communication: staged on 2 rank\(s\)"
expect_out "result: passed"
run_cmd "gpu_check.sh, part 2 out of time" env "${check[@]}" PARTS="2 3" LIMIT_PART2=1 "$SRC/scripts/gpu_check.sh"
expect_status 1
expect_out "part 2: timed out after 1 s"
expect_out "step time: skipped"  # part 3 still ran
expect_out "result: FAILED"
finish
