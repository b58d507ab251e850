#!/usr/bin/env python3
"""Reference ids from Hugging Face `tokenizers` for tests/trainer/data/test_tokenizer_parity.cpp.

Trains a byte-level BPE and a SentencePiece-style (LLaMA-2) BPE on real text that Debian packages
ship (English, Chinese and Russian fortunes), writes them in the layouts llmtrain loads, builds
>= 1 MB of varied test documents and writes the ids `tokenizers` gives each document with each
layout (and, for the SentencePiece-style ones, the text `decode` gives back).

    tokenizer_parity.py OUTDIR [--vocab 4000] [--min-bytes 1100000]

OUTDIR receives:
  bpe.json          trained tokenizer.json (merges as pairs, as tokenizers >= 0.20 writes them),
                    with special and added tokens (lstrip / rstrip / single_word / normalized)
  bpe_legacy.json   the same with merges as "a b" strings (older tokenizer.json files)
  gpt2/vocab.json, gpt2/merges.txt   GPT-2's two-file layout of the same model
  llama3.json       the same merges behind LLaMA-3's Split regex + ByteLevel(use_regex=false),
                    ignore_merges, 256 special tokens and a BOS post-processor
  gpt4o.json        the same merges behind GPT-4o's (o200k) Split regex
  prefix.json       ByteLevel with add_prefix_space=true
  sp_legacy.json    SentencePiece-style BPE as LLaMA-2's tokenizer.json has it: byte_fallback with the
                    256 <0xNN> tokens, fuse_unk, normalizer Prepend("▁") + Replace(" ", "▁"), no
                    pre-tokenizer, decoder Replace + ByteFallback + Fuse + Strip; <unk> <s> </s>
                    and the added tokens of bpe.json (normalized ones match normalized text)
  sp_first.json     the same model as transformers writes it without legacy (Mistral, Mixtral):
                    Metaspace(prepend_scheme first, split false), no normalizer
  sp_split.json     Metaspace(always, split true), decoder ByteFallback + Metaspace
  sp_never.json     Metaspace(never, split true), decoder Metaspace alone
  sp_unk.json       no byte_fallback, no fuse_unk: characters the vocabulary lacks are <unk>
  texts.bin         the documents: u32 count, then per document u32 length + bytes
  NAME.ids          per document: u32 count + i32 ids (add_special_tokens=False)
  NAME.text         SentencePiece-style layouts: per document u32 length + the UTF-8 of
                    decode(ids, skip_special_tokens=False)
"""
import argparse
import glob
import json
import os
import random
import struct
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import sentencepiece_style as sps

FORTUNES = "/usr/share/games/fortunes"
EMOJI = "/usr/share/unicode/emoji/emoji-test.txt"
GPT4O_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
                 r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def need(path):
    if not os.path.exists(path):
        sys.exit(f"tokenizer_parity.py: {path} is missing: run scripts/setup.sh (fortunes, fortunes-zh, "
                 f"fortunes-ru, unicode-data)")
    return path


def fortune_records(path):
    with open(path, encoding="utf-8", errors="strict") as f:
        return [r.strip("\n") + "\n" for r in f.read().split("\n%\n") if r.strip()]


def english_files():
    out = []
    for p in sorted(glob.glob(os.path.join(FORTUNES, "*"))):
        name = os.path.basename(p)
        if os.path.isfile(p) and not os.path.islink(p) and "." not in name and name not in ("chinese", "song100"):
            out.append(p)
    return out


def corpus():
    en = [r for p in english_files() for r in fortune_records(p)]
    zh = fortune_records(need(os.path.join(FORTUNES, "chinese")))
    ru = [r for p in sorted(glob.glob(os.path.join(need(os.path.join(FORTUNES, "ru")), "*")))
          if "." not in os.path.basename(p) for r in fortune_records(p)]
    with open(need(EMOJI), encoding="utf-8") as f:
        emoji = [line for line in f if line.strip() and not line.startswith("#")]
    return en, zh, ru, emoji


