#!/usr/bin/env bash
# `llmtrain plan` and `run --dry-run`'s memory check as a user meets them: a ranked table, JSON that
# parses and is ranked, --apply writing a recipe `validate` accepts, clear refusals (no layout
# fits, no device named, an unknown device), and the dry run's prediction and warning; each row's
# MFU, tokens/s per GPU and time to train against the same figures by hand, the recipe's own
# layout's place (or why it has none), and the headroom warning.
source "$(dirname "$0")/lib.sh"

run_cmd plan-tiny "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" --gpus 2
expect_status 0; expect_out "layouts fit"; expect_out "best: "; expect_out "why: "
expect_out_re '^ +1  tp [12] · pp [12]'

run_cmd plan-json "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" --gpus 2 --json
expect_status 0
if python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
ls = j["layouts"]
assert j["gpus"] == 2 and len(ls) > 1 and len(ls) == j["fitting"], j
assert all(l["tp"] * l["pp"] * l["dp"] == 2 for l in ls)
assert [l["step_s"] for l in ls] == sorted(l["step_s"] for l in ls)
assert all(l["memory_bytes"] <= l["memory_capacity_bytes"] for l in ls)
assert all(abs(sum(l["step_parts_s"].values()) - l["step_s"]) < 1e-9 * max(1, l["step_s"]) for l in ls)
PY
then pass "plan --json parses, ranked by step time"; else fail "plan --json: $out"; fi

run_cmd plan-8b-apply "$LLMTRAIN" plan "$SRC/recipes/llama-8b.yaml" --gpus 16 --gpu h100 --apply applied.yaml
expect_status 0; expect_out "wrote applied.yaml (validated)"
best=$(grep '^best: ' <<<"$out")
own_line=$(grep "^this recipe's layout" <<<"$out")
run_cmd validate-applied "$LLMTRAIN" validate applied.yaml
expect_status 0; expect_out "procs_per_node: 8"; expect_out "nodes: 2"
tp=$(sed -E 's/^best: tp ([0-9]+).*/\1/' <<<"$best")
grep -qE "^  tp: $tp\$" <<<"$out" && pass "applied recipe has the best layout's tp $tp" || fail "applied tp != $tp: $best"

grep -qE "^this recipe's layout \(tp 2 · pp 1 · dp 8 · zero 1 · mb 1 · recompute full · sp\): #[0-9]+ of " <<<"$own_line" &&
  pass "on 16 GPUs the recipe's dp auto is 8" || fail "plan-8b-apply: no own layout at dp 8: $own_line"

