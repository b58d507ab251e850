"""An independent PyTorch implementation of llmtrain's two model families (GPT-2 and LLaMA, with the
LLaMA variants: q/k/v biases, q/k norms, an explicit head size, a sliding window, RoPE scaling,
mixture-of-experts blocks in Mixtral's form, Gemma 3's local/global layers, GeGLU, post-norms,
scaled embeddings and capped logits, and gpt-oss's attention sinks), used as
the reference by the parity tests (parity.py) and the CPU benchmark (scripts/bench/torch_step.py).

Written from the published architectures and Hugging Face's conventions, not from llmtrain's C++:
parameters are a dict {Hugging Face name: tensor} in llmtrain's layouts (docs/model.md): every
linear weight is [out, in] (GPT-2's c_attn is [3, d, d]), embedding and head rows padded to the
padded vocabulary. Attention is written by hand (torch 1.13 has no scaled_dot_product_attention),
as are RMSNorm and RoPE (Hugging Face's rotate-half convention); the rest uses torch's own ops.
Works in any float dtype: float64 for parity, float32 for benchmarks.
"""
import math

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def attention(q, k, v, mask, scale=None, sinks=None):
    """q [B, H, T, D], k/v [B, KV, T, D]; causal softmax(q kᵀ · scale) v with kv head h // (H / KV);
    scale 1/√D unless given. sinks [H] (gpt-oss): one more logit per head in each row's softmax,
    its probability dropped."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    att = (q @ k.transpose(-2, -1)) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    att = att.masked_fill(mask, float("-inf"))
    if sinks is None:
        return torch.softmax(att, dim=-1) @ v
    b, h, t, _ = att.shape
    att = torch.cat([att, sinks.view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1)
    return torch.softmax(att, dim=-1)[..., :-1] @ v


def causal_mask(t, device=None, window=0):
    """True where query i must not see key j: j > i, or (a sliding window) j <= i - window."""
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=device), diagonal=1)
    if window:
        mask |= torch.tril(torch.ones(t, t, dtype=torch.bool, device=device), diagonal=-window)
    return mask


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_inv_freq(head_dim, theta, scaling=None):
    """theta^(-2i/D), scaled as Hugging Face's `linear` and `llama3` rope types do."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("type", "none")
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor, low, high, orig = (scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                        "original_max_positions"))
        wavelen = 2 * math.pi / inv_freq
        smooth = (orig / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > orig / low, inv_freq / factor,
                               torch.where(wavelen < orig / high, inv_freq, mid))
    elif kind != "none":
        raise ValueError(f"rope scaling {kind}")
    return inv_freq


