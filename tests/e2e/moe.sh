#!/usr/bin/env bash
# Mixture of experts under real `mpirun`: a llama model with MoE blocks (a dense first layer, then 4
# experts, top 2, dropless) trains to the one-rank run's losses and parameters over 15 steps at dp 2
# (ZeRO 0, 1 and 3), pp 2, tp 2 with sequence parallelism, cp 2 (ring and Ulysses: the
# load-balancing loss of the whole sequences, as at one rank), with selective and full
# recomputation, and with expert parallelism: ep 2 and 4, ep 2 × tp 2 (sequence parallel), ep 2 × pp 2, ep 2 with ZeRO
# 1 and 3, ep 2 × cp 2 (at ZeRO 0/1 each rank holds only its experts); with a capacity factor that
# drops picks, dp 2 and ep 2 drop the same ones (the same losses and routing metrics, which
# `llmtrain plot` draws); checkpoints written at dp 2 with ZeRO 1 and at ep 4 resume at one rank,
# and the dp 2 one at ep 2, on the same trajectory; --dry-run reports the active parameters and the
# expert-parallel groups; layouts not built yet are refused by name.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/parallel/mpi_env.sh"
use_python
prep_fortunes

cat >r.yaml <<'YAML'
name: moe
model:
  family: llama
  layers: 4
  hidden: 64
  heads: 4
  kv_heads: 2
  seq_len: 32
  moe: {experts: 4, top_k: 2, ffn_hidden: 64, first_dense: 1, aux_loss: 0.05, z_loss: 0.005}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 15, micro_batch: 2, global_batch: 8, seed: 7, threads: 1, grad_clip: 1.0}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 3}
checkpoint: {every: 5, keep: 5}
eval: {every: 5, batches: 1}
log: {every: 1}
YAML

# compare A B [FIRST]: losses and validation losses per step within 1e-5 (relative) from step FIRST,
# and the final parameters (assembled from the checkpoints' slices) within ||a-b||/||b|| <= 1e-5.
compare() {
  $PY "$SRC/tests/e2e/compare_runs.py" "$1" "$2" --first "${3:-1}" --last 15 --val
}

run_cmd dry-run "$LLMTRAIN" run r.yaml --dry-run
expect_status 0
expect_out "moe: 3 of 4 layers, 4 experts (ffn 64), top 2, dropless; active parameters per token"
# Expert parallelism's groups: 2 consecutive ranks of each dp × cp group (tp 2: ranks 0 2 | 4 6, ...).
run_cmd dry-run-ep "$LLMTRAIN" run r.yaml --dry-run --nproc 8 --set parallel.tp=2 --set parallel.ep=2
expect_status 0
expect_out "ep groups:      [0 2] [1 3] [4 6] [5 7]"
expect_out "expert parallel: ep 2, experts 2 per rank"

run_cmd one mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=one
expect_status 0
for cfg in "dp2 2 --set parallel.zero=0" "z1-dp2 2 --set parallel.zero=1" \
  "z3-dp2 2 --set parallel.zero=3 --set parallel.bucket_mb=0.05" "pp2 2 --set parallel.pp=2" \
  "tp2-sp 2 --set parallel.tp=2 --set parallel.sequence_parallel=true" "cp2 2 --set parallel.cp=2" \
  "cp2-ulysses 2 --set parallel.cp=2 --set parallel.cp_comm=all_to_all" \
  "z1-dp2-selective 2 --set parallel.zero=1 --set train.activation_checkpointing=selective" \
  "pp2-full 2 --set parallel.pp=2 --set train.activation_checkpointing=full" \
  "ep2 2 --set parallel.ep=2" "ep4 4 --set parallel.ep=4" "ep2-tp2-sp 4 --set parallel.ep=2 --set parallel.tp=2 --set parallel.sequence_parallel=true" \
  "ep2-pp2 4 --set parallel.ep=2 --set parallel.pp=2" "ep2-z1 2 --set parallel.ep=2 --set parallel.zero=1" \
  "ep2-cp2 2 --set parallel.ep=2 --set parallel.cp=2" "ep2-z3 2 --set parallel.ep=2 --set parallel.zero=3"; do
  set -- $cfg
  name=$1 n=$2
  shift 2
  run_cmd $name mpi_run 180 $n "$LLMTRAIN" run r.yaml --set log.dir=$name "$@"
  expect_status 0
  # Sharded experts (ep 2 at ZeRO 0/1): each rank holds 2 of the 4 experts of each of the 3 MoE
  # blocks, 296,256 − 3 · 2 · 3 · 64 · 64 = 222,528 parameters; at ZeRO 3 the layout holds all.
  case $name in
    ep2 | ep2-z1) expect_out "model: 222.53K parameters on this rank" ;;
    ep2-z3) expect_out "model: 296.26K parameters on this rank" ;;
  esac
  out=$(compare $name one 2>&1) && pass "$name matches one rank: $out" || fail "$name differs from one rank: $out"
