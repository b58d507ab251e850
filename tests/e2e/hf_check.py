"""Checks an exported (or imported) model against Hugging Face transformers, as a user would load it.

  hf_check.py logits HF_DIR OURS.safetensors GENERATED_IDS [--text TEXT] [--generated-text FILE]
      transformers' AutoModelForCausalLM on HF_DIR gives our logits on our prompt ids (relative
      Frobenius error <= 1e-5 in fp32), and its greedy generation of as many tokens gives our ids;
      with --text, AutoTokenizer on HF_DIR encodes TEXT to our prompt ids; with --generated-text,
      AutoTokenizer decodes the prompt and generated ids to FILE's text (what `llmtrain generate`
      printed, less its final newline).
  hf_check.py random FAMILY OUT_DIR
      saves a transformers model with random weights (GPT-2 or LLaMA, small) to OUT_DIR.
  hf_check.py resave IN_DIR OUT_DIR [--bf16]
      loads IN_DIR with transformers and saves it to OUT_DIR with save_pretrained (transformers'
      own files; bf16 tensors with --bf16), the tokenizer files copied.
  hf_check.py train-tokenizer OUT_DIR VOCAB FILE...
      a byte-level BPE trained with Hugging Face tokenizers: OUT_DIR/tokenizer.json and GPT-2's
      OUT_DIR/vocab.json + merges.txt of the same model.
  hf_check.py train-tokenizer-sp OUT_DIR VOCAB FILE...
      a SentencePiece-style BPE as Mistral's tokenizer.json has it (<unk> <s> </s>, the 256 <0xNN>
      byte tokens, byte_fallback, Metaspace with prepend_scheme first, LLaMA-2's decoder), trained
      with Hugging Face tokenizers: OUT_DIR/tokenizer.json.
  hf_check.py same-tensors A_DIR B_DIR
      every tensor of A's safetensors files is in B's, byte for byte (same dtype and shape), and
      B has no others.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import load_file


def tensors(d):
    """name -> (dtype, shape, raw bytes) of every tensor in d's safetensors files (bf16 included)."""
    from safetensors.torch import load_file as load_torch
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            for k, v in load_torch(os.path.join(d, f)).items():
                raw = v.view(torch.int16) if v.dtype in (torch.bfloat16, torch.float16) else v
                out[k] = (str(v.dtype), tuple(v.shape), raw.numpy().tobytes())
    return out


def cmd_logits(hf_dir, ours_path, generated, text=None, generated_text=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ours = load_file(ours_path)
    ids = ours["ids"].astype(np.int64)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids[None, :])).logits[0].numpy()
    a, b = ours["logits"], logits
    if a.shape != b.shape:
        sys.exit(f"FAIL: logits shape ours {a.shape}, transformers {b.shape}")
    err = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    ok = err <= 1e-5
    print(f"{'ok' if ok else 'FAIL'}: logits relative error {err:.2e} over {a.shape[0]} tokens x {a.shape[1]} ids")
    want = [int(x) for x in open(generated).read().split()]
    with torch.no_grad():
        # As `llmtrain generate --ignore-eod`: greedy, not stopping at the end-of-document token.
        model.generation_config.eos_token_id = None
        out = model.generate(torch.tensor(ids[None, :]), max_new_tokens=len(want), do_sample=False, num_beams=1,
                             pad_token_id=0)
    got = out[0, len(ids):].tolist()
    same = got == want
    ok = ok and same and len(want) == 64
    print(f"{'ok' if same else 'FAIL'}: greedy generation of {len(want)} tokens "
          f"{'identical' if same else 'differs'}" + ("" if same else f"\n  ours {want}\n  theirs {got}"))
    if text is not None:
        tok = AutoTokenizer.from_pretrained(hf_dir)
        enc = tok(text, add_special_tokens=False)["input_ids"]
        same = enc == ids.tolist()
        ok = ok and same
        print(f"{'ok' if same else 'FAIL'}: AutoTokenizer gives our {len(enc)} ids" +
              ("" if same else f"\n  ours {ids.tolist()}\n  theirs {enc}"))
        back = tok.decode(ids.tolist())
        if back != text:
            ok = False
            print(f"FAIL: AutoTokenizer decodes our ids to {back!r}, not {text!r}")
    if generated_text is not None:
        tok = AutoTokenizer.from_pretrained(hf_dir)
        theirs = tok.decode(ids.tolist() + want)
        ours = open(generated_text, encoding="utf-8", errors="surrogateescape").read()[:-1]
        if "\ufffd" in theirs:  # bytes that are not UTF-8: Hugging Face replaces them, we print them
            print("ok: generated text not compared (the ids end inside a character)")
        elif ours == theirs:
            print(f"ok: the generated text is AutoTokenizer's decode ({len(ours)} characters)")
        else:
            ok = False
            print(f"FAIL: llmtrain generate printed {ours!r}\n  AutoTokenizer decodes {theirs!r}")
    sys.exit(0 if ok else 1)


def cmd_random(family, out_dir):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = GPT2Config(vocab_size=300, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=0, eos_token_id=0)
        model = LlamaForCausalLM(cfg)
    # Norm weights and biases away from their 1/0 initialization, so that a dropped or misplaced
    # one shows in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    print(f"saved a random {family} model to {out_dir}")


def cmd_resave(in_dir, out_dir, bf16=False):
    import shutil
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(in_dir, torch_dtype=torch.float32)
    if bf16:
        model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(in_dir, f)):
            shutil.copy(os.path.join(in_dir, f), out_dir)
    print(f"resaved {in_dir} to {out_dir} with transformers")


def cmd_train_tokenizer(out_dir, vocab, *files):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(list(files), trainers.BpeTrainer(vocab_size=int(vocab), special_tokens=["<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tok.model.save(out_dir)  # vocab.json, merges.txt


def cmd_train_tokenizer_sp(out_dir, vocab, *files):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainer", "data"))
    import sentencepiece_style as sps
    j = sps.mistral(sps.train(files, int(vocab), limit_alphabet=100, files=True))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def cmd_same_tensors(a_dir, b_dir):
    a, b = tensors(a_dir), tensors(b_dir)
    bad = [k for k in a if k not in b or a[k] != b[k]]
    extra = [k for k in b if k not in a]
    if bad or extra:
        sys.exit(f"FAIL: differing {bad}, only in {b_dir}: {extra}")
    print(f"ok: {len(a)} tensors byte-identical")


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "logits":
        opts = {}
        for flag, key in (("--text", "text"), ("--generated-text", "generated_text")):
            if flag in rest:
                i = rest.index(flag)
                opts[key] = rest[i + 1]
                rest = rest[:i] + rest[i + 2:]
        cmd_logits(*rest, **opts)
    elif cmd == "random":
        cmd_random(*rest)
    elif cmd == "resave":
        cmd_resave(rest[0], rest[1], "--bf16" in rest)
    elif cmd == "train-tokenizer":
        cmd_train_tokenizer(*rest)
    elif cmd == "train-tokenizer-sp":
        cmd_train_tokenizer_sp(*rest)
    elif cmd == "same-tensors":
        cmd_same_tensors(*rest)
    else:
        sys.exit(f"unknown command {cmd}")
