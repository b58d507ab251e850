"""The PyTorch side of scripts/bench/cpu_step.sh: times full training steps (forward, backward,
grad-norm clipping, AdamW) of the reference model (scripts/reference/model.py) in float32, for the
same shapes as llmtrain's step_bench. Prints one line of key=value pairs.

    python3 torch_step.py --shape tiny|gpt2-124m --batch B [--seq T] --threads N [--steps S] [--device cpu|cuda]
                          [--autocast bf16] [--sdpa 1] [--compile 1]

With --device cuda (scripts/gpu_check.sh) the model runs on the GPU and each step is timed up to
torch.cuda.synchronize(). --autocast bf16 runs forward and loss under torch.autocast (fp32 master
weights, bf16 products: what PyTorch users train in); --sdpa 1 swaps the reference's hand-written
attention for torch's fused scaled_dot_product_attention (flash attention on a GPU); --compile 1
runs the loss through torch.compile (its default mode; the warm-up steps take the compilation).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
import model as ref  # noqa: E402

SHAPES = {
    "tiny": dict(family="gpt2", layers=4, hidden=128, heads=4, vocab=257, seq_len=256, max_positions=256),
    "gpt2-124m": dict(family="gpt2", layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024, max_positions=1024),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--autocast", default="", choices=["", "bf16"])
    ap.add_argument("--sdpa", type=int, default=0)
    ap.add_argument("--compile", type=int, default=0)
    ap.add_argument("--foreach", type=int, default=1, help="AdamW's multi-tensor implementation (1) or the loop (0)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.sdpa:
        def sdpa(q, k, v, mask):
            group = q.shape[1] // k.shape[1]
            if group > 1:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        ref.attention = sdpa
    torch.manual_seed(0)
    cfg = dict(SHAPES[a.shape])
    if a.seq:
        cfg["seq_len"] = a.seq
    d, v = cfg["hidden"], cfg["vocab"]
    cfg.update(kv_heads=cfg["heads"], ffn_hidden=4 * d, padded_vocab=(v + 127) // 128 * 128, norm_eps=1e-5,
               tie_embeddings=True, lr=6e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    p = {"transformer.wte.weight": torch.randn(cfg["padded_vocab"], d) * 0.02,
         "transformer.wpe.weight": torch.randn(cfg["max_positions"], d) * 0.02}
    f = cfg["ffn_hidden"]
    for i in range(cfg["layers"]):
        h = f"transformer.h.{i}."
        p[h + "ln_1.weight"], p[h + "ln_1.bias"] = torch.ones(d), torch.zeros(d)
        p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"] = torch.randn(3, d, d) * 0.02, torch.zeros(3, d)
        p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"] = torch.randn(d, d) * 0.02, torch.zeros(d)
        p[h + "ln_2.weight"], p[h + "ln_2.bias"] = torch.ones(d), torch.zeros(d)
        p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"] = torch.randn(f, d) * 0.02, torch.zeros(f)
        p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"] = torch.randn(d, f) * 0.02, torch.zeros(d)
    p["transformer.ln_f.weight"], p["transformer.ln_f.bias"] = torch.ones(d), torch.zeros(d)
    for k in p:
        p[k] = p[k].to(a.device).requires_grad_(True)
    opt = ref.adamw(p, cfg, foreach=bool(a.foreach))
    loss_fn = torch.compile(ref.loss) if a.compile else ref.loss
    params = list(p.values())
    b, t = a.batch, cfg["seq_len"]
    times, cpu = [], []
    for s in range(a.warmup + a.steps):
        tokens = torch.randint(0, v, (b, t), device=a.device)
        targets = torch.randint(0, v, (b, t), device=a.device)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = loss_fn(p, tokens, targets, cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if a.device == "cuda":
            torch.cuda.synchronize()
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    times.sort()
    cpu.sort()
    median = times[len(times) // 2]
    print(f"torch threads={a.threads} tokens={b * t} median_s={median:.5f} best_s={times[0]:.5f} "
          f"tokens_per_s={b * t / median:.1f} cpu_s={cpu[len(cpu) // 2]:.5f} loss={loss.item():.4f} foreach={a.foreach} "
          f"autocast={a.autocast or 'none'} sdpa={a.sdpa} compile={a.compile}")


if __name__ == "__main__":
    main()
