#!/usr/bin/env bash
# `llmtrain prep` as a user meets it: its files equal an independent reference (Hugging Face
# tokenizers + a Megatron-format writer written from the spec) for text, JSONL and .gz input with
# the byte and a BPE tokenizer; the output does not depend on --workers; progress display; and
# every bad input is a clear error that leaves no output behind.
source "$(dirname "$0")/lib.sh"
PY=$SRC/.venv/bin/python
REF="$PY $SRC/tests/e2e/prep_ref.py"
FORTUNES=/usr/share/games/fortunes
[[ -x $PY ]] || { echo "FAIL: $PY missing: run scripts/setup.sh"; exit 1; }
[[ -f $FORTUNES/fortunes ]] || { echo "FAIL: $FORTUNES/fortunes missing: run scripts/setup.sh"; exit 1; }

same_files() {  # same_files NAME PREFIX_A PREFIX_B
  if cmp -s "$2.bin" "$3.bin" && cmp -s "$2.idx" "$3.idx"; then pass "$1: same bytes"
  else fail "$1: $2.{bin,idx} differ from $3.{bin,idx}"; fi
}
no_output() {  # no_output NAME DIR: nothing (not even temporaries) left in DIR
  if [[ -z $(ls -A "$2" 2>/dev/null) ]]; then pass "$1: no output left"
  else fail "$1: left behind: $(ls -A "$2")"; fi
}

# 1. Byte tokenizer, fortune files cut at "%" lines, 10% validation: the reference's bytes.
inputs=("$FORTUNES/fortunes" "$FORTUNES/riddles" "$FORTUNES/linux")
run_cmd byte-fortunes "$LLMTRAIN" prep --input "${inputs[@]}" --separator % --tokenizer byte \
  --output out/fortunes/ --valid-fraction 0.1 --progress none
expect_status 0; expect_out "valid"; expect_out "wrote: out/fortunes/train.bin"
$REF expect ref/fortunes/ "${inputs[@]}" --tokenizer byte --separator % --valid-fraction 0.1
same_files byte-train out/fortunes/train ref/fortunes/train
same_files byte-valid out/fortunes/valid ref/fortunes/valid

# 2. A BPE trained by `tokenizers`; JSONL, gzipped JSONL and plain text give the reference bytes,
#    and 1 or 3 workers give the same files.
$REF train-tokenizer tok.json 800 "$FORTUNES/fortunes" >/dev/null
$PY - "$FORTUNES/fortunes" "$FORTUNES/chinese" <<'PY'
import json, sys
docs = []
for p in sys.argv[1:]:
    try:
        docs += [d for d in open(p, encoding="utf-8").read().split("\n%\n") if d.strip()][:400]
    except FileNotFoundError:
        pass
docs += ["", "emoji 😀🤷🏽‍♀️ and CJK 漢字 and <|endoftext|> inside", "  spaces\t\ttabs\n\n\n", "don't I'M 12345"]
with open("docs.jsonl", "w", encoding="utf-8") as f:
    for i, d in enumerate(docs):
        f.write(json.dumps({"id": i, "text": d}, ensure_ascii=i % 2 == 0) + "\n")
        if i % 50 == 0:
            f.write("\n")  # blank lines are skipped
PY
gzip -k docs.jsonl
for w in 1 3; do
  run_cmd "bpe-jsonl-workers-$w" "$LLMTRAIN" prep -i docs.jsonl -t tok.json -o "out/jsonl$w" -j $w --progress none
  expect_status 0; expect_out "skipped: 1 empty, 0 bad"
done
$REF expect ref/jsonl docs.jsonl --tokenizer tok.json
same_files bpe-jsonl out/jsonl1 ref/jsonl
same_files bpe-workers out/jsonl1 out/jsonl3
run_cmd bpe-jsonl-gz "$LLMTRAIN" prep -i docs.jsonl.gz -t tok.json -o out/jsonlgz --progress none
expect_status 0
same_files bpe-gz out/jsonlgz ref/jsonl
run_cmd bpe-text "$LLMTRAIN" prep -i "$FORTUNES/riddles" -t tok.json -o out/riddles --progress none --no-append-eod
expect_status 0
$REF expect ref/riddles "$FORTUNES/riddles" --tokenizer tok.json --no-append-eod
same_files bpe-text-one-document-per-file out/riddles ref/riddles

# The files read back with numpy per the spec: the documents are the input text + EOD.
$PY "$SRC/tests/trainer/data/indexed_dataset_ref.py" text out/fortunes/train --eod 256 >decoded.txt
grep -qF "$(sed -n 2p "$FORTUNES/riddles")" decoded.txt && pass "numpy reader sees the text" ||
  fail "numpy reader does not see the input text"

# 3. Progress: plain lines off a terminal, a bar when asked.
run_cmd progress-lines "$LLMTRAIN" prep -i "${inputs[@]}" --separator % -t byte -o out/p1 --progress lines \
  --progress-interval 0.000001
