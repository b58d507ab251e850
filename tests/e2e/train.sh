#!/usr/bin/env bash
# `llmtrain run` end to end on real text (Debian's fortunes): determinism, the run directory and
# metrics, exact resume after SIGKILL, SIGTERM -> checkpoint + exit 75 -> resume, a second signal,
# fine-tuning from weights only, non-finite losses, and a damaged checkpoint at resume.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT

"$LLMTRAIN" prep --input $(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese) --separator % \
  --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1 || { echo "FAIL: prep"; exit 1; }

# A small, fast model; every step logged so losses can be compared step by step.
cat >r.yaml <<'YAML'
name: e2e
model: {family: gpt2, layers: 2, hidden: 64, heads: 4, seq_len: 64}
data: {tokenizer: byte, train: data/train, valid: data/valid}
train: {steps: 60, micro_batch: 4, global_batch: 8, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 5}
checkpoint: {every: 10, keep: 3}
eval: {every: 20, batches: 2}
log: {every: 1}
YAML
run() { "$LLMTRAIN" run r.yaml --set log.dir="$1" "${@:2}"; }
# The "loss" of every step record, one per line: "step loss".
losses() { $PY -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if "loss" in j: print(j["step"], repr(j["loss"]))' "$1/metrics.jsonl"; }

# 1. A full run: exit 0, the run directory, metrics fields, checkpoints kept.
run_cmd full run A
expect_status 0
expect_out "done: 60 steps"
expect_out "eval at step 60"
[[ -f A/recipe.yaml && -f A/train.log && -f A/metrics.jsonl ]] && pass "run directory has recipe.yaml, train.log, metrics.jsonl" ||
  fail "run directory incomplete: $(ls A)"
$PY - A/metrics.jsonl <<'PY' && pass "metrics.jsonl fields" || fail "metrics.jsonl fields"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "loss" in r]
evals = [r for r in recs if "val_loss" in r]
assert [r["step"] for r in steps] == list(range(1, 61)), [r["step"] for r in steps]
for r in steps:
    for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "elapsed_s"):
        assert k in r, (k, r)
assert [r["step"] for r in evals] == [20, 40, 60], evals
assert all(abs(r["val_ppl"] - __import__("math").exp(r["val_loss"])) < 1e-6 * r["val_ppl"] for r in evals)
assert evals[-1]["val_loss"] < evals[0]["val_loss"], evals  # it learns
PY
[[ $(cat A/ckpt/latest) == step_00000060 ]] && pass "latest names step 60" || fail "latest: $(cat A/ckpt/latest)"
[[ $(ls A/ckpt | grep -c '^step_') == 3 ]] && pass "keep: 3 checkpoints kept" || fail "kept: $(ls A/ckpt)"

# 2. Determinism: the same recipe again gives bitwise the same losses.
run_cmd again run A2
expect_status 0
diff <(losses A) <(losses A2) >/dev/null && pass "two runs log identical losses" || fail "runs differ: $(diff <(losses A) <(losses A2) | head -4)"

# 3. SIGKILL after step 37 (checkpoint every 10), then resume: steps 31..60 bitwise as run A.
run_cmd killed env LLMTRAIN_FAULT=kill@37 "$LLMTRAIN" run r.yaml --set log.dir=B
expect_status 137
[[ $(cat B/ckpt/latest) == step_00000030 ]] && pass "latest after the kill is step 30" || fail "latest: $(cat B/ckpt/latest)"
run_cmd resumed run B
expect_status 0
expect_out "resuming from"
expect_out "at step 30"
diff <(losses A) <(losses B) >/dev/null && pass "resumed run's losses equal the uninterrupted run's at every step" ||
  fail "resume diverged: $(diff <(losses A) <(losses B) | head -6)"

# 4. SIGTERM: finish the step, checkpoint, exit 75; the same command resumes and finishes with
#    the uninterrupted run's losses.
"$LLMTRAIN" run r.yaml --set log.dir=C --set train.steps=400 --set checkpoint.every=1000 >C.out 2>&1 &
pid=$!
timeout 60 bash -c 'until [[ -f C/metrics.jsonl ]] && (( $(wc -l <C/metrics.jsonl) >= 5 )); do sleep 0.05; done'
kill -TERM $pid
wait $pid; status=$?; out=$(cat C.out); last_name=sigterm
expect_status 75
expect_out "stop requested (signal): writing a checkpoint"
stopped=$(cat C/ckpt/latest 2>/dev/null)
[[ -n $stopped && $stopped != step_00000400 ]] && pass "checkpoint written at the interrupted step ($stopped)" || fail "no checkpoint at the stop: $stopped"
run_cmd sigterm-resume run C --set train.steps=400 --set checkpoint.every=1000
expect_status 0
run_cmd uninterrupted run D --set train.steps=400 --set checkpoint.every=1000
expect_status 0
diff <(losses C) <(losses D) >/dev/null && pass "after SIGTERM and resume, losses equal the uninterrupted run's" ||
  fail "SIGTERM resume diverged: $(diff <(losses C) <(losses D) | head -6)"