def synthetic(rng):
    """Short stretches that stress the pre-tokenizer: numbers, whitespace runs, contractions,
    scripts not in the corpus (blocks assigned long before Unicode 14, so PCRE2's and
    Oniguruma's tables agree), special and added tokens, control characters."""
    spaces = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\x85", "\u2003", "\x0b", "\x0c",
              " \n ", "\t\t \n"]
    words = ["don't", "I'M", "you'RE", "it's", "it’s", "we'll", "they'd", "I've", "'s", "'t", "O'Neil", "rock'n'roll",
             "3.14159", "1,234,567", "0x1F", "2024-01-31", "12:30", "١٢٣", "٤٥", "①②", "ⅣⅫ", "½", "x²", "10⁻³",
             "naïve", "e\u0301", "ﬁ", "Ǆ", "ß", "İstanbul", "σς", "<|endoftext|>", "<sep>", "[MASK]", "<|eot|>",
             "word<sep>word", "a[MASK]b", "\x00", "\x1b[31m", "\x7f", "\ufeff", "\u200b", "\u200d", "🇫🇷", "👩‍👩‍👧",
             "🤷🏽‍♀️", "…", "——", "«»", "http://example.org/a_b?c=d&e=f", "snake_case_name", "CamelCaseName",
             "$", "$$$", "!!!", "?!", "...", "\\", "\"quoted\"", "(paren)", "[[bracket]]", "{\"json\": 1}",
             "</s>", "<s>text", "<unk>", "▁", "▁▁x", " ▁ ", "<0x41>", "\u2581word"]
    blocks = [(0x3041, 0x3096), (0x30A1, 0x30FA), (0xAC00, 0xD7A3), (0x0621, 0x064A), (0x0905, 0x0939),
              (0x05D0, 0x05EA), (0x0E01, 0x0E30), (0x0391, 0x03A9), (0x4E00, 0x9FA5)]
    parts = []
    for _ in range(rng.randint(5, 60)):
        k = rng.random()
        if k < 0.3:
            parts.append(rng.choice(words))
        elif k < 0.5:
            parts.append(rng.choice(spaces) * rng.randint(1, 4))
        elif k < 0.65:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        elif k < 0.85:
            lo, hi = rng.choice(blocks)
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12))))
        else:
            parts.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ") for _ in range(rng.randint(1, 9))))
        if rng.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


def documents(en, zh, ru, emoji, min_bytes, rng):
    docs = [
        "",  # empty text
        " ",
        "a" * 5000,  # one long word: the heap path of the merges
        " " * 3000 + "x",
        "漢字" * 700,
        "\n" * 200,
        "😀" * 300,
        "<|endoftext|>",
        "<|endoftext|><|endoftext|>text<|endoftext|>",
    ]
    total = sum(len(d.encode()) for d in docs)
    while total < min_bytes:
        k = rng.random()
        if k < 0.35:
            d = "".join(rng.choice(en) for _ in range(rng.randint(1, 4)))
        elif k < 0.5:
            d = "".join(rng.choice(zh) for _ in range(rng.randint(1, 2)))
        elif k < 0.65:
            d = "".join(rng.choice(ru) for _ in range(rng.randint(1, 3)))
        elif k < 0.75:
            d = "".join(rng.choice(emoji) for _ in range(rng.randint(1, 20)))
        elif k < 0.9:
            d = synthetic(rng)
        else:  # a blend of everything in one document
            d = rng.choice(en) + synthetic(rng) + rng.choice(zh) + rng.choice(emoji) + rng.choice(ru)
        docs.append(d)
        total += len(d.encode())
    return docs


