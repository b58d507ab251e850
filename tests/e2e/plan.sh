#!/usr/bin/env bash
# `llmtrain plan` and `run --dry-run`'s memory check as a user meets them: a ranked table, JSON that
# parses and is ranked, --apply writing a recipe `validate` accepts, clear refusals (no layout
# fits, no device named, an unknown device), and the dry run's prediction and warning.
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
run_cmd validate-applied "$LLMTRAIN" validate applied.yaml
expect_status 0; expect_out "procs_per_node: 8"; expect_out "nodes: 2"
tp=$(sed -E 's/^best: tp ([0-9]+).*/\1/' <<<"$best")
grep -qE "^  tp: $tp\$" <<<"$out" && pass "applied recipe has the best layout's tp $tp" || fail "applied tp != $tp: $best"

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
expect_status 0; expect_out "predicted memory per rank: "; expect_out "per GPU (NVIDIA H100 SXM5 80GB)"
[[ $out != *"warning: predicted"* ]] && pass "llama-8b fits an H100" || fail "dry-run-8b-h100 warns: $out"

run_cmd dry-run-8b-too-big "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --dry-run --gpu a100-80g --set parallel.zero=0 \
  --set parallel.tp=1 --set parallel.sequence_parallel=false --set train.activation_checkpointing=selective
expect_status 0; expect_out_re "^warning: predicted [0-9.]+ GiB per GPU > [0-9.]+ GiB: .*zero 1 .* would fit"

run_cmd dry-run-8b-no-gpu "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --dry-run
expect_status 0; expect_out "cannot check it against the device without --gpu NAME"

run_cmd gpu-without-dry-run "$LLMTRAIN" run "$SRC/recipes/llama-8b.yaml" --gpu h100
expect_status 2; expect_out "--gpu h100 is for --dry-run"

# A real CPU run that will not fit this host says so before any rank starts (here it then stops
# for its missing data).
run_cmd run-too-big "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --set model.layers=64 --set model.hidden=8192 \
  --set model.heads=64 --set model.kv_heads=64 --set data.train=nothing/here --set data.valid=nothing/here
expect_status 2; expect_out_re "^warning: predicted [0-9.]+ [GT]iB per rank > [0-9.]+ GiB"; expect_out "do not exist"

run_cmd dry-run-tiny "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" --dry-run
expect_status 0; expect_out "predicted memory per rank: "; expect_out "this host's memory / 1 ranks on it"

# --rates: a GPU's rates as measured on a device (tests/bench/device_rates writes the file,
# scripts/gpu_check.sh runs it) in place of the catalogue's. Half the catalogue's H100 attention rates
# and the same products: a GPT-2 124M step in bf16 takes longer by about the attention's share.
gpt2=(--set model.family=gpt2 --set model.layers=12 --set model.hidden=768 --set model.heads=12 --set model.kv_heads=12
  --set model.vocab=50257 --set model.seq_len=1024 --set model.max_positions=1024 --set train.micro_batch=8
  --set train.global_batch=8 --set train.device=cuda --set train.precision=bf16)
printf '{"llmtrain_device_rates": 1, "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-28", "commit": "abc1234",
  "attention_forward_rate": 12.39e12, "attention_backward_rate": 7.36e12, "products_bf16": 593.6e12,
  "products_fp32": 46.83e12}\n' >rates.json
step() { sed -n 's/^predicted step time: \([0-9.e+-]*\) s.*/\1/p' <<<"$out"; }
run_cmd dry-run-catalogue "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --dry-run --gpu h100
expect_status 0; catalogue=$(step)
run_cmd dry-run-rates "$LLMTRAIN" run "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --dry-run --gpu h100 --rates rates.json
expect_status 0; measured=$(step)
expect_out "rates: products at the products' rate measured on NVIDIA H100 80GB HBM3 (2026-11-28, commit abc1234)"
awk -v a="$catalogue" -v b="$measured" 'BEGIN { exit !(b > 1.7 * a && b < 1.9 * a) }' &&
  pass "half the attention rates: $catalogue -> $measured s a step" ||
  fail "half the attention rates: $catalogue -> $measured s a step (expected about 1.8 times)"
run_cmd plan-rates "$LLMTRAIN" plan "$SRC/recipes/tiny.yaml" "${gpt2[@]}" --gpus 1 --gpu h100 --rates rates.json
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
