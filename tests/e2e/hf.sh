#!/usr/bin/env bash
# The Hugging Face bridge against transformers 4.40.2 (scripts/setup.sh's .venv-hf):
#  - trained GPT-2 (byte tokenizer) and LLaMA (BPE tokenizer.json, grouped-query attention, untied
#    head, sharded files) checkpoints exported with `llmtrain export` load in AutoModelForCausalLM
#    and give our logits (relative error <= 1e-5, fp32) and our greedy 64 tokens; AutoTokenizer gives
#    our ids and decodes them back (byte, tokenizer.json and GPT-2 vocab.json + merges.txt);
#  - the same for a SentencePiece-style tokenizer.json (Mistral's layout: byte fallback, Metaspace),
#    whose decode of the generated ids is the text `llmtrain generate` prints; import takes that
#    tokenizer back from the exported directory, and a tokenizer.model alone is refused with the fix;
#  - models created with random weights by transformers import with `llmtrain import` and give
#    transformers' logits and greedy tokens; import then export gives byte-identical tensors (fp32
#    and bf16); a trained model re-saved by transformers imports and generates as transformers does;
#  - `llmtrain ckpt inspect` verifies every checksum and names a damaged tensor;
#  - what llmtrain does not implement is refused naming the field or tensor.
source "$(dirname "$0")/lib.sh"
HFPY=$SRC/.venv-hf/bin/python
if ! "$HFPY" -c "import transformers" 2>/dev/null; then
  echo "FAIL: $HFPY with transformers is missing: run scripts/setup.sh"
  exit 1
fi
CHECK="$HFPY $SRC/tests/e2e/hf_check.py"
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
prep_fortunes
fortunes=$(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)

# A byte-level BPE (Hugging Face tokenizers) as tokenizer.json and as GPT-2's vocab.json + merges.txt.
$CHECK train-tokenizer bpe 400 /usr/share/games/fortunes/fortunes >/dev/null || fail "training a BPE tokenizer"
"$LLMTRAIN" prep --input /usr/share/games/fortunes/fortunes --separator % --tokenizer bpe/tokenizer.json \
  --output bpedata/ --valid-fraction 0.05 >/dev/null 2>&1 || fail "prep with the BPE tokenizer"

common='train: {steps: 40, micro_batch: 2, global_batch: 4, seed: 3, threads: 1}
optimizer: {lr: 3.0e-3, warmup: 5}
checkpoint: {every: 40}
eval: {every: 0, batches: 1}
log: {every: 10}'
cat >gpt2.yaml <<YAML
name: gpt2
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 64, max_positions: 128}
data: {tokenizer: byte, train: data/train}
$common
YAML
cat >llama.yaml <<YAML
name: llama
model: {family: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2, seq_len: 64, max_positions: 128, tie_embeddings: false}
data: {tokenizer: bpe/tokenizer.json, train: bpedata/train}
$common
YAML
cat >gpt2bpe.yaml <<YAML
name: gpt2bpe
model: {family: gpt2, layers: 1, hidden: 32, heads: 2, seq_len: 64, max_positions: 128}
data: {tokenizer: bpe/vocab.json, train: bpedata/train}
${common/steps: 40/steps: 8}
YAML
text="Q: What is the meaning of life?"
# export_check NAME [EXPORT ARGS]: train, export, and compare with transformers.
export_check() {
  local name=$1; shift
  run_cmd "train-$name" "$LLMTRAIN" run $name.yaml --set log.dir=runs/$name
  expect_status 0
  run_cmd "export-$name" "$LLMTRAIN" export runs/$name --hf hf-$name "$@"
  expect_status 0
  "$LLMTRAIN" generate runs/$name --prompt "$text" --temperature 0 --max-tokens 64 --ignore-eod --ids \
    --logits-out $name.logits.safetensors >$name.ids 2>/dev/null || fail "generate from $name"
  local decoded=()
  if [[ ${GENERATED_TEXT:-} ]]; then  # the text generate prints, for AutoTokenizer's decode to match
    "$LLMTRAIN" generate runs/$name --prompt "$text" --temperature 0 --max-tokens 64 --ignore-eod >$name.txt \
      2>/dev/null || fail "generate text from $name"
    decoded=(--generated-text $name.txt)
  fi
  run_cmd "transformers-$name" $CHECK logits hf-$name $name.logits.safetensors $name.ids --text "$text" "${decoded[@]}"
  expect_status 0
  echo "$out" | grep -E '^(ok|FAIL)' | sed "s/^/  $name: /"
}
export_check gpt2
export_check llama --max-shard-size 100KB
shards=$(ls hf-llama | grep -cE '^model-[0-9]{5}-of-[0-9]{5}\.safetensors$')
[[ -f hf-llama/model.safetensors.index.json && $shards -ge 2 ]] &&
  pass "export --max-shard-size writes shards and model.safetensors.index.json" || fail "no sharded export: $(ls hf-llama)"
