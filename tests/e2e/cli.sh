#!/usr/bin/env bash
# The CLI as a user meets it: version, help with examples for every subcommand, validate on every
# shipped recipe and on a broken one, run --dry-run's plan, refusals of what is not built yet, env.
source "$(dirname "$0")/lib.sh"

run_cmd version "$LLMTRAIN" --version
expect_status 0; expect_out_re '^llmtrain [0-9]+\.[0-9]+\.[0-9]+ \(commit '

run_cmd help "$LLMTRAIN" --help
expect_status 0; expect_out "Examples:"
for sub in validate run sbatch env; do
  run_cmd "help-$sub" "$LLMTRAIN" "$sub" --help
  expect_status 0; expect_out "Example"
done

run_cmd no-subcommand "$LLMTRAIN"
expect_status 2

run_cmd unknown-subcommand "$LLMTRAIN" frobnicate
expect_status 2

for r in "$SRC"/recipes/*.yaml; do
  run_cmd "validate-$(basename "$r")" "$LLMTRAIN" validate "$r"
  expect_status 0; expect_out "name: "
done

# The resolved recipe is valid YAML that validates to itself.
"$LLMTRAIN" validate "$SRC/recipes/tiny.yaml" >resolved.yaml 2>/dev/null
run_cmd validate-resolved "$LLMTRAIN" validate resolved.yaml
expect_status 0
diff <(echo "$out") resolved.yaml >/dev/null && pass "resolved recipe is a fixed point" || fail "resolved recipe changes when validated again"

cat >bad.yaml <<'YAML'
name: bad
model:
  family: gpt2
  layers: 4
  hidden: 130
  heads: 4
  seq_len: 64
data: {train: data/x}
train: {steps: 10, micro_batch: 2, stpes: 3}
YAML
run_cmd validate-bad "$LLMTRAIN" validate bad.yaml
expect_status 2
expect_out "bad.yaml:9:"
expect_out "train.stpes: unknown key"
expect_out "did you mean train.steps?"

# Cross-field rules run once the schema is clean.
sed -i 's/, stpes: 3//' bad.yaml
run_cmd validate-bad-layout "$LLMTRAIN" validate bad.yaml
expect_status 2
expect_out "bad.yaml:6:3: model.heads: hidden 130 is not divisible by heads 4"

run_cmd validate-set "$LLMTRAIN" validate "$SRC/recipes/tiny.yaml" --set train.steps=30 --set optimizer.lr=3e-4 \
  --set optimizer.warmup=10
expect_status 0; expect_out "steps: 30"; expect_out "lr: 0.0003"

run_cmd validate-set-bad "$LLMTRAIN" validate "$SRC/recipes/tiny.yaml" --set train.steps=lots
expect_status 2; expect_out "--set train.steps=lots: train.steps: expected a positive integer"

run_cmd validate-missing "$LLMTRAIN" validate nowhere.yaml
expect_status 2; expect_out "nowhere.yaml: cannot read the recipe file"

run_cmd dry-run-8b "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --dry-run
expect_status 0
expect_out "world: 8 ranks = tp 2 × pp 1 × dp 4 = 8"
expect_out "tp groups:      [0 1] [2 3] [4 5] [6 7]"
expect_out "dp groups:      [0 2 4 6] [1 3 5 7]"
expect_out "parameters: 8.03B (8030261248)"
expect_out "training FLOPs per token:"
expect_out "32 micro-batches per step"
expect_out "launch command: mpirun -np 8"

run_cmd dry-run-70b "$LLMTRAIN" run "$SRC/recipes/llama-70b.yaml" --dry-run
expect_status 0
expect_out "world: 64 ranks = tp 8 × pp 4 × dp 2 = 64"
expect_out "cannot launch from here"

run_cmd run-70b "$LLMTRAIN" run "$SRC/recipes/llama-70b.yaml"
expect_status 2; expect_out "error:"

run_cmd env "$LLMTRAIN" env
expect_status 0
expect_out_re "cores: +[0-9]+ online"
expect_out "mpi:       Open MPI"
expect_out "blas:      OpenBLAS"
expect_out_re "cuda: "
expect_out_re "nccl: "

finish