# MFU, tokens/s per GPU and the time to train by hand, for the best layout and the recipe's own:
# FLOPs per token 6N + 12·L·h·s from the recipe's shape (N: the matrices and norms; the untied
# input embedding is a lookup), the H100's rated dense bf16 peak from NVIDIA's data sheet.
run_cmd plan-8b-json "$LLMTRAIN" plan "$SRC/recipes/llama-8b.yaml" --gpus 8 --gpu h100 --json
expect_status 0; printf '%s' "$out" >plan-8b.json
if by_hand=$(python3 - plan-8b.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
L, h, heads, kv, ffn, V, seq, gb, steps, gpus = 32, 4096, 32, 8, 14336, 128256, 8192, 128, 100000, 8
hd = h // heads
N = L * (2 * h * h + 2 * h * kv * hd + 3 * h * ffn + 2 * h) + h + V * h
flops_per_token, peak, tokens = 6 * N + 12 * L * h * seq, 989.4e12, gb * seq
assert abs(j["flops_per_token"] / flops_per_token - 1) < 1e-12, (j["flops_per_token"], flops_per_token)
assert j["peak_flops_per_gpu"] == peak and j["train_tokens"] == steps * tokens, j
best, own, rank = j["layouts"][0], j["recipe_layout"], j["recipe_layout_rank"]
for l in (best, own):
    s = l["step_s"]
    assert abs(l["mfu"] / (flops_per_token * tokens / (s * gpus * peak)) - 1) < 1e-9, l
    assert abs(l["tokens_per_s_per_gpu"] / (tokens / s / gpus) - 1) < 1e-9, l
    assert abs(l["time_to_train_s"] / (steps * s) - 1) < 1e-9, l
assert own["layout"] == "tp 2 · pp 1 · dp 4 · zero 1 · mb 1 · recompute full · sp", own
assert j["layouts"][rank - 1] == own and j["recipe_layout_would_rank"] is None and j["recipe_layout_note"] == ""
assert all(l["step_s"] <= own["step_s"] for l in j["layouts"][:rank])
margin = max(2 << 30, int(0.05 * best["memory_capacity_bytes"]))
assert j["headroom_margin_bytes"] == margin, (j["headroom_margin_bytes"], margin)
assert all(l["headroom_bytes"] == l["memory_capacity_bytes"] - l["memory_bytes"] for l in j["layouts"])
assert best["headroom_bytes"] >= margin and own["headroom_bytes"] >= margin and j["warnings"] == [], j["warnings"]
days = lambda l: f'{steps * l["step_s"] / 86400:.0f}'
print(rank, j["fitting"], f'{100 * own["mfu"]:.1f}', f'{own["tokens_per_s_per_gpu"]:.0f}', days(best), days(own))
PY
); then pass "plan --json: MFU, tokens/s per GPU, time to train as by hand"; else fail "plan --json by hand: $by_hand"; fi
read -r rank fitting own_mfu own_tps best_days own_days <<<"$by_hand"
run_cmd plan-8b "$LLMTRAIN" plan "$SRC/recipes/llama-8b.yaml" --gpus 8 --gpu h100
expect_status 0; expect_out "MFU"; expect_out "tok/s/GPU"
expect_out "this recipe's layout (tp 2 · pp 1 · dp 4 · zero 1 · mb 1 · recompute full · sp): #$rank of $fitting, "
expect_out_re "^ +$rank  tp 2 · pp 1 · dp 4 · zero 1 · mb 1 · recompute full · sp .* $own_mfu% +$own_tps  compute  <- this recipe\$"
expect_out "time to train (predicted): 100000 steps × 1.05M tokens = 104.86B tokens: $best_days days with the best layout, $own_days days with this recipe's"
[[ $out != *"warning:"* ]] && pass "plan-8b: 21 GiB free, no headroom warning" || fail "plan-8b warns: $out"

# The best 70B layout on 64 A100s leaves under 1 GiB free: warned, with the fastest that does not;
# the recipe's 5 virtual stages are not searched, its row predicted as it is.
run_cmd plan-70b-headroom "$LLMTRAIN" plan "$SRC/recipes/llama-70b.yaml" --gpus 64 --gpu a100-80g --inter-node-gbps 200
expect_status 0
expect_out_re '^warning: only [0-9.]+ MiB \([0-9.]+%\) of headroom per rank on a100-80g \(79.2 GiB\) with the best layout'
expect_out "the plan asks for max(2.0 GiB, 5%) = 4.0 GiB free"; expect_out_re "the fastest that does is #[0-9]+, tp "
expect_out "not among the candidates: not a layout the search enumerates: its 5 virtual stages per pipeline rank"
expect_out_re '^ +-  tp 8 · pp 4 × v 5 · dp 2 · zero 1 · mb 1 · recompute full · sp .*<- this recipe \(not searched; would be #[0-9]+\)$'
expect_out_re "^time to train \(predicted\): .* days with the best layout, [0-9]+ days with this recipe's$"
# A layout for other ranks is not a candidate, and the plan says why.
run_cmd plan-8b-other-ranks "$LLMTRAIN" plan "$SRC/recipes/llama-8b.yaml" --set parallel.dp=4 --gpus 16 --gpu h100 --json --top 1
expect_status 0
python3 -c 'import json, sys; j = json.loads(sys.argv[1]); assert j["recipe_layout"] is None and j["recipe_layout_rank"] is None, j' "$out" &&
  pass "plan-8b-other-ranks: recipe_layout null" || fail "plan-8b-other-ranks: $out"
