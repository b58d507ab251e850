#!/usr/bin/env bash
# Training on the CUDA backend in the SIM build (cmake -DLLMTRAIN_CUDA=SIM: the kernels run in the
# SIMT simulator, docs/cuda.md), against the CPU, end to end:
#  1. recipes/tiny.yaml at seq 64, micro-batch 1, global batch 2: 10 fp32 steps on cuda take the
#     CPU's steps (losses per step and final parameters within 1e-5, relative), with the cuda run's
#     ops profiled (log.profile: ops);
#  2. the cuda run's step-5 checkpoint resumes on cpu (steps 6-10), and the cpu run's step-8 one on
#     cuda (steps 9-10), each continuing on the uninterrupted CPU run's losses (within 1e-5);
#  3. bf16 on cuda takes bf16's CPU steps (3) within 16-bit rounding: losses and parameters within
#     5e-3 (measured: losses 6e-6, parameters 2e-3; Adam turns rounding noise in near-zero gradients
#     into ±lr steps). fp16 is measured in docs/cuda.md, not here: each simulated step costs seconds;
#     with parallel.offload host and nvme, bf16 on cuda takes its own 3 steps bitwise;
#  4. a device per rank: the one-rank run's header names its device; 2 ranks through mpirun on
#     LLMTRAIN_SIM_DEVICES=2 take cuda:0 and cuda:1; on one device they are refused before they
#     start, naming both counts, unless launch.share_devices; a malformed count is an error.
#  5. the llama family's variants (q/k/v biases, q/k norms, head_dim, a sliding window, attention
#     sinks, llama3 RoPE) on cuda take the CPU's 2 fp32 steps;
#  6. MoE blocks on cuda take the CPU's 2 fp32 steps; gpt-oss's and Gemma 3's blocks take them too,
#     and their 2 bf16 steps (Gemma 3's with selective recomputation) within 2e-2; with bf16
#     moments (optimizer.state_dtype) 2 fp32 steps take the CPU's, and with Muon (its Newton–Schulz
#     products through cuBLASLt) too, and 2 bf16 steps of Muon run;
#  7. tests/bench/device_rates writes a rates file on the simulated device that `plan --rates` takes;
#  8. the GPT-2 family on cuda (its MLP's GELU and the bias gradients in cuBLASLt's epilogues) takes
#     the CPU's 2 fp32 steps, and with selective recomputation (act recomputed by gelu_forward).
# Multi-rank training on cuda: tests/e2e/cuda_layouts_sim.sh.
source "$(dirname "$0")/lib.sh"
use_python
prep_fortunes

common=(--set model.seq_len=64 --set train.micro_batch=1 --set train.global_batch=2 --set train.steps=10
        --set train.threads=1 --set parallel.dp=1 --set data.train=data/train --set data.valid=data/valid
        --set eval.every=0 --set eval.batches=1 --set checkpoint.keep=10 --set log.every=1
        --set optimizer.warmup=2 --set train.loss_scale.initial=1024)
train() { "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" "${common[@]}" --set log.dir="$1" "${@:2}"; }
compare() { # NAME A B ARGS...: compare_runs.py A B ARGS, one line of figures
  local name=$1 o
  o=$($PY "$SRC/tests/e2e/compare_runs.py" "${@:2}" 2>&1) && pass "$name: $o" || fail "$name: $o"
}

# 1. fp32: cpu (a checkpoint every step) and cuda (at step 5 and the end). The cuda run is profiled
#    (log.profile ops: steps 2-4 timed per op by the simulator's events): the table and its JSON,
#    and the observer leaves the steps the CPU's.
for d in cpu cuda; do
  SECONDS=0
  run_cmd "fp32 on $d" train $d --set train.device=$d --set checkpoint.resume=none \
    --set checkpoint.every=$([[ $d == cpu ]] && echo 1 || echo 5) $([[ $d == cuda ]] && echo --set log.profile=ops)
  expect_status 0
  echo "   fp32 on $d: ${SECONDS}s"
done
expect_out "op profile (log.profile: ops), rank 0 on cuda: 3 step(s) from step 2"
expect_out_re "  linear_forward +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+%"
expect_out_re "  attention_backward +[0-9]+ "
$PY - cuda/op_profile.json <<'PY' && pass "cuda's op_profile.json: event times per op" || fail "cuda's op_profile.json: $(cat cuda/op_profile.json)"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["device"] == "cuda" and j["steps"] == 3 and j["dropped_scopes"] == 0, j
ops = {o["name"]: o for o in j["ops"]}
for name in ("linear_forward", "linear_backward", "attention_forward", "rmsnorm_forward", "adamw_rows", "copy"):
    assert name in ops and ops[name]["calls"] % 3 == 0 and ops[name]["total_ms"] > 0, (name, ops.get(name))
