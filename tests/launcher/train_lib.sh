# Helpers for the launcher tests that train for real (tests/launcher/train_*.sh), on top of
# tests/launcher/lib.sh: the ranks run `llmtrain run` itself, not the test job program.
#
#   prep_data                    fortunes text -> data/train, data/valid (byte tokenizer), in $WORK
#   write_recipe FILE STEPS      a small, fast model (gpt2, 2 layers, hidden 64, seq 64; ~10 ms a
#                                step on 4 ranks), global batch 8 = micro-batch 2 × 4 ranks (or × 4
#                                accumulation steps on one rank), one thread per rank, every step logged
#   compare_losses A B [FIRST]   the "loss" of every step of run dir A's metrics.jsonl equals B's
#                                within 1e-5 (relative), from step FIRST on; every step present once
#                                in both; prints a summary (steps compared, worst difference, final loss)
#   rank_process SUP RANK        the pid of world rank RANK among the children of the mpirun that the
#                                supervisor SUP started (read from each rank's OMPI_COMM_WORLD_RANK)
#   wait_file FILE SECONDS       waits until FILE exists (fails the test on timeout)
#   wait_ranks_listening SUP N SECONDS
#                                waits until the N rank processes under SUP's mpirun catch SIGUSR1
#                                (/proc/PID/status SigCgt): the stop relay, installed first thing in
#                                a rank, is in place
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PY=/usr/bin/python3

prep_data() {
  "$LLMTRAIN" prep --input $(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese) --separator % \
    --tokenizer byte --output data/ --valid-fraction 0.05 >prep.out 2>&1 || {
    fail "llmtrain prep: $(cat prep.out)"
    finish
  }
}

write_recipe() {
  cat >"$1" <<YAML
name: launch
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 64}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: $2, micro_batch: 2, global_batch: 8, seed: 7, threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 5}
checkpoint: {every: 20, keep: 3}
eval: {every: 0, batches: 1}
log: {every: 1, peak_tflops: 1}
YAML
}

compare_losses() {
  $PY - "$1" "$2" "${3:-1}" <<'PY'
import json, sys
a, b, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
def losses(d):
    steps = [r for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r]
    got = [r["step"] for r in steps]
    assert got == list(range(1, len(got) + 1)), f"{d}: steps are not 1..N, each once: {got}"
    return {r["step"]: r["loss"] for r in steps}
la, lb = losses(a), losses(b)
assert la.keys() == lb.keys(), f"{a} has steps 1..{len(la)}, {b} 1..{len(lb)}"
steps = [s for s in la if s >= first]
assert steps, "no steps to compare"
rel = {s: abs(la[s] - lb[s]) / abs(lb[s]) for s in steps}
bad = [(s, la[s], lb[s]) for s in steps if rel[s] > 1e-5]
assert not bad, f"losses differ by more than 1e-5 (step, {a}, {b}): {bad[:4]}"
last = max(steps)
print(f"steps {first}..{last}: worst relative difference {max(rel.values()):.1e}; final loss {la[last]!r} vs {lb[last]!r}")
PY
}

rank_process() {
  local mpirun pid
  mpirun=$(pgrep -P "$1" -x mpirun | head -1)
  [[ -n $mpirun ]] || return 1
  for pid in $(pgrep -P "$mpirun"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$pid"; return 0; }
  done
  return 1
}

wait_file() {
  local t0=$SECONDS seconds=$(($2 * LT_TIME_SCALE))
  until [[ -e $1 ]]; do
    ((SECONDS - t0 >= seconds)) && { fail "$1 did not appear within ${seconds}s"; return 1; }
    sleep 0.02
  done
}

wait_ranks_listening() {
  local t0=$SECONDS mpirun pid n mask seconds=$(($3 * LT_TIME_SCALE))
  while :; do
    n=0
    mpirun=$(pgrep -P "$1" -x mpirun | head -1)
    for pid in $([[ -n $mpirun ]] && pgrep -P "$mpirun"); do
      mask=$(awk '/^SigCgt:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
      [[ -n $mask ]] && (((0x$mask >> 9) & 1)) && n=$((n + 1))  # bit 9: SIGUSR1 (10)
    done
    ((n >= $2)) && return 0
    ((SECONDS - t0 >= seconds)) && { fail "only $n of $2 ranks catch SIGUSR1 after ${seconds}s"; return 1; }
    sleep 0.01
  done
}