expect_out "it is not a layout of 16 ranks: world size 16 (--gpus 16) != tp 2 × pp 1 × dp 4 = 8"
# Among the rows shown, the recipe's own is marked where it stands.
run_cmd plan-tiny-own "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" --gpus 1 --top 100
expect_status 0; expect_out_re '^ +[0-9]+  tp 1 · pp 1 · dp 1 · zero 0 · mb 4 · recompute none .*<- this recipe$'
[[ $out != *" ..."* && $out != *"warning:"* ]] && pass "plan-tiny-own: no row apart, no warning" || fail "plan-tiny-own: $out"

run_cmd plan-70b-one-gpu "$LLMTRAIN" plan "$SRC/recipes/llama-70b.yaml" --gpus 1 --gpu a100-40g
expect_status 2; expect_out "no layout fits 1 × NVIDIA A100 SXM4 40GB"; expect_out "per rank"

run_cmd plan-cuda-no-gpu "$LLMTRAIN" plan "$SRC/recipes/llama-8b.yaml" --gpus 8
expect_status 2; expect_out "train.device is cuda: which GPU?"

run_cmd plan-unknown-gpu "$LLMTRAIN" plan "$SRC/recipes/llama-8b.yaml" --gpus 8 --gpu v100
expect_status 2; expect_out "unknown device 'v100'"; expect_out "a100-40g, a100-80g, h100, h200, cpu"

run_cmd plan-too-many "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" --gpus 100000
expect_status 2; expect_out "--gpus 100000: expected 1 to 65536"

run_cmd plan-no-layout "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" --gpus 7
expect_status 2; expect_out "no layout of 7 ranks passes the recipe checks"

# run --dry-run: the same account and the device's memory.
run_cmd dry-run-8b-h100 "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --dry-run --gpu h100
expect_status 2; expect_out "cannot run: "; expect_out "predicted memory per rank: "; expect_out "per GPU (NVIDIA H100 SXM5 80GB)"
[[ $out != *"warning: predicted"* ]] && pass "llama-8b fits an H100" || fail "dry-run-8b-h100 warns: $out"
expect_out "predicted: MFU $own_mfu% of 8 × 989.4 TFLOP/s (rated), $own_tps tokens/s per GPU; 100000 steps in $own_days days"

run_cmd dry-run-8b-too-big "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --dry-run --gpu a100-80g --set parallel.zero=0 \
  --set parallel.tp=1 --set parallel.sequence_parallel=false --set train.activation_checkpointing=selective
expect_status 2; expect_out "cannot run: "; expect_out_re "^warning: predicted [0-9.]+ GiB per GPU > [0-9.]+ GiB: .*zero 1 .* would fit"

run_cmd dry-run-8b-no-gpu "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --dry-run
expect_status 2; expect_out "cannot run: "; expect_out "cannot check it against the device without --gpu NAME"

run_cmd gpu-without-dry-run "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --gpu h100
expect_status 2; expect_out "--gpu h100 is for --dry-run"

# A real CPU run that will not fit this host says so before any rank starts (here it then stops
# for its missing data).
run_cmd run-too-big "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set model.layers=64 --set model.hidden=8192 \
  --set model.heads=64 --set model.kv_heads=64 --set data.train=nothing/here --set data.valid=nothing/here
expect_status 2; expect_out_re "^warning: predicted [0-9.]+ [GT]iB per rank > [0-9.]+ GiB"; expect_out "do not exist"

run_cmd dry-run-tiny "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run
expect_status 2; expect_out "cannot run: "; expect_out "predicted memory per rank: "; expect_out "this host's memory / 1 ranks on it"

