# shellcheck shell=bash
# Part 5 of scripts/gpu_check.sh (sourced there: uses its L, work, py, simulator, report, status and
# bounded, which runs a command within the part's time limit): parallel.offload on the device
# (docs/offload.md).
#
#   - tiny in bf16, OFFLOAD_STEPS (default 10; 3 on the simulator) steps in memory, with `host`
#     (AdamW on the CPU over page-locked state, gradients copied down during backward) and with
#     `nvme` (a file; each unit updated on the device), and without clipping in memory and with
#     `host` (the CPU then updates each unit beside backward, as its gradients arrive): the worst relative loss difference and the
#     final parameters' ||a-b||/||b|| against the in-memory run. The simulator is bitwise; on a GPU
#     the CPU's AdamW and the device's may differ in the last bit (fused multiply-adds), so the
#     figures are reported, and a check fails above 1e-3.
#   - On a GPU: a Llama model (hidden 4096, ffn 11008, 32 heads, seq 2048, micro-batch 1, full
#     recomputation, bf16) with as many layers as make its model states (16 bytes per parameter)
#     about 1.2 × the GPU's memory, when its page-locked host state (16 bytes per parameter) fits
#     in 80% of the host's memory: its dry run without offload (does not fit), then 3 steps with
#     `host`: the memory line and the median step time. Skipped, said so, where the host is smaller.
offload_steps=${OFFLOAD_STEPS:-$((simulator ? 3 : 10))}
offload_common=(--set train.device=cuda --set train.precision=bf16 --set model.seq_len=64 --set train.micro_batch=1
  --set train.global_batch=2 --set train.steps="$offload_steps" --set optimizer.warmup=2
  --set data.train="$work/data/train" --set data.valid="$work/data/valid" --set eval.every=0 --set log.every=1
  --set checkpoint.resume=none)
for kind in none host nvme none-noclip host-noclip; do
  extra=(--set parallel.offload=${kind%-noclip})
  [[ $kind == nvme ]] && extra+=(--set parallel.offload_path="$work/offload-scratch")
  [[ $kind == *-noclip ]] && extra+=(--set train.grad_clip=0)  # host: updated beside backward
  if ! bounded "$L" run recipes/tiny.yaml "${offload_common[@]}" "${extra[@]}" --set log.dir="$work/offload-$kind" \
    >"$work/offload-$kind.log" 2>&1; then
    report "offload $kind: the run failed ($work/offload-$kind.log)"
    status=1
  fi
done
for kind in host nvme host-noclip; do
  ref=none
  [[ $kind == *-noclip ]] && ref=none-noclip
  if out=$("$py" tests/e2e/compare_runs.py "$work/offload-$kind" "$work/offload-$ref" --last "$offload_steps" \
    --tol 1e-3 2>&1); then
    report "offload $kind on cuda against in memory, $offload_steps bf16 steps: $out" \
      "$(grep -o 'the last update found .*' "$work/offload-$kind.log")"
  else
    report "offload $kind on cuda against in memory: FAILED: $out"
    status=1
  fi
done
if ((simulator == 0)); then
  gpu_bytes=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) * 1048576))
  host_bytes=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) * 1024))
  per_layer=$((12 * 4096 * 4096))  # 4096² × (4 + 3 · 11008/4096) ≈ 12 · 4096² parameters a layer
  layers=$((gpu_bytes * 12 / 10 / 16 / per_layer))
  params=$((layers * per_layer))
  if ((params * 16 > host_bytes * 8 / 10)); then
    report "offload host, a model too big for the GPU: skipped: $layers layers (~$((params / 1000000000))B parameters)" \
      "need ~$((params * 16 / 1073741824)) GiB of page-locked host memory, this host has $((host_bytes / 1073741824)) GiB"
  else
    big=(--set model.family=llama --set model.layers="$layers" --set model.hidden=4096 --set model.heads=32
      --set model.kv_heads=32 --set model.ffn_hidden=11008 --set model.vocab=32000 --set model.seq_len=2048
      --set model.max_positions=2048 --set train.micro_batch=1 --set train.global_batch=1 --set train.steps=3
      --set train.activation_checkpointing=full --set train.device=cuda --set train.precision=bf16
      --set data.train="$work/data/train" --set data.valid="$work/data/valid" --set eval.every=0 --set log.every=1
      --set checkpoint.every=0 --set checkpoint.resume=none --set optimizer.warmup=1)
    report "offload host, $layers layers (~$((params / 1000000000))B parameters), in memory:" \
      "$(bounded "$L" run recipes/tiny.yaml "${big[@]}" --dry-run --gpu "${catalog:-h100}" 2>&1 | grep -m1 'predicted memory per rank')"
    if bounded timeout 900 "$L" run recipes/tiny.yaml "${big[@]}" --set parallel.offload=host --set log.dir="$work/offload-big" \
      >"$work/offload-big.log" 2>&1; then
      report "offload host, the same with host: $(grep -m1 -o 'memory per rank: .*' "$work/offload-big.log");" \
        "median step $("$py" -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"elapsed_s\"' in l]; t=[b['elapsed_s']-a['elapsed_s'] for a,b in zip(r,r[1:])]; print(f'{statistics.median(t):.2f} s')" \
          "$work/offload-big/metrics.jsonl" 2>/dev/null || echo '?');" \
        "$(grep -o 'the last update found .*' "$work/offload-big.log")"
    else
      report "offload host, a model too big for the GPU: the run failed ($work/offload-big.log)"
      status=1
    fi
  fi
fi
