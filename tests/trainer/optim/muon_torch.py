"""Muon (trainer/optim/muon.h, through tests' muon_driver) against PyTorch's torch.optim.Muon.

    muon_torch.py DRIVER WORKDIR [DEVICE]

For wide, tall and square matrices, both step-size adjustments, with and without Nesterov and weight
decay: five steps from the same parameter and gradients, in three runs of PyTorch's own code — its
Newton–Schulz iteration in bf16 (as shipped), in fp32 and in float64 (its bf16 cast made fp32 or
float64, the float64 run on float64 copies: the exact reference) — and ours in bf16 and fp32. The
error of a run is max over steps of ‖W − W_exact‖ / ‖W_exact − W_0‖ (relative to the update).

Two fp32 implementations cannot agree to 1e-6 here: PyTorch's fp32 run itself is 0.9–1.2e-6 from
the exact one (five iterations whose coefficients amplify rounding), ours 0.8–0.9e-6, and the two
1.0–1.4e-6 apart. So ours must be within 2e-6 of the exact run (0.8–0.9e-6 measured), and no farther from it than 1.5 ×
PyTorch's fp32. In bf16 the products round their outputs to bf16 before our fp32 sums (PyTorch's
addmm adds before it rounds): ours is 1.2–1.7 × PyTorch's bf16 distance from the exact run, and
must stay within 2 ×.
"""
import os
import subprocess
import sys

import numpy as np
import torch
import torch.optim._muon as muon_module


class TorchWith:
    """The torch module as _muon.py sees it, with bfloat16 meaning another dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __getattr__(self, name):
        return self.dtype if name == "bfloat16" else getattr(torch, name)


def torch_muon(w0, grads, lr, wd, momentum, nesterov, adjust, ns):
    """PyTorch's Muon with its iteration in ns: bf16 (as shipped), fp32, or fp64 (on fp64 copies)."""
    real = muon_module.torch
    dtype = torch.float64 if ns == "fp64" else torch.float32
    if ns != "bf16":
        muon_module.torch = TorchWith(dtype)
    try:
        p = torch.nn.Parameter(torch.tensor(w0, dtype=dtype))
        opt = torch.optim.Muon([p], lr=lr, weight_decay=wd, momentum=momentum, nesterov=nesterov,
                               adjust_lr_fn=adjust)
        out = []
        for g in grads:
            p.grad = torch.tensor(g, dtype=dtype)
            opt.step()
            out.append(p.detach().numpy().astype(np.float64))
        return out
    finally:
        muon_module.torch = real


def ours(driver, work, device, w0, grads, lr, wd, momentum, nesterov, adjust, ns):
    rows, cols = w0.shape
    inp, out = os.path.join(work, "in.bin"), os.path.join(work, "out.bin")
    np.concatenate([w0.ravel()] + [g.ravel() for g in grads]).astype(np.float32).tofile(inp)
    subprocess.run([driver, device, ns, adjust, "1" if nesterov else "0", repr(lr), repr(wd), repr(momentum),
                    str(len(grads)), str(rows), str(cols), inp, out], check=True)
    got = np.fromfile(out, dtype=np.float32)
    return [got[i * rows * cols:(i + 1) * rows * cols].reshape(rows, cols) for i in range(len(grads))]


def rel(a_steps, b_steps, w0):
    w0 = w0.astype(np.float64)
    return max(float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b - w0))
               for a, b in zip(a_steps, b_steps))


def main():
    driver, work = sys.argv[1], sys.argv[2]
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    rng = np.random.default_rng(2026)
    failures, worst_fp32, worst_bf16 = [], 0.0, 0.0
    # On a (simulated) device: the products' paths, one setting per shape.
    settings = [(a, n, w) for a in ("original", "match_rms_adamw") for n in (True, False) for w in (0.0, 0.1)]
    if device != "cpu":
        settings = settings[1:2]
    for rows, cols in ((24, 40), (40, 24), (32, 32)):
        w0 = (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)
        grads = [rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(5)]
        for adjust, nesterov, wd in settings:
            args = dict(lr=0.02, wd=wd, momentum=0.95, nesterov=nesterov, adjust=adjust)
            name = f"[{rows}, {cols}] {adjust} nesterov={nesterov} wd={wd}"
            exact = torch_muon(w0, grads, ns="fp64", **args)
            t32, t16 = (torch_muon(w0, grads, ns=ns, **args) for ns in ("fp32", "bf16"))
            o32, o16 = (ours(driver, work, device, w0, grads, ns=ns, **args) for ns in ("fp32", "bf16"))
            e32, p32 = rel(o32, exact, w0), rel(t32, exact, w0)
            e16, p16 = rel(o16, exact, w0), rel(t16, exact, w0)
            worst_fp32, worst_bf16 = max(worst_fp32, e32 / p32), max(worst_bf16, e16 / p16)
            print(f"{name}: from the exact run, fp32 ours {e32:.2e} PyTorch {p32:.2e} (ours against "
                  f"PyTorch's {rel(o32, t32, w0):.2e}); bf16 ours {e16:.2e} PyTorch {p16:.2e}")
            if not (e32 <= 2e-6 and e32 <= 1.5 * p32):
                failures.append(f"{name}: fp32 {e32:.3e} from the exact run (PyTorch's fp32: {p32:.3e})")
            if not e16 <= 2 * p16:
                failures.append(f"{name}: bf16 {e16:.3e} from the exact run > 2 × PyTorch's {p16:.3e}")
    print(f"worst ratio of our error to PyTorch's: fp32 {worst_fp32:.2f}, bf16 {worst_bf16:.2f}")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("ok: Muon matches torch.optim.Muon")


if __name__ == "__main__":
    main()
