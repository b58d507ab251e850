"""The llama family's variants against transformers 5 (scripts/setup.sh's .venv-hf5, PyTorch 2).

  hf_families.py create ROOT
      saves a model with random weights for each family to ROOT/rand-FAMILY, as transformers 5
      writes it (rope_parameters, dtype): llama (plain), llama31 (rope_type llama3 with every
      frequency band in use), qwen2 (q/k/v biases), qwen3 (q/k norms, head_dim 32 != hidden / heads),
      mistral (sliding window 8, shorter than the prompt), qwen3moe (Qwen3-MoE: a dense layer, then
      MoE blocks of 8 experts, top 2 not renormalised), qwen2moe (Qwen2-MoE: q/k/v biases, a dense
      layer, then MoE blocks of 8 experts, top 2 not renormalised, with a gated shared expert of its
      own width), yarn (Llama with YaRN RoPE, every part of its
      ramp in use), gemma3 (Gemma 3's text model: local and global layers with their own RoPE,
      q/k norms, the query scalar, GeGLU, four norms a block, scaled tied embeddings, capped logits), gptoss
      (gpt-oss: alternating local and global layers, biases on q/k/v/o, attention sinks, YaRN, MoE
      blocks with router and expert biases and the clamped SwiGLU, its experts fused as 5.x holds
      them). ROOT/counts.txt: FAMILY, its parameters and those active per token, as
      transformers' modules hold them. Norm weights, sinks and biases are
      moved away from their 1/0 initialization, so a dropped or misplaced one shows in the logits.
  hf_families.py check ROOT FAMILY...
      for each FAMILY, transformers 5's AutoModelForCausalLM on ROOT/DIR gives the logits in
      ROOT/FAMILY.logits.safetensors (relative Frobenius error <= 1e-5, fp32) and its greedy
      generation gives the ids in ROOT/FAMILY.ids, for DIR = rand-FAMILY (what llmtrain imported)
      and re-FAMILY (what llmtrain exported from it); then every tensor of re-FAMILY is rand-FAMILY's,
      byte for byte (Gemma 3's norms, which llmtrain holds as 1 + w, within 2^-22). A FAMILY with only ROOT/re-FAMILY (a fine-tuned export) is checked there alone.
"""
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

transformers.utils.logging.disable_progress_bar()
FAMILIES = ("llama", "llama31", "qwen2", "qwen3", "mistral", "qwen3moe", "qwen2moe", "yarn", "gemma3", "gptoss")
WINDOW = 8


def config(family):
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "llama31":
        # Head dim 16, theta 10000: wavelengths 6.3 (kept: < 32 / 4), 19.9 (smoothed) and >= 62.8
        # (scaled: > 32 / 1).
        return transformers.LlamaConfig(**common, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32})
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=32)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=WINDOW)  # 4.40.2 knows it too
    if family == "qwen3moe":
        # 3 layers, the first dense (mlp_only_layers), top 2 of 8 experts not renormalised.
        return transformers.Qwen3MoeConfig(**{**common, "num_hidden_layers": 3}, head_dim=32, num_experts=8,
                                           num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=[0],
                                           norm_topk_prob=False)
    if family == "qwen2moe":
        # 3 layers, the first dense; top 2 of 8 experts not renormalised and a shared expert of 96.
        return transformers.Qwen2MoeConfig(**{**common, "num_hidden_layers": 3}, num_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=48, shared_expert_intermediate_size=96,
                                           mlp_only_layers=[0], norm_topk_prob=False)
    if family == "yarn":
        # Head dim 16, theta 10000, original context 64, betas 8 / 1 without truncation: pair 0 keeps
        # its frequency, pairs 1 and 2 blend, the rest are divided by 4; attention factor 1.139.
        return transformers.LlamaConfig(**{**common, "max_position_embeddings": 256}, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 8.0, "beta_slow": 1.0, "truncate": False})
    if family == "gemma3":
        # Gemma 3's text model: 4 layers, local (window 8) but every 2nd global, the local RoPE base
        # 10000 and the global 1e6 with linear scaling 2 (Gemma 3 4B's kind), head_dim 32 (not 64 / 4),
        # query_pre_attn_scalar 24 (not 32), GeGLU, tied embeddings, logits capped at 5.
        return transformers.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 4, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}, head_dim=32,
            sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"] * 2, query_pre_attn_scalar=24,
            final_logit_softcapping=5.0, pad_token_id=0, rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}})
    if family == "gptoss":
        # gpt-oss: a local (window 8) then a global layer, head_dim 16, biases on q/k/v/o, a sink per
        # head, YaRN (original context 32, betas 8 / 1, no truncation), MoE blocks of 4 experts (top 2,
        # softmax over the picked logits) with biases and the clamped SwiGLU, its limit 0.2 binding
        # on a share of these small random activations (gpt-oss's 7 binds on trained ones).
        return transformers.GptOssConfig(
            **{**common, "intermediate_size": 48}, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], swiglu_limit=0.2,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 32, "beta_fast": 8.0, "beta_slow": 1.0,
                             "truncate": False})
    sys.exit(f"unknown family {family}")