export_check gpt2bpe
grep -q '"merges"' hf-gpt2bpe/tokenizer.json && pass "GPT-2 vocab.json + merges.txt exported as tokenizer.json" ||
  fail "hf-gpt2bpe/tokenizer.json has no merges"
# SentencePiece-style (LLaMA-2 / Mistral): trained here by tokenizers 0.19, prep, train, export, import.
$CHECK train-tokenizer-sp sp 600 /usr/share/games/fortunes/fortunes >/dev/null ||
  fail "training a SentencePiece-style tokenizer"
"$LLMTRAIN" prep --input /usr/share/games/fortunes/fortunes --separator % --tokenizer sp/tokenizer.json \
  --output spdata/ >/dev/null 2>&1 || fail "prep with the SentencePiece-style tokenizer"
# gpt2bpe's recipe, as a LLaMA with this tokenizer.
sed 's/gpt2bpe/llamasp/; s/family: gpt2/family: llama/; s|bpe/vocab.json|sp/tokenizer.json|; s|bpedata/|spdata/|' \
  gpt2bpe.yaml >llamasp.yaml
GENERATED_TEXT=1 export_check llamasp
run_cmd import-llamasp "$LLMTRAIN" import hf-llamasp --out ck-llamasp
expect_status 0
"$LLMTRAIN" generate ck-llamasp --prompt "$text" --temperature 0 --max-tokens 64 --ignore-eod --ids >ck-llamasp.ids \
  2>/dev/null || fail "generate from the imported SentencePiece-style model"
cmp -s ck-llamasp.ids llamasp.ids && pass "imported with its tokenizer.json, it generates the exported model's tokens" ||
  fail "the import generates $(cat ck-llamasp.ids), the original $(cat llamasp.ids)"
run_cmd export-exists "$LLMTRAIN" export runs/gpt2 --hf hf-gpt2
expect_status 2; expect_out "already exists and is not an empty directory"
run_cmd export-bf16 "$LLMTRAIN" export runs/gpt2 --hf hf-gpt2-bf16 --dtype bf16
expect_status 0
grep -q '"torch_dtype": "bfloat16"' hf-gpt2-bf16/config.json && pass "bf16 export says torch_dtype bfloat16" ||
  fail "bf16 export's config.json: $(cat hf-gpt2-bf16/config.json)"

# Random transformers models -> llmtrain -> transformers. The byte tokenizer's files make them usable
# for generation (their 300 ids hold its 257).
for family in gpt2 llama; do
  $CHECK random $family rand-$family >/dev/null || fail "creating a random $family with transformers"
  cp hf-gpt2/tokenizer.json hf-gpt2/tokenizer_config.json rand-$family/
  run_cmd "import-$family" "$LLMTRAIN" import rand-$family --out ck-$family
  expect_status 0
  "$LLMTRAIN" generate ck-$family --prompt "$text" --temperature 0 --max-tokens 64 --ignore-eod --ids \
    --logits-out r$family.logits.safetensors >r$family.ids 2>/dev/null || fail "generate from imported $family"
  run_cmd "imported-$family-vs-transformers" $CHECK logits rand-$family r$family.logits.safetensors r$family.ids
  expect_status 0
  echo "$out" | grep -E '^(ok|FAIL)' | sed "s/^/  imported $family: /"
  run_cmd "reexport-$family" "$LLMTRAIN" export ck-$family --hf re-$family
  expect_status 0
  run_cmd "import-export-identical-$family" $CHECK same-tensors rand-$family re-$family
  expect_status 0; expect_out "byte-identical"
