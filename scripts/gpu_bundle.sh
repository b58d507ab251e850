#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs into ONE archive, built here, for a machine that has a GPU
# but neither the time to compile nor llmtrain's libraries (docs/cuda.md, "On a GPU"):
#
#   scripts/gpu_bundle.sh               configures and builds build-bundle/ (Release, CUDA for
#                                       CUDA_ARCHS, default 90-real: the H100/H200), packs it into
#                                       bundle/llmtrain-gpu.tar.xz
#   BUILD=build scripts/gpu_bundle.sh   packs an existing build instead (after building the targets
#                                       there; NO_BUILD=1 packs it as it is); a simulator build
#                                       (build-sim) makes bundle/llmtrain-sim.tar.xz
#   OUTPUT=FILE                         another archive path
#   BUNDLE_CACHE=DIR                    where the libraries' compressed part is kept (below)
#
# The archive holds llmtrain-bundle/ with the binaries at their paths in the build (llmtrain,
# tests/test_kernels, ...: the `targets` below; a target this tree does not have is skipped, said
# so), lib/ with every shared library they load that the GPU machine may lack, and README (how to
# run it; the commit, build type, CUDA architectures and whether it is a simulator build, which
# gpu_check.sh reads). NOT packed, because that machine has its own and ours would be wrong there:
# the driver (libcuda), glibc's libraries, and CUDA's (libcudart, libcublas, libcublasLt from its
# CUDA 13 toolkit; libnccl, 218 MB, from the toolkit or python3's nvidia-nccl-cu13 package).
#
# The one rule: the archive must stay within 60 MiB (a lent machine carries 64 MiB in all); above
# that this script fails and removes it. xz -9 (about 12 MB for sm_90) rather than zstd -19: smaller
# here, and Python's tarfile reads it where xz itself is missing. The libraries are compressed as a
# stream of their own, kept in .cache/gpu_bundle/ by their checksums and reused while they do not
# change (xz streams concatenate, and that part's tar ends without its end-of-archive blocks, so
# the whole is one tar.xz); only the binaries are compressed again each time.
set -euo pipefail
cd "$(dirname "$0")/.."

# What gpu_check.sh runs (ranks_in_process: part 4's ranks as threads of one process, when the tree
# has it).
targets=(llmtrain test_kernels device_rates ranks_in_process)
limit_mib=60
cache=${BUNDLE_CACHE:-.cache/gpu_bundle}

fail() {
  echo "gpu_bundle: FAILED: $*" >&2
  exit 1
}
note() { echo "gpu_bundle: $*" >&2; }

if [[ -z ${BUILD:-} ]]; then
  build="build-bundle"
  launchers=()
  command -v ccache >/dev/null && launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLMTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90-real}" \
    -DLLMTRAIN_TESTS=ON -DLLMTRAIN_UNITY=ON "${launchers[@]}" >/dev/null || fail "cmake could not configure $build"
else
  build=$BUILD
fi
[[ -f $build/CMakeCache.txt ]] || fail "$build is not a CMake build directory (no CMakeCache.txt)"
build=$(cd "$build" && pwd)
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
simulator=no
[[ $(cache_value LLMTRAIN_CUDA | tr '[:lower:]' '[:upper:]') == SIM ]] && simulator=yes
version_h=$build/generated/llmtrain_version.h
[[ -f $version_h ]] || fail "$build has no generated/llmtrain_version.h: not a build of llmtrain"
archs=$(sed -n 's/^#define LLMTRAIN_CUDA_ARCHS "\(.*\)"/\1/p' "$version_h")
[[ $simulator == yes || -n $archs ]] || fail "$build is built without the CUDA backend (LLMTRAIN_CUDA=OFF): nothing to check on a GPU"

