"""Mixtral (MixtralForCausalLM) against transformers 5 (.venv-hf5) and 4.40.2 (.venv-hf).
Commands separated by `--` run in one process; the exit status is 1 when any failed.

  hf_mixtral.py create DIR WINDOW [FUSED_DIR]
      saves a MixtralForCausalLM with random weights to DIR with the running transformers: hidden
      64, 2 layers, 4 experts, top 2, vocab 300, router_aux_loss_coef 0.02, sliding_window WINDOW
      (0: none). Norm weights move away from their 1 initialization, and the router's weights are
      scaled up so the top-2 picks differ from token to token. With FUSED_DIR (transformers 5), the
      same model saved there with save_original_format=False (the experts fused, as in memory).
  hf_mixtral.py check OURS TOKENS DIR...
      for each DIR, transformers' AutoModelForCausalLM gives the logits in OURS.safetensors
      (relative Frobenius error <= 1e-5, fp32) and its greedy generation gives the ids in the file
      TOKENS (`llmtrain generate --ids`, as many as it holds).
  hf_mixtral.py same-tensors A B
      every tensor of A's safetensors files is in B's, byte for byte, and B has no others.
  hf_mixtral.py aux DIR OURS
      the load-balancing loss of DIR's first MoE block on OURS's prompt: llmtrain's definition
      (scripts/reference/model.py's moe_mlp: aux · E · Σ f·P with f the share of the N·K picks) over
      its coefficient equals transformers' load_balancing_loss_func of that layer's router logits
      over top_k (relative 1e-6).
"""
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

transformers.utils.logging.disable_progress_bar()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "reference"))


def cmd_create(out, window, fused_out=None):
    window = int(window)
    cfg = transformers.MixtralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False,
        router_aux_loss_coef=0.02, sliding_window=window or None)
    torch.manual_seed(window + 1)
    model = transformers.MixtralForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("gate.weight") and "experts" not in name:
                p.mul_(20.0)
    model.save_pretrained(out)
    print(f"saved a random MixtralForCausalLM with transformers {transformers.__version__} to {out}")
    if fused_out:  # transformers 5's in-memory layout: mlp.gate, experts.gate_up_proj and down_proj
        model.save_pretrained(fused_out, save_original_format=False)
        print(f"saved it with save_original_format=False to {fused_out}")


def cmd_check(ours_path, tokens_path, dirs):
    ours = load_file(ours_path)
    ids = ours["ids"].astype(np.int64)
    want = [int(x) for x in open(tokens_path).read().split()]
    failed = False
    for d in dirs:
        model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
        model.eval()
        with torch.no_grad():
            logits = model(torch.tensor(ids[None, :])).logits[0].numpy()
            model.generation_config.eos_token_id = None  # as `llmtrain generate --ignore-eod`
            out = model.generate(torch.tensor(ids[None, :]), max_new_tokens=len(want), do_sample=False,
                                 num_beams=1, pad_token_id=0)
        a, b = ours["logits"], logits
        if a.shape != b.shape:
            print(f"FAIL: {d}: logits shape ours {a.shape}, transformers {b.shape}")
            failed = True
            continue
        err = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        got = out[0, len(ids):].tolist()
        ok = err <= 1e-5 and got == want and len(want) >= 24
        failed |= not ok
        print(f"{'ok' if ok else 'FAIL'}: {d}: transformers {transformers.__version__} "
              f"({type(model).__name__}), {len(ids)} prompt tokens, logits relative error {err:.1e}, "
              f"{len(want)} greedy tokens {'identical' if got == want else 'DIFFER'}" +
              ("" if got == want else f"\n  ours   {want}\n  theirs {got}"))
    if failed:
        sys.exit(1)


def tensors(d):
    from safetensors.torch import load_file as load_torch
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            for k, v in load_torch(os.path.join(d, f)).items():
                out[k] = (str(v.dtype), tuple(v.shape), v.numpy().tobytes())
    return out


def cmd_same_tensors(a_dir, b_dir):
    a, b = tensors(a_dir), tensors(b_dir)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if differ:
        sys.exit(f"FAIL: {b_dir} differs from {a_dir} in {differ[:8]}")
    print(f"ok: {b_dir} holds {a_dir}'s {len(a)} tensors byte for byte")


def cmd_aux(hf_dir, ours_path):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    import model as reference
    ids = load_file(ours_path)["ids"].astype(np.int64)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.eval()
    cfg = model.config
    experts, top_k = cfg.num_local_experts, cfg.num_experts_per_tok
    with torch.no_grad():
        logits = model(torch.tensor(ids[None, :]), output_router_logits=True).router_logits[0]
        theirs = float(load_balancing_loss_func((logits,), experts, top_k)) / top_k
        # moe_mlp on the router's logits themselves: an identity router over x = the logits (and
        # experts of width 1 whose output is not used).
        x = logits.double()
        w = {"block_sparse_moe.gate.weight": torch.eye(experts, dtype=torch.float64)}
        for e in range(experts):
            w[f"block_sparse_moe.experts.{e}.w1.weight"] = torch.zeros(1, experts, dtype=torch.float64)
            w[f"block_sparse_moe.experts.{e}.w3.weight"] = torch.zeros(1, experts, dtype=torch.float64)
            w[f"block_sparse_moe.experts.{e}.w2.weight"] = torch.zeros(experts, 1, dtype=torch.float64)
        moe = {"experts": experts, "top_k": top_k, "renormalize": True, "capacity_factor": 0,
               "aux_loss": cfg.router_aux_loss_coef, "z_loss": 0.0}
        _, aux = reference.moe_mlp(x, w.__getitem__, moe)
        ours = float(aux) / cfg.router_aux_loss_coef
    rel = abs(ours - theirs) / abs(theirs)
    ok = rel <= 1e-6
    print(f"{'ok' if ok else 'FAIL'}: load balancing of layer 0 over {len(ids)} tokens: ours / aux_loss {ours:.9f}, "
          f"transformers' load_balancing_loss_func / top_k {theirs:.9f} (relative {rel:.1e})")
    if not ok:
        sys.exit(1)


def run(cmd, *rest):
    if cmd == "create":
        return cmd_create(*rest)
    if cmd == "check":
        return cmd_check(rest[0], rest[1], rest[2:])
    if cmd == "same-tensors":
        return cmd_same_tensors(*rest)
    if cmd == "aux":
        return cmd_aux(*rest)
    sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    # Commands separated by "--" run in one process (transformers takes seconds to import).
    commands, current = [], []
    for arg in sys.argv[1:] + ["--"]:
        if arg == "--":
            if current:
                commands.append(current)
            current = []
        else:
            current.append(arg)
    failed = False
    for c in commands:
        try:
            run(*c)
        except SystemExit as e:
            if e.code:
                failed = True
                if not isinstance(e.code, int):
                    print(e.code)
    sys.exit(1 if failed else 0)