done

# A capacity of ⌈1.0 · 64 tokens · 2 / 4⌉ = 32 picks per expert and micro-batch drops the picks an
# expert gets beyond it (on the rank that routes them, before any exchange): each micro-batch drops
# the same picks at dp 2 and at ep 2 as at one rank.
for cfg in "cap1 1" "cap2 2" "cap-ep2 2 --set parallel.ep=2"; do
  set -- $cfg
  name=$1 n=$2
  shift 2
  run_cmd $name mpi_run 180 $n "$LLMTRAIN" run r.yaml --set log.dir=$name --set model.moe.capacity_factor=1.0 "$@"
  expect_status 0
done
out=$(compare cap2 cap1 2>&1) && pass "capacity factor: dp 2 matches one rank: $out" || fail "capacity: $out"
out=$(compare cap-ep2 cap1 2>&1) && pass "capacity factor: ep 2 matches one rank: $out" || fail "capacity ep 2: $out"
# The routing metrics: the same per step at dp 2, cp 2 and ep 2 as at one rank (picks and drops
# exactly, the auxiliary losses to rounding); picks per expert add up to tokens × top_k; drops only
# with a capacity.
out=$($PY - one dp2 cap1 cap2 cp2 ep2 cap-ep2 ep4 ep2-z1 <<'PY' 2>&1
import json, sys
def records(run):
    return {r["step"]: r for r in map(json.loads, open(run + "/metrics.jsonl")) if "loss" in r}
one, dp2, cap1, cap2, cp2, ep2, cap_ep2, ep4, ep2_z1 = (records(r) for r in sys.argv[1:])
# The global gradient norm counts every expert once whether ranks hold all experts or their own.
for run in (ep2, ep4, ep2_z1):
    for s, r in one.items():
        assert abs(run[s]["grad_norm"] - r["grad_norm"]) <= 1e-4 * r["grad_norm"], (s, run[s]["grad_norm"], r["grad_norm"])
layers = (1, 2, 3)
for s, r in one.items():
    for l in layers:
        p = f"moe_l{l}_"
        assert r[p + "tokens_min"] <= 8 * 32 * 2 / 4 <= r[p + "tokens_max"], (s, l, r)
        assert r[p + "dropped"] == 0, (s, l)
        assert r[p + "aux_loss"] > 0 and r[p + "z_loss"] > 0, (s, l)
        for other in (dp2, cp2, ep2):
            for k in ("tokens_min", "tokens_max", "dropped"):
                assert other[s][p + k] == r[p + k], (s, l, k, other[s][p + k], r[p + k])
            for k in ("aux_loss", "z_loss", "tokens_cv"):
                assert abs(other[s][p + k] - r[p + k]) <= 1e-5 * abs(r[p + k]), (s, l, k)
    assert "moe_l0_tokens_min" not in r  # layer 0 is dense
dropped = sum(r["moe_dropped"] for r in cap1.values())
assert dropped > 0, "a capacity factor of 1.0 dropped nothing"
assert all(cap2[s]["moe_dropped"] == r["moe_dropped"] for s, r in cap1.items()), "dp 2 dropped other picks"
assert all(cap_ep2[s]["moe_dropped"] == r["moe_dropped"] for s, r in cap1.items()), "ep 2 dropped other picks"
print(f"{len(one)} steps; layer 1 picks per expert {one[15]['moe_l1_tokens_min']:.0f}..{one[15]['moe_l1_tokens_max']:.0f} "
      f"at step 15; {dropped:.0f} picks dropped over 15 steps at capacity 1.0, the same at dp 2 and ep 2")
PY
) && pass "MoE metrics: $out" || fail "MoE metrics: $out"
out=$(compare cap1 one 2>&1) && fail "capacity factor 1.0 changed nothing: $out" ||
  pass "capacity factor 1.0 drops picks (the run differs from the dropless one)"

