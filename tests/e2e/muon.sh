#!/usr/bin/env bash
# Muon (optimizer.name: muon) end to end under real `mpirun`: a llama model with MoE blocks trains
# with Muon on its hidden matrices (the experts' too) and AdamW on the rest, and every layout takes
# the one-rank run's losses and final parameters within 1e-5 over 10 steps in fp32, its memory line
# the plan's: dp 2, pp 2, cp 2, ep 2, tp 2 with sequence parallelism, tp 4 (key/value heads
# replicated: whole on two ranks each), tp 2 × ep 2, and ZeRO 1, 2 and 3 (pure and hybrid, with
# sharded experts, with tp), their units cut inside matrices (each matrix orthogonalized on one
# owner of its shard group); GPT-2's fused QKV (three matrices) at pp 2 and tp 2 too. ep 2's, pp 2's,
# tp 2's, ZeRO 3's and hybrid ZeRO 2's checkpoints resume at one rank on the one-rank trajectory, and
# one rank's at ZeRO 3. A run killed after its step-5 checkpoint resumes bitwise; its checkpoint
# holds Muon's momentum (role muon_momentum) for the matrices and Adam's moments for the rest; an
# AdamW checkpoint into a Muon run (and back) is refused by name, and loads with load_weights_only;
# bf16 with Muon's products in bf16 trains, and so does a bf16 momentum at dp 2; bf16 at ZeRO 2 and
# 3 stays near bf16 at dp 2. Offload (not built yet) and Muon's keys with AdamW are refused by key.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: muon
model:
  family: llama
  layers: 4
  hidden: 64
  heads: 4
  kv_heads: 2
  seq_len: 32
  moe: {experts: 4, top_k: 2, ffn_hidden: 64, first_dense: 1}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 10, micro_batch: 2, global_batch: 8, seed: 7, threads: 1, grad_clip: 1.0}