# --rates: a GPU's rates as measured on a device (tests/bench/device_rates writes the file,
# scripts/gpu_check.sh runs it) in place of the catalogue's. Half the catalogue's H100 tensor-core
# attention rates (its assumed 15% and 10% of 989.4 TFLOP/s) and the same products: a GPT-2 124M
# step in bf16 (head dim 64: the tensor cores' kernel) takes longer by about the attention's share
# (8.3 of 22 ms: 1.38 times). A file without the tensor cores' keys (written before them) leaves the
# assumption in place.
gpt2=(--set model.family=gpt2 --set model.layers=12 --set model.hidden=768 --set model.heads=12 --set model.kv_heads=12
  --set model.vocab=50257 --set model.seq_len=1024 --set model.max_positions=1024 --set train.micro_batch=8
  --set train.global_batch=8 --set train.device=cuda --set train.precision=bf16)
printf '{"llmtrain_device_rates": 1, "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-28", "commit": "abc1234",
  "attention_forward_rate": 12.39e12, "attention_backward_rate": 7.36e12, "products_bf16": 593.6e12,
  "products_fp32": 46.83e12}\n' >old-rates.json
sed 's/"products_bf16"/"attention_tc_forward_rate": 74.2e12, "attention_tc_backward_rate": 49.47e12, "products_bf16"/' \
  old-rates.json >rates.json
step() { sed -n 's/^predicted step time: \([0-9.e+-]*\) s.*/\1/p' <<<"$out"; }
run_cmd dry-run-catalogue "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --dry-run --gpu h100
expect_status 2; expect_out "cannot run: "; catalogue=$(step)
run_cmd dry-run-rates "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --dry-run --gpu h100 --rates rates.json
expect_status 2; expect_out "cannot run: "; measured=$(step)
expect_out "rates: products at the products' rate measured on NVIDIA H100 80GB HBM3 (2026-11-28, commit abc1234)"
awk -v a="$catalogue" -v b="$measured" 'BEGIN { exit !(b > 1.3 * a && b < 1.45 * a) }' &&
  pass "half the tensor cores' attention rates: $catalogue -> $measured s a step" ||
  fail "half the tensor cores' attention rates: $catalogue -> $measured s a step (expected about 1.38 times)"
run_cmd plan-rates "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --gpus 1 --gpu h100 --rates rates.json
expect_status 0; expect_out "attention at the tensor-core attention kernels measured on NVIDIA H100 80GB HBM3"
run_cmd plan-old-rates "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --gpus 1 --gpu h100 --rates old-rates.json
expect_status 0; expect_out "attention at the tensor-core kernels' assumed 15% (forward) and 10% (backward)"
# fp32 takes the CUDA cores' kernel: the file's measured rates for it.
run_cmd plan-rates-fp32 "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --set train.precision=fp32 --gpus 1 \
  --gpu h100 --rates rates.json
expect_status 0; expect_out "attention at llmtrain's attention kernel measured on NVIDIA H100 80GB HBM3"
# Hostile or wrong files: the file and the key named, nothing predicted.
sed 's/"products_fp32": 46.83e12/"products_fp32": -1/' rates.json >negative.json
run_cmd rates-negative "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --gpus 1 --gpu h100 --rates negative.json
expect_status 2; expect_out "--rates negative.json: products_fp32 is -1, expected a rate in FLOP/s"
sed 's/"attention_backward_rate": 7.36e12, //' rates.json >missing.json
run_cmd rates-missing "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --gpus 1 --gpu h100 --rates missing.json
expect_status 2; expect_out "attention_backward_rate is missing or not a number"
printf '%.0s[' {1..200} >deep.json
run_cmd rates-deep "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --gpus 1 --gpu h100 --rates deep.json
expect_status 2; expect_out "nested deeper than"
echo '{"device": "x"}' >other.json
run_cmd rates-other "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --gpus 1 --gpu h100 --rates other.json
expect_status 2; expect_out "not a device-rates file"
run_cmd rates-cpu "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" --gpus 1 --rates rates.json
expect_status 2; expect_out "the cpu row's rates are measured on this machine already"
run_cmd rates-without-gpu "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run --rates rates.json
expect_status 2; expect_out "--rates rates.json needs --gpu"
finish
