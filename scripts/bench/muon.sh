#!/usr/bin/env bash
# Muon against AdamW on the demo's run (recipes/tiny.yaml: Debian's fortunes, byte tokens), in one
# invocation: a small learning-rate sweep of each (AdamW's lr; Muon's lr with the AdamW part at
# AdamW's recipe lr), the validation loss after the same steps and tokens, the median step time and
# its optimizer phase; the best of each and their ratio.
#
#   scripts/bench/muon.sh [STEPS]    (default 500, the demo's; build/llmtrain must exist)
#   ADAMW_LRS="1e-3 3e-3 1e-2" MUON_LRS="0.01 0.02 0.05" scripts/bench/muon.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${1:-500}
adamw_lrs=${ADAMW_LRS:-1e-3 3e-3 1e-2}
muon_lrs=${MUON_LRS:-0.01 0.02 0.05}
llmtrain=$root/${LLMTRAIN_BUILD_DIR:-build}/llmtrain
[[ -x $llmtrain ]] || { echo "build llmtrain first (cmake --build build)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mapfile -t corpus < <(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese)
"$llmtrain" prep --input "${corpus[@]}" --separator % --tokenizer byte --output data/ --valid-fraction 0.05 >/dev/null 2>&1
common=(--set data.train=data/train --set data.valid=data/valid --set train.steps="$steps" --set eval.every="$steps"
        --set checkpoint.every=0 --set checkpoint.resume=none --set log.every=1)
echo "# $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
runs=()
for lr in $adamw_lrs; do runs+=("adamw-$lr"); done
for lr in $muon_lrs; do runs+=("muon-$lr"); done
for name in "${runs[@]}"; do
  IFS=- read -r opt lr <<<"$name"
  extra=(--set optimizer.lr="$lr")
  [[ $opt == muon ]] && extra+=(--set optimizer.name=muon --set optimizer.muon.adamw_lr=3e-3)
  "$llmtrain" run "$root/recipes/tiny.yaml" "${common[@]}" "${extra[@]}" --set log.dir="$name" >"$name.log" 2>&1 ||
    { echo "$name failed:"; tail -5 "$name.log"; exit 1; }
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$steps" "${runs[@]}" <<'PY'
import json, re, statistics, sys
rows = {}
for name in sys.argv[2:]:
    recs = [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
    steps = [r for r in recs if "loss" in r]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps, steps[1:])]
    opt = re.findall(r"opt ([0-9.]+)", open(f"{name}.log", errors="replace").read())
    rows[name] = dict(val=[r["val_loss"] for r in recs if "val_loss" in r][-1], step=statistics.median(times),
                      opt=statistics.median(map(float, opt)) if opt else float("nan"),
                      tokens=steps[-1].get("tokens", 0))
print(f"\n{sys.argv[1]} steps of recipes/tiny.yaml (the same tokens in every run)")
print("| optimizer | lr | validation loss | step s | optimizer ms |")
print("| --- | --- | --- | --- | --- |")
for name, r in rows.items():
    opt, lr = name.split("-", 1)
    print(f"| {opt} | {lr} | {r['val']:.4f} | {r['step']:.4f} | {r['opt']:.1f} |")
best = {o: min((r["val"], n) for n, r in rows.items() if n.startswith(o + "-")) for o in ("adamw", "muon")}
(a, an), (m, mn) = best["adamw"], best["muon"]
print(f"\nbest: AdamW {an} {a:.4f}, Muon {mn} {m:.4f}: Muon/AdamW validation loss {m / a:.4f}, "
      f"step time {rows[mn]['step'] / rows[an]['step']:.2f}")
PY
