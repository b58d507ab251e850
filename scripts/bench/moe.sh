#!/usr/bin/env bash
# Mixture of experts against dense at equal active FLOPs per token: recipes/moe-tiny.yaml (8 experts
# of width 256, top 2, in every layer) against recipes/tiny.yaml (a dense MLP of width 512), both on
# Debian's fortunes for the same steps and tokens, one after the other in this invocation. Prints,
# per run, the parameters (total and active), the FLOPs per token, the final validation loss, the
# training tokens/s over the run and the MoE run's load balance at the end; then the ratios.
#
#   scripts/bench/moe.sh [STEPS]      default 500 (the recipes' own); build in ${LLMTRAIN_BUILD_DIR:-build}
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-500}
build=${LLMTRAIN_BUILD_DIR:-build}
bin=$(realpath "$build/llmtrain")
[[ -x $bin ]] || { echo "build first: cmake --build $build --target llmtrain" >&2; exit 1; }
py=$PWD/.venv/bin/python
src=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-moe-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load: $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$work"
mkdir -p data/fortunes
"$bin" prep --input $(ls /usr/share/games/fortunes/* | grep -E '/[a-z-]+$' | grep -v chinese) --separator % \
  --tokenizer byte --output data/fortunes/ --valid-fraction 0.05 >/dev/null 2>&1
for r in tiny moe-tiny; do
  "$bin" run "$src/recipes/$r.yaml" --dry-run --set train.steps=$steps | grep -E '^(parameters|moe|training FLOPs)' |
    sed "s/^/$r: /"
  SECONDS=0
  "$bin" run "$src/recipes/$r.yaml" --set train.steps=$steps --set log.dir=$r --set checkpoint.every=0 \
    --set eval.every=$steps >$r.log 2>&1 || { tail -20 $r.log; exit 1; }
  echo "$r: $steps steps in ${SECONDS} s"
done
"$py" - tiny moe-tiny <<'PY'
import json, sys
def recs(run):
    return [json.loads(l) for l in open(run + "/metrics.jsonl")]
out = {}
for run in sys.argv[1:]:
    r = recs(run)
    steps = [x for x in r if "loss" in x]
    val = [x["val_loss"] for x in r if "val_loss" in x][-1]
    # tokens/s over the run: the mean of the logged intervals' rates, weighted by their steps
    rates = [x["tokens_per_s"] for x in steps]
    out[run] = (val, sum(rates) / len(rates), steps[-1])
    print(f"{run}: validation loss {val:.4f} after {steps[-1]['tokens']} tokens; {out[run][1]:.0f} tokens/s (mean of the "
          f"{len(rates)} logged intervals)")
last = out["moe-tiny"][2]
for l in range(4):
    p = f"moe_l{l}_"
    if p + "tokens_cv" in last:
        print(f"moe-tiny layer {l} at the last step: picks per expert {last[p + 'tokens_min']:.0f}..{last[p + 'tokens_max']:.0f}, "
              f"coefficient of variation {last[p + 'tokens_cv']:.3f}, aux loss {last[p + 'aux_loss']:.5f}")
print(f"moe-tiny / tiny: validation loss {out['moe-tiny'][0] / out['tiny'][0]:.3f}, tokens/s {out['moe-tiny'][1] / out['tiny'][1]:.3f}")
PY