# 5. A second signal exits at once (128 + SIGTERM).
#    (A larger model, so that a step outlasts the gap between the two signals.)
"$LLMTRAIN" run r.yaml --set log.dir=E --set train.steps=100000 --set checkpoint.every=0 --set model.hidden=256 \
  --set model.seq_len=256 --set train.micro_batch=8 --set train.global_batch=16 >E.out 2>&1 &
pid=$!
timeout 60 bash -c 'until [[ -f E/metrics.jsonl ]] && (( $(wc -l <E/metrics.jsonl) >= 1 )); do sleep 0.05; done'
kill -TERM $pid; sleep 0.1; kill -TERM $pid
wait $pid; status=$?; out=$(cat E.out); last_name=second-signal
expect_status 143
expect_out "second signal"

# 6. Fine-tuning from weights only: step, optimizer and data position start fresh.
run_cmd weights-only run F --set checkpoint.resume="$PWD/A/ckpt/step_00000060" --set checkpoint.load_weights_only=true \
  --set train.steps=5
expect_status 0
expect_out "fine-tuning from the weights of"
$PY - A F <<'PY' && pass "fine-tuning starts at step 1 from the trained weights" || fail "weights-only start"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l]
f = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl") if '"loss"' in l]
assert f[0]["step"] == 1
assert f[0]["loss"] < a[0]["loss"] - 1.0, (f[0]["loss"], a[0]["loss"])
PY

# The same command again continues the fine-tuning run from its own checkpoint, not from A's.
run_cmd weights-only-again run F --set checkpoint.resume="$PWD/A/ckpt/step_00000060" --set checkpoint.load_weights_only=true \
  --set train.steps=8 --allow-change train.steps
expect_status 0
expect_out "already holds this run's checkpoints: continuing from them"
expect_out "at step 5"
expect_out "accepted by --allow-change: train.steps 5 → 8"

# 7. Non-finite losses: stop (exit 2, the reason) or skip (counted, then stop after K in a row).
run_cmd nonfinite-stop run G --set model.init_std=1e30 --set checkpoint.resume=none
expect_status 2
expect_out_re "non-finite (loss|gradient) at step 1"
run_cmd nonfinite-skip run H --set model.init_std=1e30 --set checkpoint.resume=none --set train.on_nonfinite=skip \
  --set train.max_skipped_steps=3
expect_status 2
expect_out "update skipped (3 in a row)"
expect_out "4 non-finite steps in a row"

# 8. A damaged newest checkpoint: resume: auto falls back to the previous one and says why.
cp -r A I
printf 'garbage' >I/ckpt/step_00000060/rank_00000.safetensors
run_cmd damaged-fallback run I --set train.steps=70 --allow-change train.steps
expect_status 0
expect_out "skipping damaged checkpoint"
expect_out "step_00000060/rank_00000.safetensors"
expect_out "resuming from"
expect_out "at step 50"

