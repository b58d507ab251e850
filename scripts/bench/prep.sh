#!/usr/bin/env bash
# Throughput of `llmtrain prep` against Hugging Face `tokenizers` (Rust, encode_batch) on the same
# documents with the same number of threads, as a ratio (target >= 1.0). Measured in one run, so
# machine load affects both sides alike; run it on a quiet machine for figures to record.
#
#   scripts/bench/prep.sh [--mb 32] [--threads 2] [--vocab 8192] [--repeat 3] [--build build]
#                         [--styles "gpt2-style llama3-style llama2-style mistral-style"]
#
# Corpus: JSONL of real text shipped by Debian packages (English, Chinese and Russian fortunes),
# repeated in shuffled order up to --mb MB of document text. Tokenizers: a byte-level BPE trained by
# `tokenizers` on that text, in GPT-2's layout (ByteLevel regex) and in LLaMA-3's (Split regex +
# ignore_merges); and a SentencePiece-style BPE (byte_fallback with the 256 <0xNN> tokens, an
# alphabet of the 1000 commonest characters, the rest falling back to bytes) in LLaMA-2's layout
# (Prepend + Replace normalizer, no pre-tokenizer) and Mistral's (Metaspace, prepend_scheme first):
# both make each document one word. Ours is the whole command (read, parse JSON, tokenize, write
# .bin/.idx); theirs is encode_batch alone on texts already in memory (their file reading and JSON
# parsing not counted).
# MB/s counts document text bytes (UTF-8) for both. Best of --repeat runs each.
set -euo pipefail
cd "$(dirname "$0")/../.."
mb=32 threads=2 vocab=8192 repeat=3 build=build styles="gpt2-style llama3-style llama2-style mistral-style"
while (($#)); do
  case $1 in
    --mb) mb=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --styles) styles=$2; shift 2 ;;
    *) echo "usage: $0 [--mb N] [--threads N] [--vocab N] [--repeat N] [--build DIR] [--styles LIST]"; exit 2 ;;
  esac
done
llmtrain=$build/llmtrain
py=.venv/bin/python
[[ -x $llmtrain ]] || { echo "bench: $llmtrain not built (cmake --build $build)"; exit 1; }
[[ -x $py ]] || { echo "bench: $py missing: run scripts/setup.sh"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-bench-prep.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "bench prep: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load:$(uptime | sed 's/.*load average://')"
"$py" - "$work" "$mb" "$vocab" <<'PY'
import glob, json, os, random, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
work, mb, vocab = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
F = "/usr/share/games/fortunes"
def records(p):
    try:
        return [r for r in open(p, encoding="utf-8").read().split("\n%\n") if r.strip()]
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return []
files = [p for p in glob.glob(F + "/*") + glob.glob(F + "/ru/*") if "." not in os.path.basename(p)]
docs = [d for p in sorted(files) for d in records(p)]
unique = sum(len(d.encode()) for d in docs)
rng = random.Random(1)
out, total = [], 0
while total < mb * 1e6:
    rng.shuffle(docs)
    for d in docs:
        out.append(d)
        total += len(d.encode())
        if total >= mb * 1e6:
            break
with open(os.path.join(work, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for d in out:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
with open(os.path.join(work, "stats"), "w") as f:
    f.write(f"{total} {len(out)} {unique}\n")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(os.path.join(work, "gpt2-style.json"))
j = json.load(open(os.path.join(work, "gpt2-style.json"), encoding="utf-8"))
j["model"]["ignore_merges"] = True
j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {"Regex":
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
json.dump(j, open(os.path.join(work, "llama3-style.json"), "w", encoding="utf-8"), ensure_ascii=False)
sys.path.insert(0, "tests/trainer/data")
import sentencepiece_style as sps
sp = sps.train(docs, vocab, limit_alphabet=1000)
for style, layout in (("mistral-style", sps.mistral), ("llama2-style", sps.legacy)):
    json.dump(layout(sp), open(os.path.join(work, style + ".json"), "w", encoding="utf-8"), ensure_ascii=False)
PY
read -r text_bytes ndocs unique <"$work/stats"
echo "corpus: $(awk "BEGIN{printf \"%.1f\", $text_bytes/1e6}") MB of document text, $ndocs documents" \
  "(from $(awk "BEGIN{printf \"%.1f\", $unique/1e6}") MB of distinct fortunes), JSONL; threads: $threads"

best_of() {  # best_of N CMD...: the smallest wall time in seconds
  local best=""
  for ((i = 0; i < $1; i++)); do
    local t0 t1
    t0=$(date +%s.%N)
    "${@:2}" >/dev/null
    t1=$(date +%s.%N)
    best=$(awk -v a="$best" -v b="$(awk -v x="$t1" -v y="$t0" 'BEGIN{print x - y}')" 'BEGIN{print (a == "" || b < a) ? b : a}')
  done
  echo "$best"
}

for style in $styles; do
  ours=$(best_of "$repeat" "$llmtrain" prep --input "$work/corpus.jsonl" --tokenizer "$work/$style.json" \
    --output "$work/out" --workers "$threads" --progress none)
  theirs=$(RAYON_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=true "$py" - "$work" "$style" "$repeat" <<'PY'
import json, os, sys, time
from tokenizers import Tokenizer
work, style, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = Tokenizer.from_file(os.path.join(work, style + ".json"))
texts = [json.loads(l)["text"] for l in open(os.path.join(work, "corpus.jsonl"), encoding="utf-8")]
best = None
for _ in range(repeat):
    t0 = time.perf_counter()
    for i in range(0, len(texts), 1000):
        tok.encode_batch(texts[i:i + 1000], add_special_tokens=False)
    t = time.perf_counter() - t0
    best = t if best is None else min(best, t)
print(best)
PY
)
  awk -v s="$style" -v o="$ours" -v t="$theirs" -v b="$text_bytes" 'BEGIN{
    printf "%-13s llmtrain prep %6.2f s %7.1f MB/s | HF tokenizers encode_batch %6.2f s %7.1f MB/s | ratio %.2f\n",
      s, o, b/1e6/o, t, b/1e6/t, t/o }'
done
echo "load after: $(uptime | sed 's/.*load average://')"
