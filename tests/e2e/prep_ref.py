#!/usr/bin/env python3
"""What `llmtrain prep` must write, computed independently: documents cut as docs/data.md says,
tokenized by Hugging Face `tokenizers` (or as bytes), end-of-document appended, split between
train and valid by the documented rule, and written by the reference indexed-dataset writer
(tests/trainer/data/indexed_dataset_ref.py). tests/e2e/prep.sh compares prep's files with these.

    prep_ref.py train-tokenizer OUT.json VOCAB FILE...
    prep_ref.py expect OUTPUT --tokenizer byte|JSON [--separator LINE] [--jsonl-key K]
                [--valid-fraction F] [--no-append-eod] FILE...
"""
import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trainer", "data"))
import indexed_dataset_ref  # noqa: E402


def open_any(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def documents(path, separator, jsonl, key):
    with open_any(path) as f:
        data = f.read()
    if jsonl:
        for line in data.split(b"\n"):
            if line.strip():
                yield json.loads(line)[key].encode("utf-8")
        return
    if separator is None:
        yield data
        return
    doc = []
    for line in data.splitlines(keepends=True):
        body = line[:-1] if line.endswith(b"\n") else line
        body = body[:-1] if body.endswith(b"\r") else body
        if body == separator.encode():
            if doc:
                yield b"".join(doc)
            doc = []
        else:
            doc.append(line)
    if doc:
        yield b"".join(doc)


def main():
    if sys.argv[1] == "train-tokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        out, vocab, files = sys.argv[2], int(sys.argv[3]), sys.argv[4:]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train(files, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False))
        tok.save(out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("output")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--separator")
    ap.add_argument("--jsonl-key", default="text")
    ap.add_argument("--valid-fraction", type=float, default=0.0)
    ap.add_argument("--no-append-eod", action="store_true")
    a = ap.parse_args()
    if a.tokenizer == "byte":
        encode, eod, vocab = (lambda b: list(b)), 256, 257
    else:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(a.tokenizer)
        encode = lambda b: tok.encode(b.decode("utf-8"), add_special_tokens=False).ids  # noqa: E731
        eod, vocab = tok.token_to_id("<|endoftext|>"), tok.get_vocab_size()
    dtype = "uint16" if vocab < 65500 else "int32"
    train, valid = [], []
    i = 0
    for path in a.files:
        jsonl = any(path.removesuffix(".gz").endswith(e) for e in (".jsonl", ".json", ".ndjson"))
        for doc in documents(path, a.separator, jsonl, a.jsonl_key):
            if not doc:
                continue
            ids = encode(doc) + ([] if a.no_append_eod else [eod])
            f = a.valid_fraction
            to_valid = f > 0 and int((i + 1) * f) > int(i * f)
            (valid if to_valid else train).append([ids])
            i += 1
    out = a.output
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    if a.valid_fraction > 0:
        tp, vp = (out + "train", out + "valid") if out.endswith("/") else (out + "-train", out + "-valid")
        indexed_dataset_ref.write(tp, dtype, train)
        indexed_dataset_ref.write(vp, dtype, valid)
    else:
        indexed_dataset_ref.write(out + "train" if out.endswith("/") else out, dtype, train)


if __name__ == "__main__":
    main()
