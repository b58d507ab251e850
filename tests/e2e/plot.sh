#!/usr/bin/env bash
# `llmtrain plot` as a user meets it: two synthetic runs drawn to a PNG and an SVG, each checked
# by tests/e2e/plot_check.py with Python's standard library (zlib/struct for the PNG, xml.etree
# for the SVG), not by cairo; the default output, stacked panels; and every refusal (exit 2, the
# file and line named, nothing written).
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
CHECK=$SRC/tests/e2e/plot_check.py

# Two runs as the trainer writes them (docs/metrics.md): step records every 10 steps, evaluations
# every 100. "base" falls from 7.5 towards 1.5 over 1000 steps, "wide" over its 600.
"$PY" - <<'PY'
import json, math, os
for name, steps, scale in (("base", 1000, 300.0), ("wide", 600, 150.0)):
    os.makedirs(f"runs/{name}", exist_ok=True)
    with open(f"runs/{name}/metrics.jsonl", "w") as f:
        for step in range(10, steps + 1, 10):
            loss = 6 * math.exp(-step / scale) + 1.5
            f.write(json.dumps({"step": step, "loss": loss, "lr": 1e-3 * min(1, step / 100),
                                "grad_norm": 1 / (1 + step / 200), "tokens_per_s": 17000.0 + step,
                                "mfu": 0.5, "elapsed_s": step / 10, "tokens": step * 2048,
                                "skipped_steps": 0}) + "\n")
            if step % 100 == 0:
                f.write(json.dumps({"step": step, "val_loss": loss + 0.1, "val_ppl": math.exp(loss + 0.1),
                                    "tokens": step * 2048}) + "\n")
PY

run_cmd help "$LLMTRAIN" plot --help
expect_status 0; expect_out "Examples:"; expect_out "--metric"

run_cmd png "$LLMTRAIN" plot runs/base runs/wide -o both.png
expect_status 0; expect_out "plot: wrote both.png (1000×600 px, 2 runs: loss, val_loss)"
run_cmd png-check "$PY" "$CHECK" png both.png 1000 600 '#1f77b4' '#ff7f0e'
expect_status 0

run_cmd svg "$LLMTRAIN" plot runs/base runs/wide -o both.svg --title "lr sweep"
expect_status 0
run_cmd svg-check "$PY" "$CHECK" svg both.svg "lr sweep" base wide
expect_status 0

# The default output is <first run>/loss.png; a metrics.jsonl path works as the run; a second
# plot replaces the file and leaves no temporary beside it.
run_cmd default "$LLMTRAIN" plot runs/base runs/wide/metrics.jsonl
expect_status 0; expect_out "wrote runs/base/loss.png"
run_cmd default-again "$LLMTRAIN" plot runs/base
expect_status 0
run_cmd default-check "$PY" "$CHECK" png runs/base/loss.png 1000 600 '#1f77b4'
expect_status 0
leftovers=$(ls runs/base | grep -v -x -e metrics.jsonl -e loss.png)
[[ -z $leftovers ]] && pass "no temporary files left" || fail "left in runs/base: $leftovers"

# Several metrics: loss with val_loss, then lr, then grad_norm, stacked (3 panels of 600 px).
run_cmd panels "$LLMTRAIN" plot runs/base/ --metric loss,val_loss,lr --metric grad_norm --log-y -o panels.png
expect_status 0; expect_out "(1000×1800 px, 1 run: loss, val_loss, lr, grad_norm)"
run_cmd panels-check "$PY" "$CHECK" png panels.png 1000 1800 '#1f77b4'
expect_status 0

# Refusals: exit 2, a message naming what and where, no image written.
mkdir -p runs/empty runs/bad runs/array runs/nan runs/text
printf '{"step":1,"loss":2.5}\nnot json\n{"step":3,"loss":2.0}\n' >runs/bad/metrics.jsonl
printf '[1, 2]\n' >runs/array/metrics.jsonl
printf '{"step":1,"loss":null}\n{"step":2,"loss":null}\n' >runs/nan/metrics.jsonl
printf '{"step":1,"loss":"low"}\n' >runs/text/metrics.jsonl

run_cmd no-metrics "$LLMTRAIN" plot runs/empty -o out.png
expect_status 2; expect_out "runs/empty: no metrics.jsonl in this directory"
run_cmd no-run "$LLMTRAIN" plot runs/nowhere -o out.png
expect_status 2; expect_out "runs/nowhere: no such run directory or file"
run_cmd unknown-metric "$LLMTRAIN" plot runs/base runs/wide --metric los -o out.png
expect_status 2; expect_out "no run has the metric \"los\""; expect_out "did you mean loss?"
run_cmd extension "$LLMTRAIN" plot runs/base -o out.jpg
expect_status 2; expect_out "out.jpg: unknown image type \".jpg\""; expect_out "end the output file name in .png or .svg"
run_cmd no-dir "$LLMTRAIN" plot runs/base -o nowhere/out.png
expect_status 2; expect_out "the directory nowhere does not exist"
run_cmd bad-line "$LLMTRAIN" plot runs/base runs/bad -o out.png
expect_status 2; expect_out "runs/bad/metrics.jsonl:2: not JSON: not json"
run_cmd not-object "$LLMTRAIN" plot runs/array -o out.png
expect_status 2; expect_out "runs/array/metrics.jsonl:1: an array where a record (a JSON object) belongs"
run_cmd not-number "$LLMTRAIN" plot runs/text -o out.png
expect_status 2; expect_out "runs/text/metrics.jsonl:1: \"loss\" is a string, not a number"
run_cmd no-points "$LLMTRAIN" plot runs/nan --metric loss -o out.png
expect_status 2; expect_out "no data points: no finite value of loss in runs/nan/metrics.jsonl"
run_cmd log-zero "$LLMTRAIN" plot runs/base --metric skipped_steps --log-y -o out.png
expect_status 2; expect_out "--log-y: skipped_steps of base is 0 at step 10"
run_cmd no-runs "$LLMTRAIN" plot
expect_status 2
[[ ! -e out.png && ! -e out.jpg ]] && pass "refusals wrote no image" || fail "a refused plot wrote an image"

# A run without validation data (data.valid: null) has no val_loss: the default plot draws its
# loss alone and says so; asked for by name, val_loss is an error.
mkdir -p runs/noeval
grep -v val_loss runs/base/metrics.jsonl >runs/noeval/metrics.jsonl
run_cmd noeval "$LLMTRAIN" plot runs/noeval
expect_status 0; expect_out "warning: no run has val_loss: left out"; expect_out "(1000×600 px, 1 run: loss)"
run_cmd noeval-asked "$LLMTRAIN" plot runs/noeval --metric val_loss -o out.png
expect_status 2; expect_out "no run has the metric \"val_loss\""

# A run still writing: its unterminated last line is left out, and said so.
mkdir -p runs/live
head -c -20 runs/base/metrics.jsonl >runs/live/metrics.jsonl
run_cmd live "$LLMTRAIN" plot runs/live -o live.png
expect_status 0; expect_out "the last line is incomplete (a run killed or still writing); left out"

finish
