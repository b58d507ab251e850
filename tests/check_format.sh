#!/usr/bin/env bash
# Every C++/CUDA source in the tree is formatted by the repo's .clang-format.
set -euo pipefail
src=${2:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$src"
command -v clang-format >/dev/null || { echo "clang-format not found: run scripts/setup.sh"; exit 1; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cpp' '*.h' '*.cu' '*.cuh' 2>/dev/null ||
  find . -path ./build -prune -o \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
bad=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'not clang-formatted (run: clang-format -i FILE):\n'; printf '  %s\n' "${bad[@]}"; exit 1
fi
echo "format: ${#files[@]} files ok"
