#!/usr/bin/env bash
# Hostile inputs to the commands that read files someone else may have written and write outputs
# (issue 33), as a user meets them: export, import, ckpt inspect, generate, plot and plan on
# crafted checkpoints, model directories, metrics and flags. Each case failed before its fix:
#  - export --hf DIR/ deleted its own output; an existing DIR.partial was deleted; a model the
#    manifest claims is allocated only after it is checked against the files;
#  - import into a checkpoint directory in use rewrote its `latest`; a line break in the model
#    directory's path added keys to the derived recipe;
#  - names with terminal control sequences were printed raw (ckpt inspect, import's errors);
#  - generate --max-tokens near 2^63 overflowed, --prompt-ids 1,,2 dropped the empty element;
#  - plot never finished on a subnormal value; plan --gpus 0 named a range of doubles;
#  - (issue 65) import wrote a recipe `validate` refuses (an odd head_dim); generate on a vocabulary
#    padded past its tokenizer's ids stopped half-way at an id the tokenizer cannot decode.
source "$(dirname "$0")/lib.sh"
py() { python3 - "$@"; }
esc=$'\e'

# A tiny checkpoint of our own (a few seconds).
for i in $(seq 1 300); do echo "line $i of a small text to train on, hello world"; done >text.txt
"$LLMTRAIN" prep --input text.txt --tokenizer byte --output data/ >/dev/null 2>&1 ||
  { echo "FAIL: prep"; exit 1; }
cat >r.yaml <<'YAML'
name: h
model: {family: llama, layers: 1, hidden: 32, heads: 2, kv_heads: 2, ffn_hidden: 64, seq_len: 16, max_positions: 32}
data: {tokenizer: byte, train: data/train}
train: {steps: 2, micro_batch: 2, global_batch: 2, threads: 1}
checkpoint: {every: 2}
eval: {every: 0}
log: {every: 1}
YAML
run_cmd train "$LLMTRAIN" run r.yaml --set log.dir=R
expect_status 0
step=R/ckpt/step_00000002

# --- outputs that destroy what they did not make -------------------------------------------------
mkdir -p out
run_cmd export-trailing-slash "$LLMTRAIN" export R --hf out/
expect_status 0
[[ -f out/config.json && -f out/model.safetensors ]] && pass "export DIR/ fills DIR" || fail "export DIR/: $(ls -a out)"
[[ -z $(ls -d out.partial* out/.partial* 2>/dev/null) ]] && pass "no scratch left" || fail "left: $(ls -d out*)"

mkdir -p other.partial && echo mine >other.partial/keep
run_cmd export-beside-a-partial "$LLMTRAIN" export R --hf other
expect_status 0
[[ $(cat other.partial/keep 2>/dev/null) == mine ]] && pass "an existing OUT.partial is left alone" ||
  fail "other.partial was deleted"

mkdir -p busy && echo step_00000007 >busy/latest
printf '{"host":"%s","pid":%d,"job":"","renewed_unix":%d,"nonce":"x"}' "$(hostname)" $$ "$(date +%s)" >busy/lock
run_cmd import-into-a-locked-dir "$LLMTRAIN" import out --out busy
expect_status 2
expect_out "locked by host"
[[ $(cat busy/latest) == step_00000007 && ! -e busy/step_00000000 ]] && pass "the run's checkpoint dir is untouched" ||
  fail "busy was written: $(ls busy) latest=$(cat busy/latest)"

# --- memory asked for before it is checked -------------------------------------------------------
cp -r "$step" claim
py claim/manifest.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["recipe"] = m["recipe"].replace("layers: 1\n", "layers: 60000\n").replace("hidden: 32\n", "hidden: 65536\n")
json.dump(m, open(sys.argv[1], "w"))
PY
# (Before the fix: 60,000 layers of hidden 65536, allocated: "out of memory" at best. Bounded here.)
run_cmd export-a-claimed-giant bash -c "ulimit -v 8000000; exec '$LLMTRAIN' export claim --hf giant"
expect_status 2
expect_out "layers, but the manifest lists"
[[ ! -e giant ]] && pass "nothing written" || fail "giant was written"

cp -r "$step" long
py long/manifest.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["recipe"] = m["recipe"].replace("seq_len: 16\n", "seq_len: 16777216\n").replace("max_positions: 32\n", "max_positions: 16777216\n")
json.dump(m, open(sys.argv[1], "w"))
PY
# (The same parameters, but a context of 2^24 tokens: its KV cache and activations, checked first.)
run_cmd generate-a-claimed-context bash -c "ulimit -v 4000000; exec '$LLMTRAIN' generate long --max-tokens 9223372036854775807"
expect_status 1
expect_out "more than this host's address-space limit"

