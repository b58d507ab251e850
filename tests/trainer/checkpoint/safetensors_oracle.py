"""Hugging Face's safetensors library as the oracle for llmtrain's safetensors writer and reader
(tests/trainer/checkpoint/test_safetensors.cpp runs this with .venv/bin/python).

    safetensors_oracle.py check FILE   verify a file our writer produced (exit 0 = ok)
    safetensors_oracle.py write DIR    write files for our reader: DIR/numpy.safetensors, DIR/torch.safetensors

Values follow one formula on both sides: element j of the tensor with index i is
(j % 17 - 8) * 0.3 * (i + 1) for floats (rounded to the tensor's dtype by numpy/torch, so the
16-bit conversions are checked too) and j * (i + 1) - 5 for integers (taken modulo the type).
"""
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file as save_torch

# name, dtype, shape -- the same list as test_safetensors.cpp's kEntries
ENTRIES = [
    ("a.f32", "F32", (2, 3, 4)),
    ("b.bf16", "BF16", (5, 7)),
    ("c.f16", "F16", (3, 11)),
    ("d.i32", "I32", (4,)),
    ("e.u16", "U16", (6,)),
    ("f.i64", "I64", (2, 2)),
    ("g.u8", "U8", (9,)),
    ("h.empty", "F32", (0, 4)),
    ("i.scalar", "F32", ()),
]
NUMPY = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U16": np.uint16, "I64": np.int64, "U8": np.uint8}


def floats(i, shape):
    n = int(np.prod(shape)) if shape else 1
    j = np.arange(n, dtype=np.float64)
    return ((j % 17 - 8) * 0.3 * (i + 1)).astype(np.float32).reshape(shape)


def ints(i, shape, dtype):
    n = int(np.prod(shape)) if shape else 1
    return (np.arange(n, dtype=np.int64) * (i + 1) - 5).astype(dtype).reshape(shape)


def expected(i, dtype, shape):
    if dtype == "BF16":
        return torch.from_numpy(floats(i, shape)).to(torch.bfloat16)
    if dtype in ("F32", "F16"):
        return floats(i, shape).astype(NUMPY[dtype])
    return ints(i, shape, NUMPY[dtype])


def check(path):
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "writer": "llmtrain"}, f.metadata()
        assert list(f.keys()) == sorted(n for n, _, _ in ENTRIES), list(f.keys())
        for i, (name, dtype, shape) in enumerate(ENTRIES):
            if dtype == "BF16":
                continue
            got = f.get_tensor(name)
            want = expected(i, dtype, shape)
            assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
            assert got.tobytes() == want.tobytes(), (name, got, want)
    with safe_open(path, framework="pt") as f:
        for i, (name, dtype, shape) in enumerate(ENTRIES):
            if dtype == "BF16":
                got, want = f.get_tensor(name), expected(i, dtype, shape)
                assert got.dtype == torch.bfloat16 and tuple(got.shape) == shape
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (name, got, want)
    print("ok: safetensors reads every tensor and the metadata as written")


def write(d):
    arrays = {n: expected(i, t, s) for i, (n, t, s) in enumerate(ENTRIES) if t != "BF16"}
    save_numpy(arrays, f"{d}/numpy.safetensors", metadata={"format": "np", "source": "safetensors.numpy"})
    i = [n for n, _, _ in ENTRIES].index("b.bf16")
    save_torch({"b.bf16": expected(i, "BF16", (5, 7)), "x.f32": torch.arange(6, dtype=torch.float32).reshape(2, 3)},
               f"{d}/torch.safetensors")


if __name__ == "__main__":
    check(sys.argv[2]) if sys.argv[1] == "check" else write(sys.argv[2])