def cmd_create(root):
    counts = []
    for i, family in enumerate(FAMILIES):
        torch.manual_seed(i)
        model = transformers.AutoModelForCausalLM.from_config(config(family))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1 or name.endswith("_bias"):  # gpt-oss's experts' biases are [E, n]
                    p.add_(0.1 * torch.randn_like(p))
        model.save_pretrained(os.path.join(root, "rand-" + family))
        # Parameters as transformers counts them, and those a token meets (a MoE block's top_k
        # experts of its num_experts; the router and everything else).
        total = sum(p.numel() for p in model.parameters())
        inactive = 0
        for name, p in model.named_parameters():
            if ".mlp.experts." in name:
                inactive += p.numel() * (model.config.num_experts - model.config.num_experts_per_tok) // \
                    model.config.num_experts
        counts.append(f"{family} {total} {total - inactive}")
    with open(os.path.join(root, "counts.txt"), "w") as f:
        f.write("\n".join(counts) + "\n")
    print(f"saved {len(FAMILIES)} random models with transformers {transformers.__version__}")


def tensors(d):
    from safetensors.torch import load_file as load_torch
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            for k, v in load_torch(os.path.join(d, f)).items():
                out[k] = (str(v.dtype), tuple(v.shape), v.numpy().tobytes())
    return out


def check_dir(hf_dir, ours, want):
    ids = ours["ids"].astype(np.int64)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids[None, :])).logits[0].numpy()
        model.generation_config.eos_token_id = None  # as `llmtrain generate --ignore-eod`
        out = model.generate(torch.tensor(ids[None, :]), max_new_tokens=len(want), do_sample=False, num_beams=1,
                             pad_token_id=0)
    a, b = ours["logits"], logits
    if a.shape != b.shape:
        return [f"logits shape ours {a.shape}, transformers {b.shape}"]
    problems = []
    err = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    if not err <= 1e-5:
        problems.append(f"logits differ: relative error {err:.2e} > 1e-5")
    got = out[0, len(ids):].tolist()
    if got != want or len(want) != 64:
        problems.append(f"greedy tokens differ\n    ours   {want}\n    theirs {got}")
    print(f"  {os.path.basename(hf_dir)}: {len(ids)} prompt tokens, logits relative error {err:.1e}, "
          f"{len(want)} greedy tokens {'identical' if got == want else 'DIFFER'}")
    return problems


def cmd_check(root, families):
    failed = 0
    for family in families:
        ours = load_file(os.path.join(root, family + ".logits.safetensors"))
        want = [int(x) for x in open(os.path.join(root, family + ".ids")).read().split()]
        problems = []
        dirs = [d for d in ("rand-", "re-") if os.path.isdir(os.path.join(root, d + family))]
        for d in dirs:
            problems += [f"{d}{family}: {p}" for p in check_dir(os.path.join(root, d + family), ours, want)]
        same = ""
        if len(dirs) == 2:
            a, b = tensors(os.path.join(root, "rand-" + family)), tensors(os.path.join(root, "re-" + family))
            differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            # Gemma's norms hold w where ours hold 1 + w: in fp32 the round trip rounds w to a
            # multiple of 2^-23 (2^-22 past 1), not more.
            rounded = [k for k in differ if family == "gemma3" and "norm" in k and k in a and k in b and
                       a[k][:2] == b[k][:2] and np.max(np.abs(np.frombuffer(a[k][2], np.float32) -
                                                             np.frombuffer(b[k][2], np.float32))) <= 2.0 ** -22]
            if len(differ) > len(rounded):
                problems.append(f"export of the import differs from the original in {sorted(set(differ) - set(rounded))}")
            same = f"; export of the import is byte-identical ({len(a) - len(rounded)} tensors)"
            if rounded:
                same += f", the {len(rounded)} norms within 2^-22 (1 + w in fp32)"
        if problems:
            failed += 1
            print(f"FAIL: {family}:\n  " + "\n  ".join(problems))
        else:
            print(f"ok: {family}: transformers {transformers.__version__} gives our logits and 64 greedy tokens "
                  f"({' and '.join(d + family for d in dirs)}){same}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "create":
        cmd_create(*rest)
    elif cmd == "check":
        cmd_check(rest[0], rest[1:])
    else:
        sys.exit(f"unknown command {cmd}")