assert 0 < j["in_ops_ms"] <= j["step_ms"], j
PY
compare "cuda takes the cpu's 10 fp32 steps" cuda cpu --last 10 --tol 1e-5

# 2. Across devices: the step-5 checkpoint of each run resumes on the other device.
run_cmd "cuda's step 5 resumed on cpu" train cuda2cpu --set train.device=cpu --set checkpoint.resume=cuda/ckpt/step_00000005
expect_status 0
expect_out "resuming from"
compare "cuda's checkpoint continues on cpu" cuda2cpu cpu --first 6 --last 10 --tol 1e-5
run_cmd "cpu's step 8 resumed on cuda" env LLMTRAIN_SIM_DEVICES=2 "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" \
  "${common[@]}" --set log.dir=cpu2cuda --set train.device=cuda --set checkpoint.resume=cpu/ckpt/step_00000008
expect_status 0
expect_out "resuming from"
expect_out "device: rank 0 holds cuda:0 (SIMT simulator (kernels/cuda/sim), on the CPU), local rank 0 of 1 → 0 mod 2 visible, LLMTRAIN_SIM_DEVICES=2"
compare "cpu's checkpoint continues on cuda" cpu2cuda cpu --first 9 --last 10 --tol 1e-5

# 3. bf16: cuda against the cpu, 3 steps.
for d in cpu cuda; do
  run_cmd "bf16 on $d" train bf16-$d --set train.device=$d --set train.precision=bf16 --set train.steps=3 \
    --set checkpoint.resume=none
  expect_status 0
done
compare "bf16: cuda takes the cpu's steps within 16-bit rounding" bf16-cuda bf16-cpu --last 3 --tol 5e-3
# fp16 the same (dynamic loss scaling): tiny's head dim 32 takes the tensor-core attention in both.
for d in cpu cuda; do
  run_cmd "fp16 on $d" train fp16-$d --set train.device=$d --set train.precision=fp16 --set train.steps=3 \
    --set checkpoint.resume=none
  expect_status 0
done
expect_out "attention: tensor cores"
compare "fp16: cuda takes the cpu's steps within 16-bit rounding" fp16-cuda fp16-cpu --last 3 --tol 5e-3
# 3b. parallel.offload on cuda (docs/offload.md), bf16: host — the moments and fp32 master in
#     page-locked memory, AdamW on the CPU, each unit's gradients copied down during backward (all
#     of them here: one rank, ZeRO 0), the values up behind the update; nvme — a file, each unit
#     copied to a device slot and updated by the device's AdamW. Both take the in-memory run's 3
#     steps BITWISE (losses, and every checkpointed slice by checksum).
for kind in host nvme; do
  run_cmd "bf16 on cuda, offload $kind" train bf16-cuda-$kind --set train.device=cuda --set train.precision=bf16 \
    --set train.steps=3 --set checkpoint.resume=none --set parallel.offload=$kind \
    $([[ $kind == nvme ]] && echo --set parallel.offload_path=scratch)
  expect_status 0
  expect_out "optimizer state offloaded (parallel.offload $kind)"
  [[ $kind == nvme ]] ||
    expect_out_re "the last update found ([0-9]+) of \1 units' gradients copied down during backward, 0 more"
  compare "offload $kind on cuda takes the in-memory steps bitwise" bf16-cuda-$kind bf16-cuda --last 3 --tol 0
  $PY - bf16-cuda-$kind/ckpt/step_00000003/manifest.json bf16-cuda/ckpt/step_00000003/manifest.json <<'PY' &&
import json, sys
crc = lambda d: sorted((t["name"], t["role"], s["crc32c"]) for t in json.load(open(d))["tensors"] for s in t["slices"])
assert crc(sys.argv[1]) == crc(sys.argv[2])
PY
    pass "offload $kind on cuda: the checkpoint's moments and master are bitwise the in-memory run's" ||
    fail "offload $kind on cuda: the checkpoints differ"
done
# 3c. Without clipping (train.grad_clip 0; bf16, no loss scaling) the update is known before backward
#     ends: offload host updates each unit on the CPU as its gradients arrive, during backward, on a
#     thread of its own — still bitwise the in-memory run.
for kind in none host; do
  run_cmd "bf16 on cuda without clipping, offload $kind" train bf16-noclip-$kind --set train.device=cuda \
    --set train.precision=bf16 --set train.steps=3 --set checkpoint.resume=none --set train.grad_clip=0 \
    --set parallel.offload=$kind
  expect_status 0
