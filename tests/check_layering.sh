#!/usr/bin/env bash
# The layering of docs/architecture.md: a folder may include only the folders below it.
#   cli -> planner -> trainer -> parallel -> kernels -> common;  cli -> launcher -> parallel
# planner/ (the pre-launch tool behind `llmtrain plan` and `run --dry-run`) reads the trainer's
# memory account and model shapes, so it stands above trainer/; nothing but cli/ uses it.
# launcher/ and trainer/ stand side by side: the launcher knows the trainer only through the floor
# below both (the recipe types and checks in common/recipe/, the checkpoint directory layout in
# common/checkpoint_dir.h, the stop signals in common/signals.h); cli/ joins them.
# Inside trainer/, the rooms' rule (below): loop/ uses the others, none of them includes loop/, and
# optim/ does not include checkpoint/.
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

# Inside trainer/, its rooms (trainer/CMakeLists.txt says why each file stands where it does): loop/
# (train() and the step) uses the others, and none of them includes loop/; placement/ (what lives
# where, decided once) stands below loop/ and report/ (which prints its account) and above model/
# and optim/ (whose layouts it reads), so those two do not include it; optim/ (what updates the
# parameters) does not include checkpoint/ (which saves them): the checkpoint side reads optim/.
declare -A room_forbidden=(
  [checkpoint]="loop"
  [report]="loop"
  [placement]="loop report checkpoint"
  [optim]="loop checkpoint placement"
  [data]="loop placement"
  [model]="loop placement"
)
for room in "${!room_forbidden[@]}"; do
  [[ -d trainer/$room ]] || continue
  while IFS= read -r line; do
    file=${line%%:*}
    path=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")
    inc=$(sed -E 's|^trainer/([a-z_]+)/.*|\1|' <<<"$path")
    [[ " ${room_forbidden[$room]} " == *" $inc "* ]] || continue
    echo "layering: $file includes trainer/$inc/ but trainer/$room/ may not (${room_forbidden[$room]// /, })"
    bad=1
  done < <(grep -rHE '^#include "trainer/[a-z_]+/' "trainer/$room" --include='*.cpp' --include='*.h' --include='*.cu' \
    --include='*.cuh' || true)
done
[[ $bad == 0 ]] && echo "layering: ok"
exit $bad
