#!/usr/bin/env python3
"""An independent implementation of Megatron-LM's indexed dataset (MMIDIDX) written from its spec
(docs/indexed-dataset-format.md, which follows megatron/core/datasets/indexed_dataset.py): the
writer as IndexedDatasetBuilder + _IndexWriter lay the bytes down, the reader with numpy memmaps
as _IndexReader does. tests/trainer/data/test_indexed_dataset.cpp and tests/e2e/prep.sh compare our
files with it byte for byte.

    indexed_dataset_ref.py write PREFIX DTYPE < docs.json   # [[seq tokens...], ...] per document
    indexed_dataset_ref.py read PREFIX > dump.json          # header, arrays and documents
    indexed_dataset_ref.py text PREFIX [--eod ID] > docs.txt  # byte-tokenizer datasets: documents as text
"""
import json
import struct
import sys

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
NAMES = {"uint16": 8, "int32": 4}


def write(prefix, dtype_name, docs):
    code = NAMES[dtype_name]
    dtype = CODES[code]
    lengths, doc_indices = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            for seq in doc:
                f.write(np.array(seq, dtype=dtype).tobytes(order="C"))
                lengths.append(len(seq))
            doc_indices.append(len(lengths))
    itemsize = np.dtype(dtype).itemsize
    pointers, p = [], 0
    for n in lengths:
        pointers.append(p)
        p += n * itemsize
    with open(prefix + ".idx", "wb") as f:
        f.write(HEADER)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_indices)))
        f.write(np.array(lengths, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(doc_indices, dtype=np.int64).tobytes(order="C"))


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        assert f.read(9) == HEADER, "bad magic"
        (version,) = struct.unpack("<Q", f.read(8))
        assert version == 1, "bad version"
        (code,) = struct.unpack("<B", f.read(1))
        (seqs,) = struct.unpack("<Q", f.read(8))
        (docs,) = struct.unpack("<Q", f.read(8))
        offset = f.tell()
    buf = np.memmap(prefix + ".idx", mode="r", order="C")
    lengths = np.frombuffer(buf, dtype=np.int32, count=seqs, offset=offset)
    pointers = np.frombuffer(buf, dtype=np.int64, count=seqs, offset=offset + lengths.nbytes)
    doc_indices = np.frombuffer(buf, dtype=np.int64, count=docs, offset=offset + lengths.nbytes + pointers.nbytes)
    assert offset + lengths.nbytes + pointers.nbytes + doc_indices.nbytes == len(buf), "index length mismatch"
    dtype = CODES[code]
    data = np.memmap(prefix + ".bin", mode="r", order="C")
    sequences = [np.frombuffer(data, dtype=dtype, count=int(n), offset=int(p)).tolist()
                 for n, p in zip(lengths, pointers)]
    documents = [[t for s in sequences[doc_indices[i]:doc_indices[i + 1]] for t in s] for i in range(docs - 1)]
    return {"dtype_code": code, "sequence_count": int(seqs), "document_count": int(docs),
            "lengths": lengths.tolist(), "pointers": pointers.tolist(), "document_indices": doc_indices.tolist(),
            "documents": documents}


def main():
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], json.load(sys.stdin))
    elif sys.argv[1] == "read":
        json.dump(read(sys.argv[2]), sys.stdout)
    elif sys.argv[1] == "text":
        eod = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--eod" else None
        out = sys.stdout.buffer
        for doc in read(sys.argv[2])["documents"]:
            if eod is not None:
                assert doc and doc[-1] == eod, "document does not end with the end-of-document token"
                doc = doc[:-1]
            out.write(bytes(doc))
            out.write(b"\n%%%\n")
    else:
        sys.exit("usage: indexed_dataset_ref.py write|read|text PREFIX ...")


if __name__ == "__main__":
    main()
