#!/usr/bin/env bash
# Mixtral (MixtralForCausalLM, model.moe's block on every layer) against transformers 5 (.venv-hf5)
# and 4.40.2 (.venv-hf), docs/hf.md:
#  - a random Mixtral saved by transformers 5 (rope_parameters, dtype; a sliding window of 8,
#    shorter than the prompt) imported with a recipe that names model.moe, and one saved by 4.40.2
#    (no window) imported without one (the derived recipe holds model.moe): each gives transformers'
#    logits (relative error <= 1e-5, fp32) and the same 24 greedy tokens; its export is
#    byte-identical to the original and loads in transformers 5 and 4.40.2 with the same results
#    (4.40.2's window counts one key more: the windowed export there with sliding_window 7); the
#    transformers 5 model saved with its experts fused (save_original_format=False) imports to the
#    same weights;
#  - the load-balancing loss of one layer: llmtrain's (scripts/reference/model.py's moe_mlp) over its
#    coefficient is transformers' load_balancing_loss_func over top_k (relative 1e-6);
#  - a MoE model trained a few steps (with a z-loss, which Mixtral lacks) exports, and transformers 5
#    and 4.40.2 give our logits and tokens;
#  - what Mixtral cannot hold is refused by name: router_jitter_noise on import, a recipe whose
#    model.moe differs from config.json, and the export of a model with renormalize: false; a
#    capacity factor is exported with a warning.
source "$(dirname "$0")/lib.sh"
use_python
HF5=$SRC/.venv-hf5/bin/python
HF4=$SRC/.venv-hf/bin/python
for py in "$HF5" "$HF4"; do
  if ! "$py" -c "import transformers" 2>/dev/null; then
    echo "FAIL: $py with transformers is missing: run scripts/setup.sh"
    exit 1
  fi
done
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T="$SRC/tests/e2e/hf_mixtral.py"
prompt="Q: What is the meaning of life? A: experts"

run_cmd create5 "$HF5" "$T" create rand5 8 fused5
expect_status 0
run_cmd create4 "$HF4" "$T" create rand4 0
expect_status 0

# generate NAME CKPT: our logits on the prompt and 24 greedy tokens.
generate() {
  "$LLMTRAIN" generate "$2" --prompt "$prompt" --temperature 0 --max-tokens 24 --ignore-eod --ids \
    --logits-out $1.logits.safetensors >$1.ids 2>$1.err || fail "generate from $2: $(cat $1.err)"
}

# transformers 5's Mixtral, imported with a recipe that says the same (the byte tokenizer's files
# come with its export).
cat >mixtral.yaml <<'YAML'
name: mixtral
model: {family: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 96, vocab: 300, seq_len: 64,
        max_positions: 128, norm_eps: 1.0e-5, rope_theta: 10000, sliding_window: 8,
        moe: {experts: 4, top_k: 2, aux_loss: 0.02, z_loss: 0}}
data: {tokenizer: byte, train: data/train}
train: {steps: 1, micro_batch: 1}
YAML
run_cmd import5 "$LLMTRAIN" import rand5 --out ck5 --recipe mixtral.yaml
expect_status 0
run_cmd export5 "$LLMTRAIN" export ck5 --hf re5
expect_status 0
generate m5 ck5
# The same model as transformers 5 holds it in memory (save_original_format=False: mlp.gate,
# experts.gate_up_proj and down_proj): imported, it exports as the per-expert original.
cp re5/tokenizer.json re5/tokenizer_config.json fused5/
run_cmd import-fused "$LLMTRAIN" import fused5 --out ck-fused
expect_status 0
run_cmd export-fused "$LLMTRAIN" export ck-fused --hf re-fused
expect_status 0
run_cmd transformers5-rand5 "$HF5" "$T" check m5.logits.safetensors m5.ids rand5 re5 -- same-tensors rand5 re5 \
  -- same-tensors rand5 re-fused -- aux rand5 m5.logits.safetensors
expect_status 0
echo "$out" | grep -E '^(ok|FAIL|  )'

