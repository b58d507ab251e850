#!/usr/bin/env bash
# `llmtrain run` under the user's own mpirun, where every process is a rank and parses the recipe
# before MPI exists: an error every rank meets alike (the recipe's content, what this build cannot
# run) is printed once, by rank 0, and the job still exits with its status; an error of a rank's own
# I/O (a recipe file it cannot read) is printed by every rank that meets it; missing data is refused
# by rank 0 before it creates the run directory.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"

# run_np NAME NP ARGS...: `mpirun -np NP llmtrain ARGS...`, bounded; $status and $out as run_cmd.
run_np() {
  local name=$1 np=$2
  shift 2
  run_cmd "$name" mpi_run 60 "$np" "$LLMTRAIN" "$@"
}
# expect_count N TEXT: exactly N lines of the output contain TEXT.
expect_count() {
  local n
  n=$(grep -cF -- "$2" <<<"$out")
  [[ $n == "$1" ]] && pass "$last_name: $1 line(s) say \"$2\"" || fail "$last_name: expected $1 line(s) saying \"$2\", found $n; output:
$out"
}

cat >bad.yaml <<'YAML'
name: bad
model: {family: gpt2, layers: 2, hidden: 130, heads: 4, seq_len: 64}
data: {train: data/x}
train: {steps: 10, micro_batch: 2}
YAML
for np in 2 3; do
  run_np "bad-recipe-np$np" "$np" run bad.yaml
  expect_status 2
  expect_count 1 "model.heads: hidden 130 is not divisible by heads 4"
  expect_count 1 "1 error in the recipe"
done

run_np unsupported 2 run "$SRC/recipes/tiny.yaml" --set parallel.pp=2 --set parallel.pp_schedule=zero_bubble \
  --set train.activation_checkpointing=full
expect_status 2
expect_count 1 "error: not supported yet: parallel.pp_schedule: zero_bubble with train.activation_checkpointing: full"

run_np unreadable-recipe 2 run nowhere.yaml
expect_status 2
expect_count 2 "nowhere.yaml: cannot read the recipe file"

run_np missing-data 2 run "$SRC/recipes/tiny.yaml" --set data.train=nowhere/train
expect_status 2
expect_count 1 "data.train: dataset $WORK/nowhere/train"
[[ ! -e runs ]] && pass "missing data under mpirun: no run directory created" || fail "missing data left $(find runs)"

finish