# A target exists when CMake lists its CMakeFiles/<target>.dir; its binary lies in that folder or,
# with RUNTIME_OUTPUT_DIRECTORY (llmtrain), at the top of the build.
present=()
declare -A binary_of=()
for t in "${targets[@]}"; do
  dir=$(sed -n "s|/CMakeFiles/$t\.dir\$||p" "$build/CMakeFiles/TargetDirectories.txt" | head -1)
  if [[ -z $dir ]]; then
    [[ $t == llmtrain ]] && fail "$build has no llmtrain target"
    note "no target $t in $build (not in this tree yet?): skipped"
    continue
  fi
  present+=("$t")
  binary_of[$t]=${dir#"$build"}/$t
done
if [[ ${NO_BUILD:-0} != 1 ]]; then
  cmake --build "$build" -j "${LLMTRAIN_JOBS:-$(nproc)}" --target "${present[@]}" >"$build/gpu_bundle-build.log" 2>&1 ||
    fail "building ${present[*]} in $build (log: $build/gpu_bundle-build.log)"
fi
for t in "${present[@]}"; do
  [[ -x $build/${binary_of[$t]} ]] || binary_of[$t]=/$t
  [[ -x $build/${binary_of[$t]} ]] || fail "no $t binary in $build (cmake --build $build --target $t)"
  binary_of[$t]=${binary_of[$t]#/}
done

stage=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/llmtrain-bundle
mkdir -p "$root/lib"
for t in "${present[@]}"; do
  install -D -m 755 "$build/${binary_of[$t]}" "$root/${binary_of[$t]}"
  strip --strip-debug "$root/${binary_of[$t]}"  # the symbol table stays, for readable backtraces
done

# The libraries: every one ldd resolves for a binary (ldd lists the indirect ones too), but those
# the GPU machine brings itself.
glibc='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|dl|pthread|rt|resolv|util|anl|mvec|nsl|BrokenLocale|thread_db)\.so\.[0-9]+)$'
device_own='^lib(cuda|nvidia-[a-z-]+|cudart|cublas|cublasLt|nccl)\.so(\.[0-9]+)*$'
declare -A packed=()
for t in "${present[@]}"; do
  while read -r name arrow path _; do
    [[ $name =~ $glibc || $name =~ $device_own || -n ${packed[$name]:-} ]] && continue
    [[ $name == /* ]] && continue  # the interpreter, by path
    [[ $arrow == "=>" && $path == /* ]] || fail "${binary_of[$t]} needs $name, which ldd does not find here ($arrow $path)"
    cp -L "$path" "$root/lib/$name"
    packed[$name]=$path
  done < <(ldd "$build/${binary_of[$t]}")
done

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
tree=clean
[[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && tree="with uncommitted changes"
binary_says=$("$build/llmtrain" --version 2>&1 | head -1 || true)
kind=gpu
[[ $simulator == yes ]] && kind=sim
output=${OUTPUT:-bundle/llmtrain-$kind.tar.xz}
{
  echo "# llmtrain bundle for scripts/gpu_check.sh, made by scripts/gpu_bundle.sh (docs/cuda.md, \"On a GPU\")."
  echo "# Run it on the GPU machine from a checkout of the commit below (the check's scripts, recipes and"
  echo "# data come from there; nothing is built there):"
  echo "#   BUNDLE=path/to/$(basename "$output") scripts/gpu_check.sh       (PARTS=\"1 2 3\": at most 6 minutes)"
  echo "commit=$commit"
  echo "tree=$tree"
  echo "binary=$binary_says"
  echo "build_type=$(cache_value CMAKE_BUILD_TYPE)"
  echo "cuda_archs=$([[ $simulator == yes ]] && echo none || echo "$archs")"
  echo "simulator=$simulator"
  echo "made=$(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
  echo "binaries=$(for t in "${present[@]}"; do printf '%s ' "${binary_of[$t]}"; done | sed 's/ $//')"
  echo "libraries=$(printf '%s\n' "${!packed[@]}" | sort | paste -sd ' ' -)"
} >"$root/README"

# The libraries' stream (cached by checksum), then the rest's; see the header.
mkdir -p "$cache" "$(dirname "$output")"
key=$( (cd "$root/lib" && sha256sum -- * | sha256sum) | cut -c1-16)
libs=$cache/lib-$key.tar.xz
if [[ ! -s $libs ]]; then
  tar -b1 --sort=name --owner=0 --group=0 --numeric-owner -cf "$stage/lib.tar" -C "$stage" llmtrain-bundle/lib
  [[ $(tail -c 1024 "$stage/lib.tar" | tr -d '\0' | wc -c) == 0 ]] || fail "tar did not end the libraries' part with two zero blocks"
  head -c -1024 "$stage/lib.tar" | xz -9 -T1 >"$libs.$$"
  mv "$libs.$$" "$libs"
fi
find "$cache" -name 'lib-*.tar.xz' -mtime +14 -delete
touch "$libs"
{
  cat "$libs"
  tar --sort=name --owner=0 --group=0 --numeric-owner -cf - -C "$stage" --exclude=llmtrain-bundle/lib llmtrain-bundle |
    xz -9 -T1
} >"$output.$$"
mv "$output.$$" "$output"

size=$(stat -c %s "$output")
if ((size > limit_mib * 1048576)); then
  rm -f "$output"
  fail "the bundle is $((size / 1048576)) MiB, above the ${limit_mib} MiB a lent GPU machine can carry; removed $output"
fi
echo "gpu_bundle: $output, $(awk -v s="$size" 'BEGIN { printf "%.1f MiB", s / 1048576 }') (limit ${limit_mib} MiB):" \
  "${present[*]} and ${#packed[@]} libraries from $build ($kind build, archs ${archs:-none}, commit ${commit:0:9}, tree $tree)"
echo "gpu_bundle: on the GPU machine: BUNDLE=$output scripts/gpu_check.sh"
