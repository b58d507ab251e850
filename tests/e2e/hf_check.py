"""Checks an exported (or imported) model against Hugging Face transformers, as a user would load it.

  hf_check.py logits HF_DIR OURS.safetensors GENERATED_IDS [--text TEXT]
      transformers' AutoModelForCausalLM on HF_DIR gives our logits on our prompt ids (relative
      Frobenius error <= 1e-5 in fp32), and its greedy generation of as many tokens gives our ids;
      with --text, AutoTokenizer on HF_DIR encodes TEXT to our prompt ids.
  hf_check.py random FAMILY OUT_DIR
      saves a transformers model with random weights (GPT-2 or LLaMA, small) to OUT_DIR.
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
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        for k, v in load_file(os.path.join(d, f)).items():
            out[k] = v
    return out


def cmd_logits(hf_dir, ours_path, generated, text=None):
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
        out = model.generate(torch.tensor(ids[None, :]), max_new_tokens=len(want), min_new_tokens=len(want),
                             do_sample=False, num_beams=1, pad_token_id=model.config.eos_token_id)
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


def cmd_same_tensors(a_dir, b_dir):
    a, b = tensors(a_dir), tensors(b_dir)
    bad = [k for k in a if k not in b or a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
           or a[k].tobytes() != b[k].tobytes()]
    extra = [k for k in b if k not in a]
    if bad or extra:
        sys.exit(f"FAIL: differing {bad}, only in {b_dir}: {extra}")
    print(f"ok: {len(a)} tensors byte-identical")


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "logits":
        text = None
        if "--text" in rest:
            i = rest.index("--text")
            text = rest[i + 1]
            rest = rest[:i] + rest[i + 2:]
        cmd_logits(*rest, text=text)
    elif cmd == "random":
        cmd_random(*rest)
    elif cmd == "same-tensors":
        cmd_same_tensors(*rest)
    else:
        sys.exit(f"unknown command {cmd}")