def sentencepiece_layouts(out, train_text, vocab, added):
    """A LLaMA-2-style BPE trained by `tokenizers` (sentencepiece_style.py) with an alphabet limited to
    the 600 commonest characters, so that rarer ones (most CJK, every emoji) fall back to bytes; the
    added tokens of bpe.json. Written in the layouts listed in the module's docstring."""
    tok = Tokenizer.from_str(json.dumps(sps.train(train_text, vocab, limit_alphabet=600)))
    tok.add_special_tokens([AddedToken("<|eot|>", special=True, normalized=False, rstrip=True)])
    tok.add_tokens(added)
    base = json.loads(tok.to_str())

    def write(name, j):
        with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)

    j = sps.legacy(base)
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]  # as LLaMA-2's file has them
    write("sp_legacy", j)
    write("sp_first", sps.mistral(base))
    for name, scheme, byte_fallback in (("sp_split", "always", True), ("sp_never", "never", False)):
        j = json.loads(json.dumps(base))
        j["pre_tokenizer"] = sps.metaspace(scheme, True)
        j["decoder"] = sps.metaspace(scheme, True)
        if byte_fallback:  # else byte tokens decode as their names
            j["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, j["decoder"]]}
        write(name, j)
    j = json.loads(json.dumps(base))
    j["model"]["byte_fallback"] = False
    j["model"]["fuse_unk"] = False
    write("sp_unk", j)
    return ["sp_legacy", "sp_first", "sp_split", "sp_never", "sp_unk"]


def write_ids(path, encodings):
    with open(path, "wb") as f:
        for e in encodings:
            f.write(struct.pack("<I", len(e.ids)))
            f.write(struct.pack(f"<{len(e.ids)}i", *e.ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--min-bytes", type=int, default=1_100_000)
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "gpt2"), exist_ok=True)
    rng = random.Random(20240531)
    en, zh, ru, emoji = corpus()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    train_text = en + zh[: len(zh) // 2] + ru[: len(ru) // 2]
    tok.train_from_iterator(train_text, trainer)
    tok.save(os.path.join(args.out, "gpt2-plain.json"))  # only <|endoftext|>: what GPT-2's files describe
    tok.model.save(os.path.join(args.out, "gpt2"))  # vocab.json + merges.txt
    tok.add_special_tokens([AddedToken("<|eot|>", special=True, normalized=False, rstrip=True)])
    added = [AddedToken("<sep>", normalized=True), AddedToken("[MASK]", lstrip=True, normalized=True),
             AddedToken("word", single_word=True, normalized=False)]
    tok.add_tokens(added)
    tok.save(os.path.join(args.out, "bpe.json"))
    # A third of the text is enough to train it, and takes a third of the time.
    sp_text = en[::3] + zh[: len(zh) // 6] + ru[: len(ru) // 6]
    sp_names = sentencepiece_layouts(args.out, sp_text, args.vocab, added)

    with open(os.path.join(args.out, "bpe.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with open(os.path.join(args.out, "bpe_legacy.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)

    # LLaMA-3's layout: Split regex + ByteLevel without regex, ignore_merges, many special tokens.
    with open(os.path.join(args.out, "gpt2-plain.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["ignore_merges"] = True
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    base = max(j["model"]["vocab"].values()) + 1
    names = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(254)]
    j["added_tokens"] += [{"id": base + i, "content": n, "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": False, "special": True} for i, n in enumerate(names)]
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                                    "ids": [base], "tokens": ["<|begin_of_text|>"]}}}
    with open(os.path.join(args.out, "llama3.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)

    # GPT-4o's (o200k) layout: a regex with case classes and marks.
    with open(os.path.join(args.out, "gpt2-plain.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT4O_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    with open(os.path.join(args.out, "gpt4o.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)

    with open(os.path.join(args.out, "bpe.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["pre_tokenizer"]["add_prefix_space"] = True
    with open(os.path.join(args.out, "prefix.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)

    docs = documents(en, zh, ru, emoji, args.min_bytes, rng)
    with open(os.path.join(args.out, "texts.bin"), "wb") as f:
        f.write(struct.pack("<I", len(docs)))
        for d in docs:
            b = d.encode("utf-8")
            f.write(struct.pack("<I", len(b)))
            f.write(b)

    gpt2 = Tokenizer(models.BPE.from_file(os.path.join(args.out, "gpt2", "vocab.json"),
                                          os.path.join(args.out, "gpt2", "merges.txt")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.add_special_tokens(["<|endoftext|>"])
    refs = {"bpe": Tokenizer.from_file(os.path.join(args.out, "bpe.json")),
            "bpe_legacy": Tokenizer.from_file(os.path.join(args.out, "bpe_legacy.json")),
            "gpt2": gpt2,
            "llama3": Tokenizer.from_file(os.path.join(args.out, "llama3.json")),
            "gpt4o": Tokenizer.from_file(os.path.join(args.out, "gpt4o.json")),
            "prefix": Tokenizer.from_file(os.path.join(args.out, "prefix.json"))}
    for name in sp_names:
        refs[name] = Tokenizer.from_file(os.path.join(args.out, name + ".json"))
    for name, t in refs.items():
        encodings = t.encode_batch(docs, add_special_tokens=False)
        write_ids(os.path.join(args.out, name + ".ids"), encodings)
        if name in sp_names:
            texts = t.decode_batch([e.ids for e in encodings], skip_special_tokens=False)
            with open(os.path.join(args.out, name + ".text"), "wb") as f:
                for text in texts:
                    b = text.encode("utf-8")
                    f.write(struct.pack("<I", len(b)))
                    f.write(b)
    print(f"tokenizer_parity.py: {len(docs)} documents, {sum(len(d.encode()) for d in docs)} bytes, "
          f"vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