# `llmtrain plot` draws the routing fields like any other.
run_cmd plot "$LLMTRAIN" plot one cap1 --metric moe_l1_tokens_cv,moe_l2_dropped,moe_aux_loss -o moe.svg
expect_status 0
[[ -s moe.svg ]] && pass "moe.svg drawn" || fail "no moe.svg"

# A checkpoint written at dp 2 with ZeRO 1 resumes at one rank and continues its trajectory.
mkdir -p resume1/ckpt
cp -r z1-dp2/ckpt/step_00000005 resume1/ckpt/
echo step_00000005 >resume1/ckpt/latest
cp z1-dp2/metrics.jsonl resume1/
run_cmd resume1 mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=resume1
expect_status 0
expect_out "at step 5"
out=$(compare resume1 z1-dp2 6 2>&1) && pass "dp 2 checkpoint resumed at one rank: $out" ||
  fail "dp 2 checkpoint resumed at one rank diverges: $out"
# And one written at ep 4 (each expert by its global index) resumes at ep 1.
mkdir -p resume-ep/ckpt
cp -r ep4/ckpt/step_00000005 resume-ep/ckpt/
echo step_00000005 >resume-ep/ckpt/latest
cp ep4/metrics.jsonl resume-ep/
run_cmd resume-ep mpi_run 180 1 "$LLMTRAIN" run r.yaml --set log.dir=resume-ep
expect_status 0
expect_out "at step 5"
out=$(compare resume-ep ep4 6 2>&1) && pass "ep 4 checkpoint resumed at one rank: $out" ||
  fail "ep 4 checkpoint resumed at one rank diverges: $out"
# And the dp 2 ZeRO 1 one (every expert on every rank) at ep 2 with ZeRO 1 (each rank its 2 experts'
# weights and moments, sharded over its edp group).
mkdir -p resume-ep2/ckpt
cp -r z1-dp2/ckpt/step_00000005 resume-ep2/ckpt/
echo step_00000005 >resume-ep2/ckpt/latest
cp z1-dp2/metrics.jsonl resume-ep2/
run_cmd resume-ep2 mpi_run 180 2 "$LLMTRAIN" run r.yaml --set log.dir=resume-ep2 --set parallel.ep=2 --set parallel.zero=1
expect_status 0
expect_out "at step 5"
out=$(compare resume-ep2 z1-dp2 6 2>&1) && pass "dp 2 checkpoint resumed at ep 2: $out" ||
  fail "dp 2 checkpoint resumed at ep 2 diverges: $out"

# A layout not built yet is refused before any rank starts, by name.
for refused in "parallel.cp=2 model.moe.capacity_factor=1|model.moe.capacity_factor 1 with parallel.cp 2" \
  "parallel.ep=2 parallel.zero=1 parallel.zero_group=1|parallel.ep 2 with parallel.zero_group 1 < dp 2"; do
  sets=() says="${refused#*|}"
  for kv in ${refused%%|*}; do sets+=(--set "$kv"); done
  run_cmd "refuse-${refused%%|*}" "$LLMTRAIN" run r.yaml --nproc 2 "${sets[@]}" --set log.dir=refused
  [[ $status != 0 ]] && pass "refused: exit $status" || fail "${refused%%|*} was not refused"
  [[ ! -e refused/metrics.jsonl ]] && pass "no rank trained" || fail "${refused%%|*}: a rank trained"
  expect_out "not supported yet: $says"
done
finish
