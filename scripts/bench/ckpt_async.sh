#!/usr/bin/env bash
# Step time around a checkpoint save, synchronous against asynchronous (checkpoint.async), for a
# model whose save takes seconds: LLaMA 8 × 1024 (~110 M parameters, ~1.3 GB of fp32 parameters and
# Adam moments per checkpoint) on one CPU rank, a short sequence so that a step is short beside a
# save. Three runs of the same steps in the same invocation: no checkpoint but the final one
# (baseline), saves every SAVE_EVERY steps synchronously, the same asynchronously. Prints, per run,
# the loop's wall time from step 1's metrics record to the last step's (the final save, which
# every run writes the same way, is after it), the mean wall time between records for the steps
# that include a save (sync: the whole save; async: the snapshot), for the step after those (a
# background write competes with it for the cores and the disk) and for the others; then the
# logged save, snapshot, background-write and commit times.
#
#   scripts/bench/ckpt_async.sh [STEPS] [SAVE_EVERY] [THREADS]
#     defaults 12 4 and all cores (train.threads); build in ${LLMTRAIN_BUILD_DIR:-build}. With
#     THREADS below the cores, a core is left for the background writer, as on a GPU node (where the
#     step runs on the GPU and the host's cores are mostly idle).
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-12}
every=${2:-4}
threads=${3:-$(nproc)}
build=${LLMTRAIN_BUILD_DIR:-build}
bin=$(realpath "$build/llmtrain")
[[ -x $bin ]] || { echo "build first: cmake --build $build --target llmtrain" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-ckpt-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# checkpoint.dir on $(df -h "$work" | awk 'NR==2 {print $1, $2}'); train.threads $threads; $steps steps, a save every $every"
src=$PWD
cd "$work"
"$bin" prep --input $(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese) --separator % \
  --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1
cat >r.yaml <<YAML
name: bench
model: {family: llama, layers: 8, hidden: 1024, heads: 16, seq_len: 32}
data: {tokenizer: byte, train: data/train}
train: {steps: $steps, micro_batch: 1, global_batch: 1, seed: 1, threads: $threads}
optimizer: {lr: 1.0e-4, warmup: 1}
checkpoint: {every: $every, keep: 2}
eval: {every: 0}
log: {every: 1}
YAML
"$bin" run r.yaml --dry-run --set checkpoint.async=true | grep -E '^(parameters|memory per rank)'

run() {  # NAME [--set ...]
  local name=$1
  shift
  "$bin" run r.yaml --set log.dir="$name" "$@" >"$name.out" 2>&1 || { cat "$name.out"; exit 1; }
}
run baseline --set checkpoint.every=0
run sync
run async --set checkpoint.async=true

python3 - "$steps" "$every" <<'PY'
import json, re, sys
steps, every = int(sys.argv[1]), int(sys.argv[2])
dur = r"([\d.]+ ?(?:ms|s|min))"

def seconds(s):
    m = re.fullmatch(r"([\d.]+) ?(ms|s|min)", s)
    v = float(m.group(1))
    return v / 1000 if m.group(2) == "ms" else v * 60 if m.group(2) == "min" else v

def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")

saves = set(range(every, steps, every))  # the periodic saves (the final one is left out)
for name in ("baseline", "sync", "async"):
    log = open(f"{name}/train.log").read()
    t = {r["step"]: r["elapsed_s"] for r in map(json.loads, open(f"{name}/metrics.jsonl")) if "loss" in r}
    # The wall time of step s+1 as the loop saw it: from step s's record to step s+1's, so that
    # the interval after a save step holds the save (or its snapshot) and the next step.
    wall = {s + 1: t[s + 1] - t[s] for s in range(1, steps) if s in t and s + 1 in t}
    with_save = [wall[s + 1] for s in saves if s + 1 in wall]
    after = [wall[s + 2] for s in saves if s + 2 in wall]
    plain = [w for s, w in wall.items() if s - 1 not in saves and s - 2 not in saves]
    line = (f"{name:8s} steps 2..{steps}: {t[steps] - t[1]:6.2f} s | step with a save {mean(with_save):5.2f} s, "
            f"the next {mean(after):5.2f} s, others {mean(plain):5.2f} s")
    if name == "sync":
        line += " | saves: " + ", ".join(f"{seconds(x):.2f}" for x in re.findall(r"step_\d+ written in " + dur + r"\n", log)) + " s"
    if name == "async":
        held = re.findall(r"taken in " + dur, log)
        behind = re.findall(r"written in " + dur + r" behind training .*for the snapshot, " + dur + " for the commit", log)
        line += " | held for the snapshot: " + ", ".join(f"{seconds(x):.2f}" for x in held) + " s"
        line += "; written behind: " + ", ".join(f"{seconds(w):.2f}" for w, _ in behind) + " s"
        line += "; commits: " + ", ".join(f"{seconds(c):.3f}" for _, c in behind) + " s"
    print(line)
PY