done
expect_out_re "found ([0-9]+) of \1 units' gradients copied down during backward, 0 more as their reductions completed after it; [0-9]+ updated on the CPU by the time the step reached its update"
compare "offload host updating during backward takes the in-memory steps bitwise" bf16-noclip-host bf16-noclip-none \
  --last 3 --tol 0

# 4. A device per rank (no training: every rank runs `llmtrain env`, which names the device it takes).
ranks() { "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --nproc 2 --set train.device=cuda --set log.dir=ranks "$@" -- "$LLMTRAIN" env; }
LLMTRAIN_SIM_DEVICES=2 run_cmd "2 ranks on LLMTRAIN_SIM_DEVICES=2" ranks
expect_status 0
expect_out "[rank 0] rank device: local rank 0 of 2 takes cuda:0 of 2 visible"
expect_out "[rank 1] rank device: local rank 1 of 2 takes cuda:1 of 2 visible"
run_cmd "2 ranks on 1 simulated device" ranks
expect_status 1
expect_out "train.device is cuda and 2 rank(s) run on this host (launch.procs_per_node 2), but 1 CUDA device(s) are visible"
expect_out "launch.share_devices: true"
run_cmd "2 ranks sharing 1 simulated device" ranks --set launch.share_devices=true
expect_status 0
expect_out "[rank 1] rank device: local rank 1 of 2: 2 local ranks > 1 visible device(s): refused unless launch.share_devices: true, which gives it cuda:0"
run_cmd "a malformed LLMTRAIN_SIM_DEVICES" env LLMTRAIN_SIM_DEVICES=two "$LLMTRAIN" env
expect_status 0
expect_out 'devices:   none (LLMTRAIN_SIM_DEVICES="two": expected a whole number of simulated devices from 1 to 64)'
# 5. The llama family's variants on cuda (head_rmsnorm, the scaled RoPE table, biases on the packed
#    projection, the windowed attention kernels, attention sinks): 2 fp32 steps take the CPU's.
variants=(--set model.qkv_bias=true --set model.qk_norm=true --set model.head_dim=48 --set model.sliding_window=16
  --set model.attention_sinks=true
  --set model.rope_scaling.type=llama3 --set model.rope_scaling.factor=8
  --set model.rope_scaling.original_max_positions=32 --set train.steps=2 --set checkpoint.resume=none
  --set checkpoint.every=2)
for d in cpu cuda; do
  run_cmd "variants on $d" train variants-$d --set train.device=$d "${variants[@]}"
  expect_status 0
done
compare "qkv_bias, qk_norm, head_dim, sliding_window, attention sinks and llama3 RoPE: cuda takes the cpu's 2 steps" \
  variants-cuda variants-cpu --last 2 --tol 1e-5
# 6. MoE blocks on cuda (the router, plan, stats, gather, grouped products and combine kernels, the
#    routing statistics in the step's one read, Qwen2-MoE's gated shared expert): 2 fp32 steps take
#    the CPU's (the kernels' capacity drops are checked in the op harness on the simulated device).
moe=(--set model.moe.experts=4 --set model.moe.top_k=2 --set model.moe.ffn_hidden=128 --set model.moe.first_dense=1
  --set model.moe.shared_ffn_hidden=64
  --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=2)
for d in cpu cuda; do
  run_cmd "moe on $d" train moe-$d --set train.device=$d "${moe[@]}"
  expect_status 0
done
compare "MoE blocks with a shared expert: cuda takes the cpu's 2 steps" moe-cuda moe-cpu --last 2 --tol 1e-5
# 6a. gpt-oss's block on cuda (the router's and the experts' biases in the grouped products, the
#    clamped SwiGLU, sinks, o_proj's bias, alternating windows): 2 fp32 steps take the CPU's, and 2
#    bf16 steps (the tensor-core attention kernels with sinks) within 2e-2 of the CPU's bf16 ones.
gptoss=(--set model.qkv_bias=true --set model.o_bias=true --set model.attention_sinks=true
  --set model.sliding_window=16 --set model.full_attention_every=2 --set model.moe.experts=4 --set model.moe.top_k=2
  --set model.moe.ffn_hidden=64 --set model.moe.bias=true --set model.moe.swiglu_limit=0.5
  --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=2)
for d in cpu cuda; do
  run_cmd "gpt-oss on $d" train gptoss-$d --set train.device=$d "${gptoss[@]}"
  expect_status 0
  run_cmd "gpt-oss bf16 on $d" train gptoss-bf16-$d --set train.device=$d "${gptoss[@]}" --set train.precision=bf16
  expect_status 0
done
compare "gpt-oss's block: cuda takes the cpu's 2 steps" gptoss-cuda gptoss-cpu --last 2 --tol 1e-5
compare "gpt-oss's block in bf16: cuda within 2e-2 of the cpu's" gptoss-bf16-cuda gptoss-bf16-cpu --last 2 --tol 2e-2
# 6c. bf16 moments (optimizer.state_dtype) on cuda: adamw_rows' bf16 loads and rounded stores;
#    2 fp32 steps take the CPU's.
for d in cpu cuda; do
  run_cmd "bf16 moments on $d" train bf16m-$d --set train.device=$d --set optimizer.state_dtype=bf16 --set train.steps=2 \
    --set checkpoint.resume=none --set checkpoint.every=2
  expect_status 0
done
compare "bf16 moments: cuda takes the cpu's 2 steps" bf16m-cuda bf16m-cpu --last 2 --tol 1e-5
# 6d. Muon (optimizer.name muon) on cuda: Newton–Schulz through the simulated cuBLASLt on the
#    compute stream, its products in fp32 (2 steps take the CPU's) and in bf16 training.
for d in cpu cuda; do
  run_cmd "muon on $d" train muon-$d --set train.device=$d --set optimizer.name=muon --set optimizer.lr=0.02 \
    --set optimizer.muon.ns_dtype=fp32 --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=2
  expect_status 0
done
compare "muon: cuda takes the cpu's 2 steps" muon-cuda muon-cpu --last 2 --tol 1e-5
run_cmd "muon bf16 on cuda" train muon-bf16-cuda --set train.device=cuda --set optimizer.name=muon \
  --set train.precision=bf16 --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=2
expect_status 0
# 6b. Gemma 3's block on cuda (per-layer windows and RoPE tables, the softmax scale, GeGLU, the
#    post-norms, scaled embeddings, soft-capped logits): 2 fp32 steps take the CPU's, and so do 2 in
#    bf16 with selective recomputation (the tensor-core attention kernels with the scale and window).
gemma=(--set model.qk_norm=true --set model.head_dim=32 --set model.sliding_window=16 --set model.full_attention_every=2
  --set model.rope_local_theta=100 --set model.query_pre_attn_scalar=20 --set model.activation=geglu
  --set model.post_norms=true --set model.scale_embeddings=true --set model.logit_softcap=4
  --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=2)
for d in cpu cuda; do
  run_cmd "gemma3 on $d" train gemma-$d --set train.device=$d "${gemma[@]}"
  expect_status 0
  run_cmd "gemma3 bf16 on $d" train gemma-bf16-$d --set train.device=$d "${gemma[@]}" --set train.precision=bf16 \
    --set train.activation_checkpointing=selective
  expect_status 0
done
compare "Gemma 3's block: cuda takes the cpu's 2 steps" gemma-cuda gemma-cpu --last 2 --tol 1e-5
compare "Gemma 3's block in bf16 with selective recomputation: cuda within 2e-2 of the cpu's" gemma-bf16-cuda \
  gemma-bf16-cpu --last 2 --tol 2e-2
# 7. The planner's measured rates (tests/bench/device_rates, which scripts/gpu_check.sh runs on a GPU):
#    on the simulated device at a tiny shape, a file `plan --rates` takes (the simulator's rates
#    mean nothing; the file and its path through the planner are what is checked).
run_cmd "device_rates on the simulator" "$BUILD/tests/device_rates" --batch 1 --seq 16 --heads 2 --dim 16 \
  --hidden 32 --reps 1 --output rates.json
expect_status 0
run_cmd "plan with the simulator's rates" "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" --set train.device=cuda --gpus 1 \
  --gpu h100 --rates rates.json
expect_status 0; expect_out_re "attention at llmtrain's attention kernel measured on .*simulat"
# 8. GPT-2 on cuda: linear_gelu_forward (GELU_AUX_BIAS), linear_backward_input_gelu (DGELU_BGRAD) and
#    the qkv bias's BGRADB on the simulator's cuBLASLt model; 2 fp32 steps take the CPU's, and so do
#    2 with selective recomputation (the forward's act from the epilogue, the recomputed one from
#    gelu_forward).
gpt2=(--set model.family=gpt2 --set train.steps=2 --set checkpoint.resume=none --set checkpoint.every=2)
for d in cpu cuda; do
  run_cmd "gpt2 on $d" train gpt2-$d --set train.device=$d "${gpt2[@]}"
  expect_status 0
done
compare "GPT-2: cuda takes the cpu's 2 steps" gpt2-cuda gpt2-cpu --last 2 --tol 1e-5
run_cmd "gpt2 with selective recomputation on cuda" train gpt2-sel-cuda --set train.device=cuda "${gpt2[@]}" \
  --set train.activation_checkpointing=selective
expect_status 0
compare "GPT-2 with selective recomputation: cuda takes the cpu's 2 steps" gpt2-sel-cuda gpt2-cpu --last 2 --tol 1e-5
finish
