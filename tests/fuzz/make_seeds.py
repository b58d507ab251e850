#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs (tests/fuzz/corpus/<target>/), with the independent
libraries where there is one (Hugging Face safetensors and tokenizers), so the seeds are valid
files the fuzzer mutates from.

    .venv/bin/python tests/fuzz/make_seeds.py [MANIFEST.json]

A manifest of a real checkpoint (any step_*/manifest.json) is trimmed to three tensors.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
from safetensors.numpy import save
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# recipe: the shipped recipes.
recipes = os.path.join(os.path.dirname(root), "..", "..", "recipes")
os.makedirs(os.path.join(root, "recipe"), exist_ok=True)
for r in sorted(os.listdir(recipes)):
    shutil.copyfile(os.path.join(recipes, r), os.path.join(root, "recipe", r))

# safetensors: the dtypes a checkpoint and a Hugging Face model use, with metadata.
put("safetensors", "f32_i64.safetensors",
    save({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7, 8], dtype=np.int64)},
         metadata={"format": "pt"}))
put("safetensors", "u16_scalar.safetensors",
    save({"s": np.array(1.5, dtype=np.float32), "u": np.arange(4, dtype=np.uint16), "e": np.zeros((0, 3), np.float32)}))

# idx: two little-endian bytes of .bin length, then a Megatron .idx (uint16 tokens).
lengths = [3, 2, 4]
pointers = [0, 6, 10]
docs = [0, 1, 3]
idx = (b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, 8) + struct.pack("<QQ", len(lengths), len(docs)) +
       struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers) +
       struct.pack(f"<{len(docs)}q", *docs))
put("idx", "three_sequences", struct.pack("<H", 18) + idx)
put("idx", "bin_too_short", struct.pack("<H", 7) + idx)

# tokenizer: a byte-level BPE trained here (first byte even: tokenizer.json), and the GPT-2 pair a
# checkpoint stores (first byte odd).
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
text = ["Hello, world! The quick brown fox jumps over the lazy dog.", "12345 caf\u00e9 \u4e2d\u6587 \U0001F600"] * 20
tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                   special_tokens=["<|endoftext|>"]))
put("tokenizer", "hf_bytelevel_bpe.json", b"\x00" + tok.to_str().encode())
model = json.loads(tok.to_str())["model"]
merges = model["merges"]
merges_txt = "#version: 0.2\n" + "".join((m if isinstance(m, str) else " ".join(m)) + "\n" for m in merges)
put("tokenizer", "gpt2_pair.json", b"\x01" + json.dumps({"vocab.json": json.dumps(model["vocab"]),
                                                          "merges.txt": merges_txt}).encode())

# tokenizer_text: SentencePiece-style BPEs (LLaMA-2's legacy normalizer layout and Mistral's Metaspace
# one, with byte fallback) and a text after a NUL byte: spaces, an added token, characters the small
# vocabulary lacks (byte fallback), and a few bytes that make ids to decode. The same files go to
# `tokenizer` too (first byte 0: tokenizer.json).
sys.path.insert(0, os.path.join(os.path.dirname(root), "..", "trainer", "data"))
import sentencepiece_style as sps  # noqa: E402

base = sps.train(text, 330)
base["added_tokens"].append({"id": len(base["model"]["vocab"]), "content": "<sep>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": True, "special": False})
legacy, mistral = sps.legacy(base), sps.mistral(base)
split = dict(base, pre_tokenizer=sps.metaspace("never", True),
             decoder={"type": "Sequence", "decoders": [{"type": "ByteFallback"}, sps.metaspace("never", True)]})
sample = "  The quick<sep>brown \u4e2d\u6587 \U0001F600</s>fox\n\x01\x02\x7f"
for name, j in (("llama2_legacy", legacy), ("mistral_metaspace", mistral), ("metaspace_split_never", split)):
    put("tokenizer_text", name, json.dumps(j, ensure_ascii=False).encode() + b"\x00" + sample.encode())
    put("tokenizer", name + ".json", b"\x00" + json.dumps(j, ensure_ascii=False).encode())

# manifest: a real checkpoint's, trimmed.
if len(sys.argv) > 1:
    m = json.load(open(sys.argv[1]))
    m["tensors"] = m["tensors"][:3]
    put("manifest", "trimmed.json", json.dumps(m, indent=1))

# prep_jsonl: documents, a blank line, a bad record, another key, unicode escapes.
put("prep_jsonl", "mixed.jsonl",
    '{"text": "first document"}\n\n{"text": "caf\\u00e9 \\ud83d\\ude00"}\n{"other": 1}\nnot json\n'
    '{"text": ["not", "a", "string"]}\n{"text": "last"}')

# plot_metrics: metrics.jsonl as the trainer writes it (training and evaluation records, a null).
put("plot_metrics", "run.jsonl",
    '{"step":1,"loss":5.5,"lr":0.0001,"grad_norm":1.5,"tokens_per_s":1200.5}\n'
    '{"step":2,"loss":4.25,"lr":0.0002,"grad_norm":null}\n'
    '{"step":2,"val_loss":4.5,"val_ppl":90.0}\n'
    '{"step":3,"loss":3.125,"lr":0.0003,"grad_norm":0.75}\n')

# hf_index: a sharded model's index, as transformers' save_pretrained writes it.
put("hf_index", "two_shards.json", json.dumps({
    "metadata": {"total_size": 1024},
    "weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors",
                   "transformer.h.0.attn.c_attn.weight": "model-00002-of-00002.safetensors"}}, indent=2))

# derived_recipe: a config.json, '\0', the model directory's path, '\0', the output path.
# (qwen2, qwen3, mistral, llama31, qwen3moe, qwen2moe, yarn, gemma3, gptoss: configs saved by transformers 5.24,
# tests/e2e/hf_families.py; mixtral: tests/e2e/hf_mixtral.py create DIR 8.)
for family in ("gpt2", "llama", "qwen2", "qwen3", "mistral", "llama31", "mixtral", "qwen3moe", "qwen2moe", "yarn",
               "gemma3", "gptoss"):
    with open(os.path.join(root, "hf_config", family + ".json"), "rb") as f:
        put("derived_recipe", family, f.read() + b"\0/models/" + family.encode() + b"\0ckpt/" + family.encode())

