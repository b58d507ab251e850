"""Compares two training runs the way every layout test does (docs/architecture.md, "Comparing
numbers"): losses per step by relative difference, and the final parameters as one vector by
||a - b|| / ||b||, each parameter assembled from the slices its checkpoint's manifest lists (any
tp, pp, dp or ZeRO layout), read with Hugging Face's safetensors.

    compare_runs.py A B [--first N] [--last N] [--val] [--tol T]

A and B are log directories (metrics.jsonl, ckpt/step_<last>/). Exit status 0 and one line of
figures when they agree; an assertion naming the first difference otherwise.
"""
import argparse
import json

import numpy as np
from safetensors.numpy import load_file


def metric(run, key):
    with open(run + "/metrics.jsonl") as f:
        return {r["step"]: r[key] for r in map(json.loads, f) if key in r}


def params(run, step):
    d = f"{run}/ckpt/step_{step:08d}"
    with open(d + "/manifest.json") as f:
        manifest = json.load(f)
    files, out = {}, {}
    for t in manifest["tensors"]:
        if t["role"] != "param":
            continue
        whole = np.full(t["shape"], np.nan, dtype=np.float32)
        for s in t["slices"]:
            if s["file"] not in files:
                files[s["file"]] = load_file(d + "/" + s["file"])
            block = np.full(s["shape"], np.nan, dtype=np.float32).ravel()
            block[s["begin"]:s["end"]] = files[s["file"]][s["key"]].ravel()
            where = tuple(slice(o, o + n) for o, n in zip(s["offset"], s["shape"]))
            part = whole[where].ravel()
            have = ~np.isnan(block)
            part[have] = block[have]
            whole[where] = part.reshape(s["shape"])
        assert not np.isnan(whole).any(), f"{d}: {t['name']} is not covered by its slices"
        out[t["name"]] = whole
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--first", type=int, default=1, help="first step compared")
    ap.add_argument("--last", type=int, default=20, help="last step, whose checkpoint is compared")
    ap.add_argument("--val", action="store_true", help="validation losses too")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--param-tol", type=float, default=None,
                    help="the final parameters' relative difference (default: --tol)")
    args = ap.parse_args()

    la, lb = metric(args.a, "loss"), metric(args.b, "loss")
    steps = range(args.first, args.last + 1)
    missing = [s for s in steps if s not in la or s not in lb]
    assert not missing, f"steps without a loss: {missing[:5]}"
    bad = [(s, la[s], lb[s]) for s in steps if abs(la[s] - lb[s]) > args.tol * abs(lb[s])]
    assert not bad, f"losses differ: {bad[:3]}"
    worst = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in steps)
    if args.val:
        va, vb = metric(args.a, "val_loss"), metric(args.b, "val_loss")
        vsteps = [s for s in vb if s >= args.first]
        assert vsteps and all(s in va for s in vsteps), f"validation steps {sorted(va)} / {sorted(vb)}"
        bad = [(s, va[s], vb[s]) for s in vsteps if abs(va[s] - vb[s]) > args.tol * abs(vb[s])]
        assert not bad, f"validation losses differ: {bad[:3]}"

    pa, pb = params(args.a, args.last), params(args.b, args.last)
    assert pa.keys() == pb.keys() and pa, (sorted(pa)[:3], sorted(pb)[:3])
    # All parameters as one vector. (Per tensor, GPT-2's key bias differs more: its true gradient
    # is exactly zero — softmax ignores a constant added to a row of scores — so its gradient is
    # pure rounding noise, which differs with the summation order, and Adam scales noise to ±lr
    # steps.)
    xa = np.concatenate([pa[k].ravel() for k in sorted(pa)])
    xb = np.concatenate([pb[k].ravel() for k in sorted(pa)])
    rel = np.linalg.norm(xa - xb) / np.linalg.norm(xb)
    param_tol = args.tol if args.param_tol is None else args.param_tol
    assert rel <= param_tol, f"parameters differ: {rel}"
    print(f"loss difference ≤ {worst:.1e}, relative parameter difference {rel:.2e}")


if __name__ == "__main__":
    main()
