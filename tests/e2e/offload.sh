#!/usr/bin/env bash
# parallel.offload: nvme under real `mpirun` (issue 42's checks on CPU ranks): bf16 GPT-2 at dp 2 with
# ZeRO 1 keeps its optimizer state (moments and fp32 master) in a file per rank and trains BITWISE
# as without offload (losses, and every checkpointed slice, moments included, by checksum), with
# the memory plan measured; so do tp 2, pp 2 and ZeRO 3 with offload_params, of a dense and of a
# mixture-of-experts model (8 steps each); an I/O error injected into rank 1's file ends the run naming the file,
# and the run resumes from the checkpoint before it, back on the uninterrupted trajectory; a disk
# without room for the state is refused before any rank starts.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: offload
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 64}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 20, micro_batch: 2, global_batch: 8, seed: 7, threads: 1, grad_clip: 1.0, precision: bf16}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 5}
parallel: {zero: 1}
checkpoint: {every: 10, keep: 5}
eval: {every: 10, batches: 1}
log: {every: 1}
YAML
nvme=(--set parallel.offload=nvme --set parallel.offload_path=scratch)

run_cmd in-memory mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=in-memory
expect_status 0
run_cmd nvme mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=nvme "${nvme[@]}"
expect_status 0
expect_out_re "optimizer state offloaded \(parallel.offload nvme\): .* in .*/scratch/llmtrain-offload-rank0-pid[0-9]+.state"
plan=$(grep -o 'memory per rank: .*' <<<"$out" | sed 's/memory per rank: //')
measured=$(grep -o 'measured after the first step: .*' <<<"$out" | sed 's/.*first step: //')
grep -q "disk (offload_path): optimizer state" <<<"$plan" && pass "the plan counts the state on disk: $plan" ||
  fail "no disk bytes in the plan: $plan"
# The measurement sees this process's memory only: the plan without its disk part.
[[ -n $measured && ${plan%; disk*} == "$measured" ]] && pass "measured memory is the plan's in-memory part" ||
  fail "plan '$plan', measured '$measured'"
[[ -z $(ls -A scratch) ]] && pass "no offload file left behind" || fail "left in scratch: $(ls -A scratch)"
out=$($PY "$SRC/tests/e2e/compare_runs.py" nvme in-memory --val --tol 0 2>&1) &&
  pass "nvme offload trains bitwise as in memory: $out" || fail "nvme offload differs: $out"
# Every slice each rank wrote (parameters = the fp32 master, both moments) by its checksum.
same_slices() {
  $PY - "$1" "$2" <<'PY'
import json, sys
def slices(d):
    m = json.load(open(d))
    return {(t["name"], t["role"], s["begin"], str(s["offset"])): s["crc32c"] for t in m["tensors"] for s in t["slices"]}
a, b = slices(sys.argv[1]), slices(sys.argv[2])
assert a == b and any(k[1] == "adam_v" for k in a), "slices differ"
print(len(a), "slices")
PY
}
out=$(same_slices nvme/ckpt/step_00000020/manifest.json in-memory/ckpt/step_00000020/manifest.json 2>&1) &&
  pass "checkpoints with and without offload are bitwise the same: $out" || fail "checkpoints differ: $out"

# Tensor and pipeline parallelism (each rank's optimizer state is its own) and ZeRO 3 with
# offload_params (the owned values in the file too), also of a mixture-of-experts model at ep 2 (4
# experts, top 2: ZeRO 3's shards hold every expert): bitwise as the same layout in memory, 8 steps.
moe="--set model.family=llama --set model.moe.experts=4 --set model.moe.top_k=2 --set model.moe.ffn_hidden=64"
for cfg in "tp2 --set parallel.tp=2 --set parallel.zero=0" "pp2 --set parallel.pp=2 --set parallel.zero=0" \
  "z3 --set parallel.zero=3 --set parallel.bucket_mb=0.05" \
  "z3-moe-ep2 --set parallel.zero=3 --set parallel.bucket_mb=0.05 --set parallel.ep=2 $moe"; do
  set -- $cfg
  name=$1; shift
  extra=("$@")
  [[ $name == z3* ]] && with=(--set parallel.offload_params=true) || with=()
  run_cmd $name-in-memory mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=$name-in-memory --set train.steps=8 \
    --set checkpoint.every=0 "${extra[@]}"
  expect_status 0
  run_cmd $name-nvme mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=$name-nvme --set train.steps=8 \
    --set checkpoint.every=0 "${extra[@]}" "${nvme[@]}" "${with[@]}"
  expect_status 0
  out=$($PY "$SRC/tests/e2e/compare_runs.py" $name-nvme $name-in-memory --last 8 --tol 0 2>&1) &&
    pass "$name: nvme offload${with:+ with offload_params} trains bitwise as in memory: $out" ||
    fail "$name: nvme offload differs: $out"
done

# An I/O error on rank 1's state file in step 13's update (the fault arms after step 12): the run
# ends naming the file; step 10's checkpoint is intact, and the run resumes from it.
# (llmtrain's own launcher: it returns once every rank is gone, so the resumed run finds the
# checkpoint directory's lock free.)
run_cmd io-error env LLMTRAIN_FAULT=offload-io-error@12:1 "$LLMTRAIN" run r.yaml --nproc 2 --set log.dir=io-error \
  "${nvme[@]}"
[[ $status != 0 ]] && pass "io-error: the run failed (exit $status)" || fail "io-error: exit 0"
expect_out_re "optimizer state file .*/scratch/llmtrain-offload-rank1-pid[0-9]+.state( \(unnamed, O_TMPFILE\))?: writing unit [0-9]+ .*Input/output error"
run_cmd io-error-resumed "$LLMTRAIN" run r.yaml --nproc 2 --set log.dir=io-error "${nvme[@]}"
expect_status 0
expect_out "at step 10"
out=$($PY "$SRC/tests/e2e/compare_runs.py" io-error in-memory --first 11 --tol 0 2>&1) &&
  pass "resumed after the I/O error on the uninterrupted trajectory: $out" || fail "resumed run differs: $out"

# A state larger than the disk (a 1.6e11-parameter model: 1.8 TiB of fp32 moments per rank) is
# refused before any rank starts, naming the path, what it needs and what is free.
run_cmd no-room "$LLMTRAIN" run r.yaml --set log.dir=no-room "${nvme[@]}" --set model.layers=48 \
  --set model.hidden=16384 --set model.heads=128 --set parallel.zero=0 --set train.precision=fp32
expect_status 2
expect_out_re "parallel.offload_path .*/scratch: the optimizer state of this host's ranks needs .* per rank\), its file system has .* free"
finish