# --- values from files reaching generated text ---------------------------------------------------
evil=$'model\nparallel: {tp: 3}'
cp -r out "$evil"
run_cmd import-line-break-in-path "$LLMTRAIN" import "$evil" --out imported
expect_status 0
grep -q '^parallel' imported/recipe.yaml && fail "a key was added: $(cat imported/recipe.yaml)" ||
  pass "the path stays in its comment"
run_cmd derived-recipe-validates "$LLMTRAIN" validate imported/recipe.yaml --set data.train=data/train
expect_status 0

# --- outputs that accept what the next step refuses ---------------------------------------------
# import applies the recipe's model checks before it writes: an odd head_dim (RoPE rotates pairs)
# is refused naming the field, and nothing is written.
cp -r out oddhead
py oddhead/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["head_dim"] = 15
json.dump(c, open(sys.argv[1], "w"))
PY
run_cmd import-odd-head-dim "$LLMTRAIN" import oddhead --out oddimport
expect_status 2
expect_out "model.head_dim"
[[ ! -e oddimport ]] && pass "import wrote nothing for a model its recipe would refuse" || fail "oddimport: $(ls oddimport)"
# generate on a model whose vocabulary (300) is padded past its tokenizer's 257 ids: only ids the
# tokenizer decodes are sampled, so the text never stops half-way at one it cannot (before, 200
# near-uniform draws met one of the 43 others at once). --ids decodes nothing and samples every id,
# as transformers' generate does (the parity tools compare them).
run_cmd train-padded-vocab "$LLMTRAIN" run r.yaml --set log.dir=P --set model.vocab=300 --set model.max_positions=256
expect_status 0
run_cmd generate-padded-vocab bash -c '"$0" generate P --max-tokens 200 --temperature 100 --seed 1 --ignore-eod >text.out' \
  "$LLMTRAIN"
expect_status 0
expect_out "sampling among the 257 of the model's 300 ids its tokenizer decodes"
expect_out "stopped after 200 tokens"
run_cmd generate-padded-vocab-ids "$LLMTRAIN" generate P --max-tokens 200 --temperature 100 --seed 1 --ignore-eod --ids
expect_status 0
ids=$(grep -E '^[0-9 ]+$' <<<"$out" | tail -1)
awk -v s="$ids" 'BEGIN { n = split(s, a, " "); for (i = 1; i <= n; ++i) if (a[i] > 256) exit 0; exit 1 }' &&
  pass "--ids samples every id of the model (one past the tokenizer's among them)" || fail "--ids: $ids"

# --- terminal control sequences from files -------------------------------------------------------
cp -r "$step" esc
py esc/manifest.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["tensors"][0]["name"] = "wte\u001b[2J\u001b]0;pwned\u0007"
json.dump(m, open(sys.argv[1], "w"))
PY
run_cmd inspect-escape-in-a-name "$LLMTRAIN" ckpt inspect esc
[[ $out != *"$esc"* ]] && pass "inspect prints no ESC" || fail "raw ESC printed by inspect"
expect_out 'wte\x1b[2J\x1b]0;pwned\x07'
cp -r out escmodel
py escmodel/model.safetensors <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
h["evil\u001b[31m\u009b2J"] = {"dtype": "F32", "shape": [0], "data_offsets": [end, end]}  # one tensor too many
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
run_cmd import-escape-in-a-name "$LLMTRAIN" import escmodel --out escimport
expect_status 2
[[ $out != *"$esc"* && $out != *$'\xc2\x9b'* ]] && pass "import's error prints no ESC or CSI" ||
  fail "raw control sequence printed by import"
expect_out 'evil\x1b[31m\u009b2J'

# --- arithmetic on hostile numbers ---------------------------------------------------------------
run_cmd generate-max-tokens-2^63 "$LLMTRAIN" generate R --max-tokens 9223372036854775807 --temperature 0 --ids \
  --ignore-eod
expect_status 0
expect_out "the model's context of 32 tokens is full"
run_cmd generate-empty-id "$LLMTRAIN" generate R --prompt-ids 1,,2
expect_status 2
expect_out "--prompt-ids 1,,2: element 2 is empty"

printf '{"step":1,"loss":5e-324}\n{"step":2,"loss":4.9e-324}\n' >subnormal.jsonl
run_cmd plot-subnormal timeout 60 "$LLMTRAIN" plot subnormal.jsonl -o subnormal.png
expect_status 0
printf '{"step":1,"loss":1.7976931348623157e308}\n' >huge.jsonl
run_cmd plot-huge timeout 60 "$LLMTRAIN" plot huge.jsonl -o huge.svg
expect_status 2
expect_out "too large"
[[ $out != *disk* ]] && pass "plot does not blame the disk" || fail "plot blames the disk: $out"

run_cmd plan-no-gpus "$LLMTRAIN" plan r.yaml --gpus 0
expect_status 2
expect_out "--gpus 0: expected 1 to 65536"
[[ $out != *e-308* ]] && pass "no range of doubles" || fail "misleading range: $out"

finish