# transformers 4.40.2's, imported without a recipe: the derived one holds model.moe.
cp re5/tokenizer.json re5/tokenizer_config.json rand4/
run_cmd import4 "$LLMTRAIN" import rand4 --out ck4
expect_status 0
grep -q "moe: {experts: 4, top_k: 2, ffn_hidden: 96, every: 1, first_dense: 0, renormalize: true,$" ck4/recipe.yaml &&
  grep -q "^ *aux_loss: 0.02, z_loss: 0, capacity_factor: 0}}$" ck4/recipe.yaml &&
  pass "the derived recipe holds model.moe" || fail "derived recipe: $(cat ck4/recipe.yaml)"
run_cmd export4 "$LLMTRAIN" export ck4 --hf re4
expect_status 0
generate m4 ck4
# transformers 4.40.2's Mixtral counts the window one key wider than 5.x (as its Mistral): the
# windowed export loads there with sliding_window 7 for our (and 5.x's) 8.
cp -r re5 re5-4 && sed -i 's/"sliding_window": 8/"sliding_window": 7/' re5-4/config.json
run_cmd transformers4-rand4 "$HF4" "$T" check m4.logits.safetensors m4.ids rand4 re4 \
  -- check m5.logits.safetensors m5.ids re5-4
expect_status 0
echo "$out" | grep -E '^(ok|FAIL|  )'

# A MoE model trained here, with a z-loss (training only: Mixtral has none), exports.
prep_fortunes
cat >train.yaml <<'YAML'
name: moe
model: {family: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn_hidden: 64, seq_len: 64, max_positions: 128,
        moe: {experts: 4, top_k: 2, ffn_hidden: 48, aux_loss: 0.01, z_loss: 0.001}}
data: {tokenizer: byte, train: data/train}
train: {steps: 3, micro_batch: 1, seed: 3, threads: 2}
optimizer: {lr: 3.0e-3, warmup: 1}
checkpoint: {every: 3}
log: {every: 1}
YAML
run_cmd train "$LLMTRAIN" run train.yaml
expect_status 0
run_cmd export-trained "$LLMTRAIN" export runs/moe --hf re-trained
expect_status 0
generate trained runs/moe
grep -q '"architectures": \[\s*"MixtralForCausalLM"' <(tr -d '\n' <re-trained/config.json) &&
  grep -q '"intermediate_size": 48' re-trained/config.json && pass "the trained model exports as MixtralForCausalLM" ||
  fail "export config: $(cat re-trained/config.json)"
run_cmd transformers5-trained "$HF5" "$T" check trained.logits.safetensors trained.ids re-trained \
  -- check m4.logits.safetensors m4.ids re4 -- same-tensors rand4 re4
expect_status 0
echo "$out" | grep -E '^(ok|FAIL|  )'
run_cmd transformers4-trained "$HF4" "$T" check trained.logits.safetensors trained.ids re-trained
expect_status 0
echo "$out" | grep -E '^(ok|FAIL|  )'

# Refusals, each naming the field or key.
cp -r rand4 jitter && sed -i 's/"router_jitter_noise": 0.0/"router_jitter_noise": 0.01/' jitter/config.json
run_cmd refuse-jitter "$LLMTRAIN" import jitter --out ck-jitter
expect_status 2; expect_out "router_jitter_noise: found 0.01"
sed 's/moe: {experts: 4, top_k: 2,/moe: {experts: 4, top_k: 1,/' mixtral.yaml >top1.yaml
run_cmd refuse-recipe "$LLMTRAIN" import rand5 --out ck-top1 --recipe top1.yaml
expect_status 2; expect_out "model.moe.top_k: the recipe says 1"
run_cmd train-switch "$LLMTRAIN" run train.yaml --set train.steps=1 --set checkpoint.every=1 \
  --set model.moe.renormalize=false --set name=switch
expect_status 0
run_cmd refuse-renormalize "$LLMTRAIN" export runs/switch --hf re-switch
expect_status 2; expect_out "model.moe.renormalize false"
# A capacity factor does not change the weights: exported, with a warning (Mixtral is dropless).
run_cmd train-capacity "$LLMTRAIN" run train.yaml --set train.steps=1 --set checkpoint.every=1 \
  --set model.moe.capacity_factor=1.25 --set name=capacity
expect_status 0
run_cmd export-capacity "$LLMTRAIN" export runs/capacity --hf re-capacity
expect_status 0; expect_out "model.moe.capacity_factor 1.25 is not exported"
finish
