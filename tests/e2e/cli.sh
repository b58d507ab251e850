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
expect_out "error: unknown command 'frobnicate'"
expect_out "the commands are validate, run, sbatch, env, generate, export, import, ckpt, prep"

for r in "$SRC"/recipes/*.yaml; do
  run_cmd "validate-$(basename "$r")" "$LLMTRAIN" validate "$r"
  expect_status 0; expect_out "name: "
done

# The resolved recipe is valid YAML that validates to itself.
"$LLMTRAIN" validate "$SRC/recipes/tiny.yaml" >resolved.yaml 2>/dev/null
run_cmd validate-resolved "$LLMTRAIN" validate resolved.yaml
expect_status 0
diff <(echo "$out") resolved.yaml >/dev/null && pass "resolved recipe is a fixed point" || fail "resolved recipe changes when validated again"

# Every key of the schema, with its type, default and meaning; a recipe is still required otherwise.
run_cmd validate-keys "$LLMTRAIN" validate --keys
expect_status 0
expect_out "parallel.zero_group  int ≥ 1 or auto  default: auto = dp (zero ≥ 1), 1 (zero 0)"
expect_out "model.family  gpt2 | llama  default: required"
run_cmd validate-no-recipe "$LLMTRAIN" validate
expect_status 2; expect_out "validate needs a recipe file"

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
expect_status 2; expect_out "cannot run: "
expect_out "world: 8 ranks = tp 2 × pp 1 × dp 4 = 8"
expect_out "tp groups:      [0 1] [2 3] [4 5] [6 7]"
expect_out "dp groups:      [0 2 4 6] [1 3 5 7]"
expect_out "parameters: 8.03B (8030261248)"
expect_out "training FLOPs per token:"
expect_out "32 micro-batches per step"
expect_out "activations per rank by train.activation_checkpointing: none 20.7 GiB, selective 13.4 GiB, full 3.2 GiB (this recipe)"
expect_out "launch command: mpirun -np 8"

# torchrun's spelling of --nproc.
run_cmd dry-run-nproc-per-node "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run --nproc_per_node 2
expect_status 2; expect_out "cannot run: "; expect_out "world: 2 ranks = tp 1 × pp 1 × dp 2 = 2"; expect_out "launch command: mpirun -np 2"
# cuda ranks: what moves their device memory (parallel.device_comm), NCCL where this build has it.
run_cmd dry-run-device-comm "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run --nproc 2 --set train.device=cuda
expect_status 2; expect_out "cannot run: "
if "$LLMTRAIN" env | grep -qE '^nccl: +[0-9]'; then
  expect_out_re "^device communication: nccl \(NCCL [0-9.]+\)"
else
  expect_out "device communication: staged (auto: this build has no NCCL)"
fi

# A layout of more ranks than one, with no rank count given: how to start them, not the arithmetic.
run_cmd layout-needs-ranks "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set parallel.tp=2
expect_status 2
expect_out "the layout needs 2 ranks (tp 2 × pp 1, dp auto), but no rank count was given"
expect_out "hint: start 2 ranks: --nproc 2"
run_cmd layout-needs-ranks-dp "$LLMTRAIN" validate "$SRC/recipes/tiny.yaml" --set parallel.dp=4
expect_status 2; expect_out "the layout needs 4 ranks (tp 1 × pp 1 × dp 4)"; expect_out "start 4 ranks: --nproc 4"
# With a rank count the arithmetic stays.
run_cmd layout-vs-nproc "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --nproc 3 --set parallel.tp=2 --dry-run
expect_status 2; expect_out "world size 3 (launch.nodes 1 × launch.procs_per_node 3) is not divisible by tp 2"

# The recipe's data and tokenizer files: listed by the dry run, refused by the run before anything
# is created (data/ does not exist in this scratch folder).
run_cmd dry-run-inputs "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run --set data.tokenizer=tok/tokenizer.json \
  --set model.vocab=300
expect_status 2  # the run it shows would stop: not a success
expect_out_re "data.train\[0\].path +$WORK/data/fortunes/train \(.bin \+ .idx\): MISSING \($WORK/data/fortunes/train.bin and $WORK/data/fortunes/train.idx do not exist\)"
expect_out_re "data.tokenizer +$WORK/tok/tokenizer.json: MISSING"
expect_out "cannot run: 3 inputs are missing"
mkdir -p d && touch d/train.bin d/train.idx
run_cmd dry-run-inputs-there "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run --set data.train=d/train \
  --set data.valid=null
expect_status 0; expect_out_re "data.train +$WORK/d/train \(.bin \+ .idx\)\$"; expect_out_re "data.tokenizer +byte"
[[ $out != *MISSING* && $out != *"cannot run"* ]] && pass "nothing missing" || fail "dry-run-inputs-there: $out"

# A file of the pair given for its prefix: "drop the suffix".
run_cmd dataset-suffix "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set data.train=d/train.bin --set data.valid=null
expect_status 2; expect_out "drop the suffix ($WORK/d/train names $WORK/d/train.bin and $WORK/d/train.idx, which are there)"
run_cmd dataset-suffix-dry "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set data.train=d/train.idx --set data.valid=null \
  --dry-run
expect_status 2; expect_out "the dataset is $WORK/d/train: drop the suffix"
# validate is about the recipe itself: exit 0 with the data missing, saying (as YAML comments) what
# it leaves to where the job runs.
run_cmd validate-missing-data "$LLMTRAIN" validate "$SRC/recipes/tiny.yaml" --set data.train=nowhere/train
expect_status 0
expect_out "# validate checked the recipe itself (exit 0: it is valid). Left to where the job runs"
expect_out_re "^#   data.train +$WORK/nowhere/train \(.bin \+ .idx\): MISSING"
expect_out "#   the devices (train.device cpu), the launch (launcher, hosts, ranks per node), the output folders"
# A run on a device this machine does not have creates nothing (no GPU here: skipped where there is one).
if ! nvidia-smi -L >/dev/null 2>&1; then
  run_cmd no-gpu "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set data.train=d/train --set data.valid=null \
    --set train.device=cuda
  [[ $status != 0 ]] && pass "no-gpu: refused (exit $status)" || fail "no-gpu: ran without a GPU: $out"
  [[ ! -e runs ]] && pass "no-gpu: no run directory created" || fail "no-gpu: left $(find runs)"
fi
# The divisibility error of a rank count names --nproc; torchrun's multi-node flags are refused with
# what to use instead; an empty recipe is one error.
run_cmd nproc-batch "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --nproc 64 --dry-run
expect_status 2
expect_out "(--nproc sets launch.procs_per_node)"
expect_out "start fewer ranks (--nproc)"
for flag in "--nnodes 2" "--node_rank 1" "--master_addr 10.0.0.1" "--master-port 29500"; do
  run_cmd "torchrun${flag%% *}" "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" $flag
  expect_status 2
  expect_out "torchrun's multi-node flag; llmtrain starts the ranks of every node from one command"
done
expect_out "hint: drop it: the rendezvous"
: >empty.yaml
run_cmd empty-recipe "$LLMTRAIN" validate empty.yaml
expect_status 2
expect_out "the recipe is empty"
[[ $(grep -c "^error:" <<<"$out") == 1 ]] && pass "empty-recipe: one error" || fail "empty-recipe: $out"
run_cmd help-ckpt "$LLMTRAIN" ckpt --help
expect_status 0; expect_out "llmtrain ckpt inspect runs/tiny"
[[ $out != *"llmtrain plan recipes"* ]] && pass "help-ckpt: its own examples" || fail "help-ckpt: the top-level examples"

run_cmd missing-data "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set data.train=nowhere/train --set log.every=1
expect_status 2
expect_out "--set data.train=nowhere/train: data.train: dataset $WORK/nowhere/train: $WORK/nowhere/train.bin and"
expect_out_re "tiny.yaml:[0-9]+:[0-9]+: data.valid: dataset $WORK/data/fortunes/valid"
[[ ! -e runs ]] && pass "missing data: no run directory created" || fail "missing data left $(find runs)"
run_cmd missing-data-nproc "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --nproc 2 --set "data.train=[{path: x/t}]"
expect_status 2; expect_out "data.train[0].path: dataset $WORK/x/t"; expect_out "llmtrain prep"
[[ ! -e runs ]] && pass "missing data, 2 ranks: no run directory created" || fail "missing data left $(find runs)"

run_cmd dry-run-70b "$LLMTRAIN" run "$SRC/recipes/llama-70b.yaml" --dry-run
expect_status 2; expect_out "cannot run: "
expect_out "world: 64 ranks = tp 8 × pp 4 × dp 2 = 64"
expect_out "cannot launch from here"

run_cmd run-70b "$LLMTRAIN" run "$SRC/recipes/llama-70b.yaml"
expect_status 2; expect_out "error:"

# sbatch: the recipe's launch.nodes is the default for --nodes; printing the script writes nothing.
run_cmd sbatch-recipe-nodes "$LLMTRAIN" sbatch "$SRC/recipes/llama-70b.yaml"
expect_status 0
expect_out "#SBATCH --nodes=8"; expect_out "--set launch.nodes=8"
expect_out "mkdir -p $WORK/runs/llama-70b"
expect_out_re "# note: from here, data.train\\[0\\].path +$WORK/data/fineweb/train .*: MISSING .*; the job stops unless its nodes see it"
[[ ! -e runs ]] && pass "sbatch printing creates nothing" || fail "sbatch printing created $(find runs)"
run_cmd sbatch-nodes-flag "$LLMTRAIN" sbatch "$SRC/recipes/llama-70b.yaml" --nodes 16 --set parallel.dp=4
expect_status 0; expect_out "#SBATCH --nodes=16"

# Sampling options that greedy decoding ignores are named as such.
run_cmd generate-greedy-top-k "$LLMTRAIN" generate nowhere --temperature 0 --top-k 5
expect_status 2; expect_out "--temperature 0 picks the likeliest token every time: --top-k and --top-p have no effect"

run_cmd env "$LLMTRAIN" env
expect_status 0
expect_out_re "cores: +[0-9]+ online"
expect_out "mpi:       Open MPI"
expect_out "blas:      OpenBLAS"
expect_out_re "cuda: "
expect_out_re "nccl: "

finish