# 9. Generation from a checkpoint: streamed after the prompt, reproducible with a seed; run
#    directories, checkpoint directories and step directories all work; why it stopped.
run_cmd generate "$LLMTRAIN" generate A --prompt "The meaning of life is" --max-tokens 40 --seed 3
expect_status 0
expect_out "The meaning of life is"
expect_out "generating from A/ckpt/step_00000060 (step 60"
first=$("$LLMTRAIN" generate A/ckpt --prompt "Q:" --max-tokens 40 --seed 3 2>/dev/null)
again=$("$LLMTRAIN" generate A/ckpt/step_00000060 --prompt "Q:" --max-tokens 40 --seed 3 2>/dev/null)
other=$("$LLMTRAIN" generate A/ckpt/step_00000060 --prompt "Q:" --max-tokens 40 --seed 4 2>/dev/null)
[[ $first == "$again" && ${#first} -gt 3 ]] && pass "same seed, same text" || fail "generation not reproducible: [$first] vs [$again]"
[[ $first != "$other" ]] && pass "another seed, another text" || fail "seed ignored"
# Why generation stopped, on stderr after the text: --max-tokens, the context (64 positions) full,
# the end of a document (a model that has seen only the document "hi" ends it after "hi").
run_cmd generate-max-tokens "$LLMTRAIN" generate A --prompt "The meaning of li" --max-tokens 5 --seed 3
expect_status 0; expect_out "stopped after 5 tokens: --max-tokens 5 reached"
long="A man who carries a cat by the tail learns something he can"  # 59 bytes: 5 positions left
run_cmd generate-context "$LLMTRAIN" generate A --prompt "$long" --max-tokens 50 --seed 3
expect_status 0; expect_out "stopped after 6 tokens: the model's context of 64 tokens is full (model.max_positions)"
for i in $(seq 200); do printf 'hi\n%%\n'; done >hi.txt
"$LLMTRAIN" prep --input hi.txt --separator % --tokenizer byte --output hi/ >/dev/null 2>&1 || fail "prep hi"
run_cmd train-hi "$LLMTRAIN" run r.yaml --set log.dir=H --set data.train=hi/train --set data.valid=null \
  --set model.seq_len=16 --set train.steps=60 --set checkpoint.every=0 --set eval.every=0 --set log.every=60 \
  --set optimizer.warmup=0 --set optimizer.lr=1e-2 --set optimizer.min_lr=1e-2 --set log.peak_tflops=1
expect_status 0
run_cmd generate-eod "$LLMTRAIN" generate H --prompt "h" --temperature 0 --max-tokens 50
expect_status 0; expect_out_re "stopped after [1-9] tokens?: end of document \(the model produced the end-of-document token\)"
run_cmd generate-missing "$LLMTRAIN" generate nowhere --prompt x
expect_status 2
expect_out "nowhere does not exist"

# Resume refuses a checkpoint written with other data (identified by contents, not path), unless
# load_weights_only; the same data at another path resumes.
run_cmd resume-other-data run R1 --set checkpoint.resume="$WORK/A/ckpt/step_00000040" --set data.train=hi/train \
  --set data.valid=null
expect_status 2
expect_out "was written with other training data"
expect_out "load_weights_only"
run_cmd finetune-other-data run R2 --set checkpoint.resume="$WORK/A/ckpt/step_00000040" --set data.train=hi/train \
  --set data.valid=null --set checkpoint.load_weights_only=true --set train.steps=2 --set optimizer.warmup=1
expect_status 0
cp -r data moved
run_cmd resume-moved-data run R3 --set checkpoint.resume="$WORK/A/ckpt/step_00000040" --set data.train=moved/train \
  --set data.valid=moved/valid
expect_status 0
expect_out "resuming from"
diff <(losses A | tail -20) <(losses R3) >/dev/null && pass "data at another path: the same losses as run A" ||
  fail "moved data diverged: $(diff <(losses A | tail -20) <(losses R3) | head -4)"

# 10. A resume that changes what the run computes is refused before anything is written, naming
#     each change with both values and the flag that accepts them (a dry run says so and exits 2);
#     --allow-change takes them: a longer run's cosine continues from the checkpoint's learning
#     rate, without a jump, and keeps doing so when it is resumed again; harmless changes are taken
#     with a line.
mkdir -p S/ckpt && cp -r A/ckpt/step_00000040 S/ckpt/ && echo step_00000040 >S/ckpt/latest
run_cmd resume-changed run S --set train.steps=100 --set optimizer.lr=1 --set train.global_batch=16 \
  --set model.seq_len=32 --set train.seed=8
expect_status 2
expect_out "resuming $WORK/S/ckpt/step_00000040: this recipe changes what the run computes"
expect_out "train.steps 60 → 100 (optimizer.decay_steps, auto, with it)"
expect_out "optimizer.lr 0.003 → 1"
expect_out "train.global_batch 8 → 16"
expect_out "model.seq_len 64 → 32 (model.max_positions, auto, with it)"
expect_out "train.seed 7 → 8"
expect_out "--allow-change model.seq_len,optimizer.lr,train.global_batch,train.seed,train.steps"
[[ ! -e S/train.log && ! -e S/recipe.yaml ]] && pass "a refused resume writes nothing into the run" ||
  fail "a refused resume wrote into the run: $(ls S)"
run_cmd resume-changed-dry run S --set train.steps=100 --dry-run
expect_status 2
expect_out "cannot run: resuming $WORK/S/ckpt/step_00000040"
run_cmd resume-bad-key run S --allow-change train.stesp
expect_status 2
expect_out "--allow-change train.stesp: not a recipe key or section"
expect_out "did you mean train.steps?"
run_cmd resume-longer env LLMTRAIN_FAULT=kill@75 "$LLMTRAIN" run r.yaml --set log.dir=S --set train.steps=100 \
  --set log.every=2 --allow-change train.steps
expect_status 137
expect_out "accepted by --allow-change: train.steps 60 → 100 (optimizer.decay_steps, auto, with it)"
expect_out "taken as they are (they do not change what the run computes): "
expect_out_re "taken as they are .*log.every 1 → 2"
expect_out "its end moved from step 60 to 100: from step 40 it continues from"
run_cmd resume-longer-again run S --set train.steps=100 --set log.every=2
expect_status 0
expect_out "at step 70"
$PY - A S <<'PY' && pass "the longer schedule continues from step 40's learning rate to min_lr at 100, across a second resume" ||
import json, math, sys
lr = {}
for d in sys.argv[1:]:
    for l in open(d + "/metrics.jsonl"):
        j = json.loads(l)
        if "lr" in j: lr[(d, j["step"])] = j["lr"]  # a record's lr is that of its step's update (0-based step - 1)
# Run A's schedule at the 0-based step 40 (warmup 5, to step 60): where S continues from.
start = 3e-4 + (3e-3 - 3e-4) * 0.5 * (1 + math.cos(math.pi * (40 - 5) / (60 - 5)))
assert abs(lr[("A", 41)] - start) <= 1e-9 * start, (lr[("A", 41)], start)
for k in range(42, 101, 2):
    want = 3e-4 + (start - 3e-4) * 0.5 * (1 + math.cos(math.pi * (k - 1 - 40) / (100 - 40)))
    assert abs(lr[("S", k)] - want) <= 1e-9 * want, (k, lr[("S", k)], want)
PY
  fail "the longer schedule: $(grep -o '"lr":[^,]*' S/metrics.jsonl | head -5)"

# 10b. The warmup-stable-decay schedule: a 20-step run (decay over its last quarter) extended from its
#     step-10 checkpoint, in the stable phase, to 40 steps takes the learning rate of a 40-step run
#     at every step: lr until step 30, then 1 − √p down to min_lr.
wsd=(--set optimizer.schedule=wsd --set optimizer.wsd_decay_fraction=0.25 --set train.steps=20)
run_cmd wsd-20 run W "${wsd[@]}"
expect_status 0
mkdir -p V/ckpt && cp -r W/ckpt/step_00000010 V/ckpt/ && echo step_00000010 >V/ckpt/latest
run_cmd wsd-extended run V "${wsd[@]}" --set train.steps=40 --allow-change train.steps
expect_status 0
expect_out "its end moved from step 20 to 40 in the stable phase: lr 0.003 until step 30"
$PY - W V <<'PY' && pass "wsd extended in its stable phase follows a 40-step run's curve (and the 20-step run its own)" ||
import json, math, sys
def wsd(step, steps):  # 0-based update step; warmup 5, lr 3e-3, min_lr 3e-4, the last quarter decaying
    start = steps - round(0.25 * steps)
    if step < 5: return 3e-3 * (step + 1) / 5
    if step < start: return 3e-3
    return 3e-4 + (3e-3 - 3e-4) * (1 - math.sqrt((step - start) / (steps - start)))
for d, steps, first in (("W", 20, 1), ("V", 40, 11)):
    lr = {j["step"]: j["lr"] for j in map(json.loads, open(d + "/metrics.jsonl")) if "lr" in j}
    assert sorted(lr) == list(range(first, steps + 1)), (d, sorted(lr))
    for k, v in lr.items():
        assert abs(v - wsd(k - 1, steps)) <= 1e-9 * v, (d, k, v, wsd(k - 1, steps))
PY
  fail "the wsd schedule: $(grep -o '"lr":[^,]*' V/metrics.jsonl | head -40 | tr '\n' ' ')"

# 11. Missing data is a user error before training starts.
run_cmd missing-data run J --set data.train=nowhere/train
expect_status 2
expect_out "nowhere/train"

# 12. One job per checkpoint directory: a second run on a directory whose holder is alive (stopped
#     by SIGSTOP after step 2, LLMTRAIN_FAULT=hang) is refused before it touches anything, naming
#     the holder, after waiting 10 s for it to end (a holder on this host may be a rank still
#     exiting); once the holder is gone (SIGKILL), its lock is taken over, and the `.partial`
#     directories of dead saves with it.
env LLMTRAIN_FAULT=hang@2 "$LLMTRAIN" run r.yaml --set log.dir=L >L.out 2>&1 &
holder=$!
timeout 120 bash -c 'until [[ -f L/ckpt/lock ]]; do sleep 0.05; done' || fail "lock: no L/ckpt/lock within 120 s"
# (stopped by its SIGSTOP: from here on it writes nothing)
timeout 120 bash -c "until [[ \$(ps -o stat= -p $holder) == T* ]]; do sleep 0.05; done" || fail "lock: the holder did not stop"
# A save that died (a double Ctrl-C) left step_00000099.partial/: kept while the holder lives.
mkdir -p L/ckpt/step_00000099.partial && touch L/ckpt/step_00000099.partial/rank_00000.safetensors
before=$(md5sum L/train.log L/recipe.yaml)
run_cmd lock-held run L2 --set checkpoint.dir=L/ckpt
expect_status 2
expect_out "is in use by another job"
expect_out "pid $holder"
expect_out "(waited 10 s for it to end)"
# The same run again: refused, and nothing written into the live run (its log, its recipe).
run_cmd lock-held-same-run run L --set checkpoint.every=5
expect_status 2
expect_out "is in use by another job"
[[ $(md5sum L/train.log L/recipe.yaml) == "$before" ]] && pass "a run the lock refuses writes nothing into the live run" ||
  fail "the refused run wrote into the live run: $(tail -3 L/train.log)"
[[ -d L/ckpt/step_00000099.partial ]] && pass "a .partial kept while its directory's holder lives" ||
  fail "the .partial of a live holder's directory was removed"
kill -KILL $holder 2>/dev/null
wait $holder 2>/dev/null
run_cmd lock-taken-over run L2 --set checkpoint.dir=L/ckpt --set train.steps=2 --set optimizer.warmup=1
expect_status 0
expect_out "taking over its lock (its holder, pid $holder on this host, is gone)"
expect_out "removed $WORK/L/ckpt/step_00000099.partial, left by a save that did not finish"
[[ ! -e L/ckpt/step_00000099.partial ]] && pass "a dead .partial removed by the next holder" ||
  fail "dead .partial left: $(ls L/ckpt)"
[[ ! -e L/ckpt/lock ]] && pass "the lock is released at the end" || fail "lock left behind: $(cat L/ckpt/lock)"

# 13. log.profile ops: steps 2 and 3 of 4 timed per op; rank 0's table in the log and its JSON.
run_cmd profile run P --set train.steps=4 --set log.profile=ops --set log.profile_steps=2 --set optimizer.warmup=1 \
  --set checkpoint.every=0 --set eval.every=0 --set checkpoint.resume=none
expect_status 0
expect_out "op profile (log.profile: ops), rank 0 on cpu: 2 step(s) from step 2"
expect_out_re "  linear_forward +28 +[0-9.]+ +[0-9.]+ +[0-9.]+%"
expect_out_re "  linear_gelu_forward +8 "
expect_out_re "  attention_forward +8 "
expect_out_re "  in ops \(the total\) +[0-9]+ "
expect_out "op profile written to $WORK/P/op_profile.json"
$PY - P/op_profile.json <<'PY' && pass "op_profile.json: the table's rows and totals" || fail "op_profile.json: $(cat P/op_profile.json)"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["device"] == "cpu" and j["rank"] == 0 and j["steps"] == 2 and j["first_step"] == 2, j
ops = {o["name"]: o for o in j["ops"]}
for name in ("linear_forward", "linear_backward", "attention_forward", "attention_backward", "layernorm_forward",
             "linear_gelu_forward", "cross_entropy_forward", "adamw_rows", "copy"):
    assert name in ops, name
# 2 micro-batches a step, 2 blocks of 4 products and the head each: 18 products a step, the MLP's
# first with its GELU (linear_gelu_forward).
assert ops["linear_forward"]["calls"] == 28, ops["linear_forward"]
assert ops["linear_gelu_forward"]["calls"] == 8, ops["linear_gelu_forward"]
totals = [o["total_ms"] for o in j["ops"]]
assert totals == sorted(totals, reverse=True), totals
assert abs(sum(totals) - j["in_ops_ms"]) < 1e-6 * j["in_ops_ms"], (sum(totals), j["in_ops_ms"])
assert 0 < j["in_ops_ms"] <= j["step_ms"] and abs(sum(o["share"] for o in j["ops"]) - j["in_ops_ms"] / j["step_ms"]) < 1e-9
PY

finish