optimizer: {name: muon, lr: 0.02, min_lr: 0.002, warmup: 2, muon: {ns_dtype: fp32, adamw_lr: 3.0e-3}}
checkpoint: {every: 5, keep: 5}
eval: {every: 5, batches: 1}
log: {every: 1}
YAML
compare() { $PY "$SRC/tests/e2e/compare_runs.py" "$1" "$2" --first 1 --last 10 --val; }
losses() { $PY -c 'import json,sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    j = json.loads(l)
    if "loss" in j: print(j["step"], repr(j["loss"]))' "$1"; }

run_cmd one mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=one
expect_status 0
# ZeRO's sharding units one block each, so that the shard boundaries cut matrices (Muon then gathers
# each cut matrix's update over the shard group).
units="--set parallel.bucket_mb=0.01"
for cfg in "dp2 2 --set parallel.dp=2" "pp2 2 --set parallel.pp=2" "cp2 2 --set parallel.cp=2" \
  "ep2 2 --set parallel.ep=2" "tp2-sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true" \
  "tp4 4 --set parallel.tp=4" "tp2-ep2 4 --set parallel.tp=2 --set parallel.ep=2" \
  "z1 2 --set parallel.dp=2 --set parallel.zero=1 $units" "z3 2 --set parallel.dp=2 --set parallel.zero=3 $units" \
  "z2-hybrid 4 --set parallel.dp=4 --set parallel.zero=2 --set parallel.zero_group=2 $units" \
  "ep2-z1 4 --set parallel.dp=4 --set parallel.ep=2 --set parallel.zero=1 $units" \
  "tp2-z2 4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=2 $units"; do
  set -- $cfg
  name=$1 n=$2
  shift 2
  run_cmd $name mpi_run 180 $n "$LLMTRAIN" run r.yaml --set log.dir=$name "$@"
  expect_status 0
  # The memory account counts Muon's workspace (with ZeRO's piece buffer) as the run allocates it.
  plan=$(grep -o 'memory per rank: .*' <<<"$out" | head -1 | sed 's/memory per rank: //')
  measured=$(grep -o 'measured after the first step: .*' <<<"$out" | head -1 | sed 's/.*first step: //')
  [[ -n $plan && $plan == "$measured" ]] && pass "muon $name: measured memory is the plan ($plan)" ||
    fail "muon $name: plan '$plan', measured '$measured'"
  out=$(compare $name one 2>&1) && pass "muon $name matches one rank: $out" || fail "muon $name differs from one rank: $out"
done
# GPT-2: c_attn [3, d, d] is three matrices.
sed -e 's/family: llama/family: gpt2/' -e '/kv_heads:/d' -e '/moe:/d' r.yaml >g.yaml
run_cmd gpt-one mpi_run 180 1 "$LLMTRAIN" run g.yaml --set log.dir=gpt-one
expect_status 0
for cfg in "pp2 --set parallel.pp=2" "tp2 --set parallel.tp=2"; do
  set -- $cfg
  name=$1
  shift
  run_cmd gpt-$name mpi_run 180 2 "$LLMTRAIN" run g.yaml --set log.dir=gpt-$name "$@"
  expect_status 0
  out=$(compare gpt-$name gpt-one 2>&1) && pass "muon gpt2 $name matches one rank: $out" || fail "muon gpt2 $name: $out"
done

# The checkpoint: Muon's momentum for the matrices, Adam's moments for the rest.
$PY - one/ckpt/step_00000010/manifest.json <<'PY' && pass "the checkpoint holds muon_momentum for the hidden matrices, adam_m/adam_v for the rest" ||
import json, sys
roles = {}
for t in json.load(open(sys.argv[1]))["tensors"]:
    roles.setdefault(t["name"], set()).add(t["role"])
mom = sorted(n for n, r in roles.items() if "muon_momentum" in r)
adam = sorted(n for n, r in roles.items() if "adam_m" in r)
assert any("q_proj" in n for n in mom) and any("experts" in n or "w1" in n for n in mom), mom
assert any("embed" in n for n in adam) and any("norm" in n for n in adam) and any("gate.weight" in n for n in adam), adam
assert not any("adam_v" in roles[n] or "adam_m" in roles[n] for n in mom), "a matrix with Adam's moments"
PY
  fail "the Muon checkpoint's roles"

# Another layout's checkpoint: ep 2's, pp 2's, tp 2's, ZeRO 3's and hybrid ZeRO 2's step 5 resume at one rank, on one rank's trajectory.
for from in ep2 pp2 tp2-sp z3 z2-hybrid; do
  mkdir -p X-$from/ckpt && cp -r $from/ckpt/step_00000005 X-$from/ckpt/ && echo step_00000005 >X-$from/ckpt/latest
  run_cmd "$from at one rank" "$LLMTRAIN" run r.yaml --set log.dir=X-$from
  expect_status 0
  expect_out "resuming from"
  out=$($PY "$SRC/tests/e2e/compare_runs.py" X-$from one --first 6 --last 10 --val 2>&1) &&
    pass "muon $from's checkpoint resumes at one rank on its trajectory: $out" || fail "muon $from resumed at one rank: $out"
done

# And one rank's step 5 resumes at ZeRO 3 over dp 2 (each rank reading its pieces of the momentum).
mkdir -p X-to-z3/ckpt && cp -r one/ckpt/step_00000005 X-to-z3/ckpt/ && echo step_00000005 >X-to-z3/ckpt/latest
run_cmd "one rank's checkpoint at ZeRO 3" mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=X-to-z3 \
  --set parallel.dp=2 --set parallel.zero=3 $units
expect_status 0
expect_out "resuming from"
out=$($PY "$SRC/tests/e2e/compare_runs.py" X-to-z3 one --first 6 --last 10 --val 2>&1) &&
  pass "muon: one rank's checkpoint resumes at ZeRO 3 on its trajectory: $out" || fail "muon one rank at ZeRO 3: $out"

# Bitwise resume: killed after step 7, resumed from step 5.
run_cmd killed env LLMTRAIN_FAULT=kill@7 "$LLMTRAIN" run r.yaml --set log.dir=R
expect_status 137
run_cmd resumed "$LLMTRAIN" run r.yaml --set log.dir=R
expect_status 0
expect_out "resuming from"
diff <(losses one) <(losses R) >/dev/null && pass "the resumed Muon run's losses equal the uninterrupted run's, bitwise" ||
  fail "Muon resume diverged: $(diff <(losses one) <(losses R) | head -6)"

# An AdamW checkpoint into Muon, and back: refused by name; load_weights_only starts fresh from it.
run_cmd adamw "$LLMTRAIN" run r.yaml --set log.dir=A --set optimizer.name=adamw --set optimizer.lr=3e-3 \
  --set optimizer.min_lr=3e-4 --set optimizer.muon.ns_dtype=bf16 --set optimizer.muon.adamw_lr=auto
expect_status 0
run_cmd adamw-into-muon "$LLMTRAIN" run r.yaml --set log.dir=A --set train.steps=12
expect_status 2
expect_out "optimizer.name is adamw there and muon in this recipe"
run_cmd muon-into-adamw "$LLMTRAIN" run r.yaml --set log.dir=one --set train.steps=12 --set optimizer.name=adamw \
  --set optimizer.muon.ns_dtype=bf16 --set optimizer.muon.adamw_lr=auto --allow-change all
expect_status 2
expect_out "optimizer.name is muon there and adamw in this recipe"
run_cmd weights-only "$LLMTRAIN" run r.yaml --set log.dir=W --set checkpoint.resume=A/ckpt/step_00000010 \
  --set checkpoint.load_weights_only=true
expect_status 0
expect_out "fine-tuning from the weights of"

# bf16 training, Muon's products in bf16 (PyTorch's default).
run_cmd bf16 "$LLMTRAIN" run r.yaml --set log.dir=B --set train.precision=bf16 --set optimizer.muon.ns_dtype=bf16
expect_status 0
$PY - one B <<'PY' && pass "bf16 Muon's losses stay within 2% of fp32's" || fail "bf16 Muon against fp32"
import json, sys
losses = lambda d: [r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 10 and all(abs(x - y) <= 0.02 * x for x, y in zip(a, b)), list(zip(a, b))
PY

# The momentum in bf16 (optimizer.state_dtype: widened, updated in fp32, stored rounded), at dp 2.
run_cmd bf16-state mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=S --set optimizer.state_dtype=bf16 --set parallel.dp=2
expect_status 0
$PY - one S <<'PY' && pass "Muon with bf16 momentum at dp 2 stays within 1% of fp32 momentum's losses" || fail "bf16 momentum"
import json, sys
losses = lambda d: [r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 10 and all(abs(x - y) <= 0.01 * x for x, y in zip(a, b)), list(zip(a, b))
PY

# bf16 at ZeRO 2 (the fp32 master's pieces) and 3 (compact fp32 values) near bf16 at dp 2. In bf16
# Muon carries rounding into every element through its orthogonalized steps: ZeRO 1 and 2 measured
# 1.2e-2 and 1.9e-2 from dp 2 in the parameters after 10 steps, dp 2 2.0e-2 from one rank, losses
# within 1.4e-4 (in fp32 every layout above is within 1e-6); a matrix's update lost or misplaced
# moves the parameters by their whole size.
for z in 0 2 3; do
  run_cmd bf16-z$z mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=BZ$z --set train.precision=bf16 \
    --set optimizer.muon.ns_dtype=bf16 --set parallel.dp=2 --set parallel.zero=$z $units
  expect_status 0
done
for z in 2 3; do
  out=$($PY "$SRC/tests/e2e/compare_runs.py" BZ$z BZ0 --first 1 --last 10 --tol 2e-3 --param-tol 6e-2 2>&1) &&
    pass "bf16 Muon at ZeRO $z follows bf16 at dp 2: $out" || fail "bf16 Muon at ZeRO $z: $out"
done

# Not built yet, or a mistake: refused by key before any rank starts.
run_cmd offload "$LLMTRAIN" run r.yaml --dry-run --nproc 2 --set parallel.dp=2 --set parallel.zero=1 \
  --set parallel.offload=host
expect_status 2
expect_out "not supported yet: muon with parallel.offload"
run_cmd muon-key-adamw "$LLMTRAIN" run r.yaml --dry-run --set optimizer.name=adamw
expect_status 2
expect_out "belongs to Muon, and optimizer.name is adamw"

finish