expect_status 0; expect_out_re "prep: [0-9]+%  [0-9.]+/[0-9.]+ MiB  [0-9.KM]+ docs  [0-9.KM]+ tokens  [0-9.]+ MB/s"
run_cmd progress-bar "$LLMTRAIN" prep -i "${inputs[@]}" --separator % -t byte -o out/p2 --progress bar -j 1
expect_status 0; expect_out "documents:"

# 4. Bad input: a clear error, exit 2, and nothing written.
mkdir -p bad
printf '{"text": "one"}\n{"text": "two"}\n{"text": broken\n{"body": "no text key"}\n{"text": 5}\n' >bad/bad.jsonl
run_cmd malformed-json "$LLMTRAIN" prep -i bad/bad.jsonl -t byte -o bad/out --progress none
expect_status 2; expect_out "bad/bad.jsonl:3: malformed JSON"; expect_out "--skip-bad"
[[ -z $(ls bad | grep -v '^bad.jsonl$') ]] && pass "malformed-json: no output files" || fail "malformed-json left $(ls bad)"

run_cmd skip-bad "$LLMTRAIN" prep -i bad/bad.jsonl -t byte -o skip/out --skip-bad --progress none
expect_status 0; expect_out "skipped: 0 empty, 3 bad"
expect_out 'bad/bad.jsonl:4: no key "text" (the object has "body")'
expect_out 'bad/bad.jsonl:5: key "text" holds a number, expected a string'

run_cmd missing-key "$LLMTRAIN" prep -i docs.jsonl --jsonl-key body -t byte -o mk/out --progress none
expect_status 2; expect_out 'docs.jsonl:1: no key "body" (the object has "id", "text")'
no_output missing-key mk

run_cmd missing-file "$LLMTRAIN" prep -i nowhere.txt -t byte -o nf/out
expect_status 2; expect_out "cannot read input nowhere.txt: No such file or directory"
no_output missing-file nf

: >empty.txt
run_cmd empty-input "$LLMTRAIN" prep -i empty.txt -t byte -o em/out --progress none
expect_status 2; expect_out "no documents in the input (1 file"
no_output empty-input em

printf 'caf\xe9 latin-1, not UTF-8\n' >latin1.txt
run_cmd invalid-utf8-bpe "$LLMTRAIN" prep -i latin1.txt -t tok.json -o iu/out --progress none
expect_status 2; expect_out "latin1.txt: invalid UTF-8 at byte 3 (0xe9)"
no_output invalid-utf8 iu
run_cmd invalid-utf8-byte "$LLMTRAIN" prep -i latin1.txt -t byte -o iu/out --progress none
expect_status 0

head -c 3000 docs.jsonl.gz >truncated.jsonl.gz
run_cmd truncated-gz "$LLMTRAIN" prep -i truncated.jsonl.gz -t byte -o tg/out --progress none
expect_status 2; expect_out "truncated.jsonl.gz"
no_output truncated-gz tg

echo "not a directory" >blocker
run_cmd unwritable-output "$LLMTRAIN" prep -i latin1.txt -t byte -o blocker/sub/out
expect_status 2; expect_out "cannot create output directory blocker/sub"

$PY -c 'import json,sys; j=json.load(open("tok.json")); t=j["added_tokens"][0]; v=j["model"]["vocab"]
v["<|pad|>"]=v.pop(t["content"]); t["content"]="<|pad|>"; json.dump(j,open("noeod.json","w"))'
run_cmd no-eod-token "$LLMTRAIN" prep -i latin1.txt -t noeod.json -o ne/out
expect_status 2; expect_out "tokenizer noeod.json has no end-of-document token to append"; expect_out "--no-append-eod"
no_output no-eod-token ne

head -c 1500000 /dev/zero | tr '\0' 'x' >big.txt
run_cmd too-large "$LLMTRAIN" prep -i big.txt -t byte -o tl/out --max-doc-mib 1 --progress none
expect_status 2; expect_out "big.txt: document larger than --max-doc-mib 1 MiB"
no_output too-large tl

run_cmd tiny-valid "$LLMTRAIN" prep -i latin1.txt -t byte -o tv/out --valid-fraction 0.5 --progress none
expect_status 2; expect_out "gave no validation document: 1 documents × 0.5 < 1"
no_output tiny-valid tv

# 5. Interrupted (SIGINT) while reading: exit 130, nothing written. The input is a FIFO this script
#    holds open, so prep is certainly still running when the signal comes.
mkdir -p intr && mkfifo intr/in.txt
"$LLMTRAIN" prep -i intr/in.txt -t byte -o intr/out --progress none >intr.log 2>&1 &
pid=$!
exec 3>intr/in.txt  # returns once prep has opened the FIFO (its signal handlers are installed by then)
echo "some text" >&3
kill -INT $pid
sleep 0.3
exec 3>&-
wait $pid; status=$?; out=$(cat intr.log); last_name=interrupted
expect_status 130; expect_out "interrupted; nothing was written"
[[ $(ls intr) == in.txt ]] && pass "interrupted: no output left" || fail "interrupted: left $(ls intr)"

run_cmd help "$LLMTRAIN" prep --help
expect_status 0; expect_out "Examples:"; expect_out "--separator"

finish