done
# bf16 files: import widens exactly, export --dtype bf16 rounds back to the same words.
$CHECK resave rand-llama rand-llama-bf16 --bf16 >/dev/null || fail "resaving in bf16"
run_cmd import-bf16 "$LLMTRAIN" import rand-llama-bf16 --out ck-llama-bf16
expect_status 0
"$LLMTRAIN" export ck-llama-bf16 --hf re-llama-bf16 --dtype bf16 >/dev/null 2>&1 || fail "export of the bf16 import"
run_cmd import-export-identical-bf16 $CHECK same-tensors rand-llama-bf16 re-llama-bf16
expect_status 0; expect_out "byte-identical"
# The trained GPT-2 as transformers writes it (its own file, tensor order and names), imported back:
# our greedy tokens are transformers'.
$CHECK resave hf-gpt2 resaved-gpt2 >/dev/null || fail "resaving with transformers"
run_cmd import-resaved "$LLMTRAIN" import resaved-gpt2 --out ck-resaved --recipe gpt2.yaml
expect_status 0
"$LLMTRAIN" generate ck-resaved --prompt "$text" --temperature 0 --max-tokens 64 --ignore-eod --ids \
  --logits-out resaved.logits.safetensors >resaved.ids 2>/dev/null || fail "generate from the resaved import"
run_cmd resaved-vs-transformers $CHECK logits resaved-gpt2 resaved.logits.safetensors resaved.ids
expect_status 0
cmp -s resaved.ids gpt2.ids && pass "greedy tokens identical both ways (llmtrain -> transformers -> llmtrain)" ||
  fail "the re-imported model generates $(cat resaved.ids), the original $(cat gpt2.ids)"

# Fine-tuning from an import: the derived recipe with a dataset, weights loaded, training runs.
run_cmd finetune "$LLMTRAIN" run ck-gpt2/recipe.yaml --set data.train=$PWD/data/train --set train.steps=3 \
  --set model.seq_len=64 --set log.dir=runs/ft --set log.every=1
expect_status 0; expect_out "fine-tuning from the weights of $PWD/ck-gpt2/step_00000000"

# ckpt inspect: intact, then one flipped byte named.
run_cmd inspect "$LLMTRAIN" ckpt inspect runs/llama
expect_status 0; expect_out "layout: tp 1 × pp 1 × dp 1, zero 0"; expect_out_re "checksums: all [0-9]+ slices verified"
cp -r runs/llama/ckpt/step_00000040 damaged
printf '\x55' | dd of=damaged/rank_00000.safetensors bs=1 seek=20000 conv=notrunc 2>/dev/null
run_cmd inspect-damaged "$LLMTRAIN" ckpt inspect damaged
expect_status 1; expect_out "DAMAGED: 1 problem"; expect_out "checksum mismatch"

# Refusals, each naming what it refuses.
mkdir sp-model-only && cp rand-llama/config.json rand-llama/model.safetensors sp-model-only/
printf '\x0a\x05<unk>' >sp-model-only/tokenizer.model
run_cmd import-sentencepiece-model "$LLMTRAIN" import sp-model-only --out ck-sp-model-only
expect_status 2; expect_out "SentencePiece .model files are not read, and there is no tokenizer.json beside it"
cp -r rand-llama bad-llama
sed -i 's/"rope_scaling": null/"rope_scaling": {"type": "dynamic", "factor": 2.0}/; s/"attention_bias": false/"attention_bias": true/' \
  bad-llama/config.json
run_cmd import-refuses-fields "$LLMTRAIN" import bad-llama --out ck-bad
expect_status 2; expect_out 'rope_scaling.rope_type: found "dynamic"'; expect_out "attention_bias: found true"
[[ ! -e ck-bad ]] && pass "a refused import writes nothing" || fail "ck-bad was written"
run_cmd import-recipe-mismatch "$LLMTRAIN" import rand-gpt2 --out ck-x --recipe gpt2.yaml
expect_status 2; expect_out "model.vocab: the recipe says 257"
$HFPY - <<'PY' || fail "adding a tensor"
from safetensors.numpy import load_file, save_file
import numpy as np, shutil
shutil.copytree("rand-gpt2", "extra-gpt2")
t = load_file("extra-gpt2/model.safetensors")
t["transformer.h.0.attn.q_norm.weight"] = np.ones(64, dtype=np.float32)
save_file(t, "extra-gpt2/model.safetensors", metadata={"format": "pt"})
PY
run_cmd import-refuses-tensor "$LLMTRAIN" import extra-gpt2 --out ck-extra
expect_status 2; expect_out "tensor transformer.h.0.attn.q_norm.weight is not part of the gpt2 model"
finish
