#!/usr/bin/env bash
# The GPU build's bundle (scripts/gpu_bundle.sh; docs/cuda.md "On a GPU"), what a lent GPU machine
# gets: packed from this CUDA build within 60 MiB; its README names the commit, the build type and
# this build's CUDA architectures; unpacked, every library of every binary resolves from the
# bundle's lib/ but glibc's (the machine's own) and the allowed-missing set the machine brings
# (the driver and CUDA's libraries: libcuda, libcudart, libcublas, libcublasLt, libnccl), none of
# which is packed; and llmtrain starts from it. Running it needs a GPU (scripts/gpu_check.sh there);
# the simulator's bundle runs the check end to end: tests/e2e/gpu_bundle_sim.sh.
source "$(dirname "$0")/lib.sh"

run_cmd "gpu_bundle.sh from the GPU build" env BUILD="$BUILD" NO_BUILD=1 OUTPUT="$WORK/gpu.tar.xz" "$SRC/scripts/gpu_bundle.sh"
expect_status 0
expect_out "gpu build"
size=$(stat -c %s "$WORK/gpu.tar.xz" 2>/dev/null || echo 0)
((size > 0 && size <= 60 * 1048576)) && pass "the bundle is $((size / 1048576)) MiB, within 60 MiB" ||
  fail "the bundle is $size bytes, not within 60 MiB"
mkdir unpacked && tar -xf "$WORK/gpu.tar.xz" -C unpacked
root=$WORK/unpacked/llmtrain-bundle
readme=$root/README
archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
grep -qx "simulator=no" "$readme" && pass "README: not a simulator build" || fail "README does not say simulator=no"
grep -qx "cuda_archs=$archs" "$readme" && pass "README: archs $archs" || fail "README: not cuda_archs=$archs"
grep -qx "commit=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)" "$readme" && pass "README: the commit" || fail "README names another commit"
grep -qx "build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")" "$readme" &&
  pass "README: the build type" || fail "README: another build type"

glibc='^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|lib(c|m|dl|pthread|rt|resolv|util)\.so\.[0-9]+)$'
allowed='^lib(cuda|cudart|cublas|cublasLt|nccl)\.so(\.[0-9]+)*$'
packed_wrong=$(ls "$root/lib" | grep -E "$allowed|$glibc")
[[ -z $packed_wrong ]] && pass "no driver, glibc or CUDA library packed" || fail "packed: $packed_wrong"
binaries=$(sed -n 's/^binaries=//p' "$readme")
for b in $binaries; do
  bad=()
  while read -r name arrow path _; do
    [[ $name =~ $glibc || $name =~ $allowed ]] && continue
    [[ $arrow == "=>" && $path == "$root/lib/"* ]] || bad+=("$name $arrow $path")
  done < <(LD_LIBRARY_PATH=$root/lib ldd "$root/$b")
  ((${#bad[@]} == 0)) && pass "$b: every library but glibc's and CUDA's resolves from the bundle" ||
    fail "$b: not from the bundle: ${bad[*]}"
done
run_cmd "llmtrain --version from the bundle" env LD_LIBRARY_PATH="$root/lib" "$root/llmtrain" --version
expect_status 0
expect_out "CUDA ($archs)"
finish
