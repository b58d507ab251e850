"""LLaMA-2-style (SentencePiece-style) BPE tokenizers trained with Hugging Face `tokenizers`, as the
test oracles, the fuzz seeds and scripts/bench/prep.sh use them (any `tokenizers` >= 0.19).

    train(texts, vocab, limit_alphabet=None)  -> the tokenizer.json as a dict
    legacy(j) / mistral(j)                     -> the same model in LLaMA-2's older layout
                                                  (normalizer) and in Mistral's (Metaspace)

The trained model has LLaMA-2's layout: <unk> <s> </s> and the 256 byte tokens <0x00>..<0xFF>
first (ids 0..258, in the model's vocabulary, not added tokens), byte_fallback, fuse_unk.
"""
import json

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

METASPACE = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
# LLaMA-2's decoder (transformers' LlamaConverter), in both layouts.
DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": METASPACE}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def metaspace(scheme, split):
    return {"type": "Metaspace", "replacement": METASPACE, "prepend_scheme": scheme, "split": split}


def train(texts, vocab, limit_alphabet=None, files=False):
    """Trains on `texts` (an iterable of strings, or file names with files=True). Words are split at
    spaces for training (Metaspace always + split); the layouts below decide how text is encoded.
    With limit_alphabet, which characters are kept among equally frequent ones varies from run to
    run (tokenizers' hash order): tests take their references from the same run's files."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    limit = {} if limit_alphabet is None else {"limit_alphabet": limit_alphabet}
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS + BYTE_TOKENS, show_progress=False,
                                  **limit)
    if files:
        tok.train(list(texts), trainer)
    else:
        tok.train_from_iterator(texts, trainer)
    j = json.loads(tok.to_str())
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] in SPECIALS]
    assert [j["model"]["vocab"][t] for t in SPECIALS + BYTE_TOKENS] == list(range(259))
    return j


def legacy(j):
    """LLaMA-2's older tokenizer.json: normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer."""
    j = json.loads(json.dumps(j))
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": METASPACE},
        {"type": "Replace", "pattern": {"String": " "}, "content": METASPACE}]}
    j["pre_tokenizer"] = None
    j["decoder"] = DECODER
    return j


def mistral(j):
    """transformers without `legacy` (Mistral, Mixtral): Metaspace(prepend_scheme first, no split)."""
    j = json.loads(json.dumps(j))
    j["normalizer"] = None
    j["pre_tokenizer"] = metaspace("first", False)
    j["decoder"] = DECODER
    return j
