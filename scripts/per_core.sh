# Sourced by scripts/fuzz.sh and scripts/sanitize.sh: run one function over a list of items, at most
# LLMTRAIN_JOBS (default: one per core) at once.
#
#   per_core FUNCTION ITEM...   calls FUNCTION ITEM for each item in the background, starting the
#                               next one when one ends; returns 1 if any call failed, after all end.
per_core() {
  local fn=$1 jobs=${LLMTRAIN_JOBS:-$(nproc)} running=0 status=0 item
  shift
  for item in "$@"; do
    if ((running >= jobs)); then
      wait -n || status=1
      ((running--))
    fi
    "$fn" "$item" &
    ((++running))
  done
  while ((running > 0)); do
    wait -n || status=1
    ((running--))
  done
  return $status
}
