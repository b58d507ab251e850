#!/usr/bin/env bash
# The layering of docs/architecture.md: a folder may include only the folders below it.
#   cli -> planner -> trainer -> parallel -> kernels -> common;  cli -> launcher -> parallel
# planner/ (the pre-launch tool behind `llmtrain plan` and `run --dry-run`) reads the trainer's
# memory account and model shapes, so it stands above trainer/; nothing but cli/ uses it.
# launcher/ and trainer/ stand side by side: the launcher knows the trainer only through the floor
# below both (the recipe types and checks in common/recipe/, the checkpoint directory layout in
# common/checkpoint_dir.h, the stop signals in common/signals.h); cli/ joins them.
# Fails listing every include that points up or sideways.
set -euo pipefail
src=${2:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$src"
declare -A allowed=(
  [common]=""
  [kernels]="common"
  [parallel]="kernels common"
  [trainer]="parallel kernels common"
  [launcher]="parallel kernels common"
  [planner]="trainer parallel kernels common"
  [cli]="launcher planner trainer parallel kernels common"
)
bad=0
for dir in "${!allowed[@]}"; do
  [[ -d $dir ]] || continue
  while IFS= read -r line; do
    file=${line%%:*}
    inc=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    [[ $inc == "$dir" ]] && continue
    [[ " ${allowed[$dir]} " == *" $inc "* ]] && continue
    [[ -d $inc ]] || continue  # not one of our folders (e.g. a generated header)
    echo "layering: $file includes $inc/ but $dir/ may use only: ${allowed[$dir]:-nothing of ours}"
    bad=1
  done < <(grep -rHE '^#include "[a-z_]+/' "$dir" --include='*.cpp' --include='*.h' --include='*.cu' --include='*.cuh' || true)
done
[[ $bad == 0 ]] && echo "layering: ok"
exit $bad