def rope_cos_sin(t, head_dim, theta, dtype, scaling=None):
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def gpt2_logits(p, tokens, cfg):
    b, t = tokens.shape
    d, h, layers = cfg["hidden"], cfg["heads"], cfg["layers"]
    hd, eps = d // h, cfg["norm_eps"]
    mask = causal_mask(t, tokens.device)
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][:t]
    for i in range(layers):
        w = lambda s: p[f"transformer.h.{i}.{s}"]  # noqa: E731
        y = F.layer_norm(x, (d,), w("ln_1.weight"), w("ln_1.bias"), eps)
        qkv = F.linear(y, w("attn.c_attn.weight").reshape(3 * d, d), w("attn.c_attn.bias").reshape(3 * d))
        q, k, v = (z.view(b, t, h, hd).transpose(1, 2) for z in qkv.split(d, dim=-1))
        y = attention(q, k, v, mask).transpose(1, 2).reshape(b, t, d)
        x = x + F.linear(y, w("attn.c_proj.weight"), w("attn.c_proj.bias"))
        y = F.layer_norm(x, (d,), w("ln_2.weight"), w("ln_2.bias"), eps)
        y = F.gelu(F.linear(y, w("mlp.c_fc.weight"), w("mlp.c_fc.bias")), approximate="tanh")
        x = x + F.linear(y, w("mlp.c_proj.weight"), w("mlp.c_proj.bias"))
    x = F.layer_norm(x, (d,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.wte.weight"] if cfg["tie_embeddings"] else p["lm_head.weight"]
    return F.linear(x, head)


def moe_layer(cfg, i):
    moe = cfg.get("moe")
    return bool(moe) and i >= moe["first_dense"] and (i - moe["first_dense"]) % moe["every"] == 0


def moe_mlp(x, w, moe):
    """A Mixtral-style sparse MoE block on x [N, d] (w: the layer's parameters by suffix), with
    Qwen2-MoE's gated shared expert when moe["shared_ffn_hidden"] > 0 and gpt-oss's router and
    expert biases when moe["bias"]. Returns the
    weighted expert outputs and the block's auxiliary loss: Megatron-Core's load balancing
    aux · E · Σ_e f_e P_e (f_e: the share of the N·K picks that chose e, before any capacity drop; P_e:
    the mean router probability of e) plus the z-loss z · mean(logsumexp(logits)²). With a capacity
    factor each expert keeps its first ⌈factor · N·K / E⌉ picks in (token, pick) order."""
    n, e_count, k = x.shape[0], moe["experts"], moe["top_k"]
    bias = moe.get("bias", False)

    def b(name):
        return w(name) if bias else None

    logits = F.linear(x, w("block_sparse_moe.gate.weight"), b("block_sparse_moe.gate.bias"))
    probs = torch.softmax(logits, dim=-1)
    top_p, top_e = torch.topk(probs, k, dim=-1)
    if moe["renormalize"]:
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    capacity = math.ceil(moe["capacity_factor"] * n * k / e_count) if moe["capacity_factor"] > 0 else n * k
    out = torch.zeros_like(x)
    counts = []
    for e in range(e_count):
        rows, picks = (top_e == e).nonzero(as_tuple=True)  # row-major: (token, pick) order
        counts.append(len(rows))
        rows, picks = rows[:capacity], picks[:capacity]
        xe = x[rows]
        gate = F.linear(xe, w(f"block_sparse_moe.experts.{e}.w1.weight"), b(f"block_sparse_moe.experts.{e}.w1.bias"))
        up = F.linear(xe, w(f"block_sparse_moe.experts.{e}.w3.weight"), b(f"block_sparse_moe.experts.{e}.w3.bias"))
        if moe.get("swiglu_limit", 0) > 0:
            # gpt-oss's clamped SwiGLU: the gate clamped above, the up projection both ways, plus 1.
            limit = moe["swiglu_limit"]
            gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
            h = gate * torch.sigmoid(moe["swiglu_alpha"] * gate) * (up + 1)
        else:
            h = F.silu(gate) * up
        ye = F.linear(h, w(f"block_sparse_moe.experts.{e}.w2.weight"), b(f"block_sparse_moe.experts.{e}.w2.bias"))
        out = out.index_add(0, rows, ye * top_p[rows, picks].unsqueeze(-1))
    if moe.get("shared_ffn_hidden", 0) > 0:
        # Qwen2-MoE's shared expert: a SwiGLU every row visits, scaled by sigmoid(x · gate).
        h = F.silu(F.linear(x, w("block_sparse_moe.shared_expert.gate_proj.weight"))) * \
            F.linear(x, w("block_sparse_moe.shared_expert.up_proj.weight"))
        ys = F.linear(h, w("block_sparse_moe.shared_expert.down_proj.weight"))
        out = out + torch.sigmoid(F.linear(x, w("block_sparse_moe.shared_expert_gate.weight"))) * ys
    f = torch.tensor(counts, dtype=x.dtype) / (n * k)
    aux = moe["aux_loss"] * e_count * (f * probs.mean(dim=0)).sum()
    z = moe["z_loss"] * torch.logsumexp(logits, dim=-1).pow(2).mean()
    return out, aux + z


def llama_logits(p, tokens, cfg):
    return llama_forward(p, tokens, cfg)[0]


def llama_forward(p, tokens, cfg):
    """(logits, the MoE blocks' auxiliary losses summed; 0 for a dense model)."""
    b, t = tokens.shape
    d, h, kv, layers = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["layers"]
    # The variants (Qwen2's q/k/v biases, Qwen3's q/k norms and head size, Mistral's window,
    # Llama 3.1's RoPE scaling) are optional config entries.
    hd, eps = cfg.get("head_dim") or d // h, cfg["norm_eps"]
    # Gemma 3's: local (windowed) layers except every full_attention_every-th, which sees every key;
    # the local layers' own unscaled RoPE base; the softmax scale query_pre_attn_scalar^-1/2; a
    # GeGLU MLP; norms of the attention and MLP outputs; embeddings × √d; capped logits.
    window, every = cfg.get("sliding_window", 0), cfg.get("full_attention_every", 0)
    local_theta = cfg.get("rope_local_theta", 0)
    scale = cfg["query_pre_attn_scalar"] ** -0.5 if cfg.get("query_pre_attn_scalar") else None
    post_norms = cfg.get("post_norms", False)
    gate = (lambda z: F.gelu(z, approximate="tanh")) if cfg.get("activation") == "geglu" else F.silu
    x = p["model.embed_tokens.weight"][tokens]
    if cfg.get("scale_embeddings"):
        x = x * math.sqrt(d)
    aux = torch.zeros((), dtype=x.dtype)
    cos, sin = (z.to(x.device) for z in rope_cos_sin(t, hd, cfg["rope_theta"], x.dtype, cfg.get("rope_scaling")))
    local_cos, local_sin = cos, sin
    if local_theta:
        local_cos, local_sin = (z.to(x.device) for z in rope_cos_sin(t, hd, local_theta, x.dtype))
    for i in range(layers):
        local = window > 0 and (every == 0 or (i + 1) % every != 0)
        mask = causal_mask(t, tokens.device, window if local else 0)
        cos_i, sin_i = (local_cos, local_sin) if local else (cos, sin)
        w = lambda s: p[f"model.layers.{i}.{s}"]  # noqa: E731
        b_ = lambda s: p.get(f"model.layers.{i}.{s}")  # noqa: E731
        y = rms_norm(x, w("input_layernorm.weight"), eps)
        q = F.linear(y, w("self_attn.q_proj.weight"), b_("self_attn.q_proj.bias")).view(b, t, h, hd).transpose(1, 2)
        k = F.linear(y, w("self_attn.k_proj.weight"), b_("self_attn.k_proj.bias")).view(b, t, kv, hd).transpose(1, 2)
        v = F.linear(y, w("self_attn.v_proj.weight"), b_("self_attn.v_proj.bias")).view(b, t, kv, hd).transpose(1, 2)
        if cfg.get("qk_norm"):
            q = rms_norm(q, w("self_attn.q_norm.weight"), eps)
            k = rms_norm(k, w("self_attn.k_norm.weight"), eps)
        q = q * cos_i + rotate_half(q) * sin_i
        k = k * cos_i + rotate_half(k) * sin_i
        y = attention(q, k, v, mask, scale, b_("self_attn.sinks")).transpose(1, 2).reshape(b, t, h * hd)
        y = F.linear(y, w("self_attn.o_proj.weight"), b_("self_attn.o_proj.bias"))
        if post_norms:
            x = x + rms_norm(y, w("post_attention_layernorm.weight"), eps)
            y = rms_norm(x, w("pre_feedforward_layernorm.weight"), eps)
        else:
            x = x + y
            y = rms_norm(x, w("post_attention_layernorm.weight"), eps)
        if moe_layer(cfg, i):
            y, layer_aux = moe_mlp(y.reshape(b * t, d), w, cfg["moe"])
            x = x + y.view(b, t, d)
            aux = aux + layer_aux
            continue
        y = gate(F.linear(y, w("mlp.gate_proj.weight"))) * F.linear(y, w("mlp.up_proj.weight"))
        y = F.linear(y, w("mlp.down_proj.weight"))
        x = x + (rms_norm(y, w("post_feedforward_layernorm.weight"), eps) if post_norms else y)
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["tie_embeddings"] else p["lm_head.weight"]
    z = F.linear(x, head)
    cap = cfg.get("logit_softcap", 0)
    if cap:
        z = cap * torch.tanh(z / cap)
    return z, aux


def logits(p, tokens, cfg):
    """[B, T, padded vocab] logits."""
    return (llama_logits if cfg["family"] == "llama" else gpt2_logits)(p, tokens, cfg)


def loss(p, tokens, targets, cfg):
    """Mean cross-entropy over the real vocabulary (padding columns excluded), ignoring -100."""
    z = logits(p, tokens, cfg)[..., : cfg["vocab"]]
    return F.cross_entropy(z.reshape(-1, cfg["vocab"]), targets.reshape(-1).long(), ignore_index=IGNORE_INDEX)


def objective(p, tokens, targets, cfg):
    """What training minimises: the loss plus the MoE blocks' auxiliary losses (none for a dense model)."""
    if cfg["family"] != "llama" or not cfg.get("moe"):
        return loss(p, tokens, targets, cfg)
    z, aux = llama_forward(p, tokens, cfg)
    z = z[..., : cfg["vocab"]]
    ce = F.cross_entropy(z.reshape(-1, cfg["vocab"]), targets.reshape(-1).long(), ignore_index=IGNORE_INDEX)
    return ce + aux


def takes_weight_decay(name, tensor):
    """Matrices and embeddings decay; biases (GPT-2's [3, d] c_attn bias included) and norm
    weights do not."""
    return name.endswith(".weight") and tensor.dim() >= 2


def lr_at(cfg, step):
    """Linear warmup from lr/warmup, then cosine to min_lr at decay_steps (0-based steps)."""
    lr, min_lr, warmup, decay = cfg["lr"], cfg["min_lr"], cfg["warmup"], cfg["decay_steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay:
        return min_lr
    progress = (step - warmup) / (decay - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def adamw(params, cfg, **kwargs):
    """torch.optim.AdamW with decay and no-decay groups."""
    decay = [t for n, t in params.items() if takes_weight_decay(n, t)]
    rest = [t for n, t in params.items() if not takes_weight_decay(n, t)]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"], **kwargs)
