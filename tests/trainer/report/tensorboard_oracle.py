"""The `tensorboard` package as the oracle for llmtrain's TensorBoard event files (trainer/report/tensorboard.h).
Run with .venv/bin/python by tests/trainer/report/test_tensorboard.cpp and tests/e2e/tensorboard.sh.

    tensorboard_oracle.py check DIR EXPECTED FILES   DIR's scalars are exactly EXPECTED's lines
                                                     ("tag step value"), in FILES events files
    tensorboard_oracle.py run RUN_DIR FILES          RUN_DIR/tensorboard against RUN_DIR/metrics.jsonl

Both first walk every events file record by record with tensorboard's own masked CRC-32C and its
Event protobuf (every byte must belong to a whole, valid record; the first event is the
file_version), then read the directory as TensorBoard's UI does (EventAccumulator: files in name
order, points orphaned by a restart purged) and compare each tag's (step, value) list. Values
compare exactly after rounding the expected number to float32, the type TensorBoard stores.
Exit 0 = ok; anything else prints why.
"""
import glob
import json
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as e:
    sys.exit(
        f"tensorboard_oracle.py: cannot import the tensorboard package ({e}); "
        f"install it into .venv with scripts/setup.sh (python: {sys.executable})"
    )


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_records(path):
    """Every record of one events file, framed and checksummed as TFRecord; returns the Events."""
    data = open(path, "rb").read()
    events, at = [], 0
    while at < len(data):
        assert at + 12 <= len(data), f"{path}: {len(data) - at} stray bytes at offset {at}"
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        assert header_crc == masked_crc32c(header), f"{path}: bad length CRC at offset {at}"
        end = at + 12 + length + 4
        assert end <= len(data), f"{path}: record at offset {at} runs past the end"
        body = data[at + 12 : at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[end - 4 : end])
        assert body_crc == masked_crc32c(body), f"{path}: bad data CRC at offset {at}"
        events.append(event_pb2.Event.FromString(body))
        at = end
    assert events, f"{path}: no events"
    assert events[0].file_version == "brain.Event:2", f"{path}: first event is {events[0]}"
    return events


def check_files(tb_dir, files):
    paths = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
    assert len(paths) == files, f"{tb_dir}: expected {files} events file(s), found {paths}"
    for p in paths:
        check_records(p)


def scalars(tb_dir):
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    # A tag whose every point was purged as orphaned keeps an empty series: left out here.
    series = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return {tag: points for tag, points in series.items() if points}


def compare(got, expected):
    assert sorted(got) == sorted(expected), f"tags: got {sorted(got)}, expected {sorted(expected)}"
    for tag, points in expected.items():
        want = [(step, f32(value)) for step, value in points]
        assert got[tag] == want, f"{tag}: got {got[tag]}, expected {want}"


def check(tb_dir, expected_path, files):
    check_files(tb_dir, files)
    expected = {}
    for line in open(expected_path):
        tag, step, value = line.split()
        expected.setdefault(tag, []).append((int(step), float(value)))
    compare(scalars(tb_dir), expected)
    print(f"ok: {sum(len(v) for v in expected.values())} scalars in {len(expected)} tags")


def run(run_dir, files):
    tb_dir = os.path.join(run_dir, "tensorboard")
    check_files(tb_dir, files)
    recs = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in recs if "loss" in r]
    evals = [r for r in recs if "val_loss" in r]
    assert steps and evals, f"metrics.jsonl has {len(steps)} step and {len(evals)} eval records"
    expected = {}
    for tag, key in [
        ("train/loss", "loss"),
        ("train/lr", "lr"),
        ("train/grad_norm", "grad_norm"),
        ("train/tokens_per_s", "tokens_per_s"),
        ("train/mfu", "mfu"),
    ]:
        expected[tag] = [(r["step"], r[key]) for r in steps]
    for phase in ["data", "forward", "backward", "grad_sync", "optimizer", "checkpoint"]:
        expected[f"time/{phase}_ms"] = [(r["step"], r[f"t_{phase}_ms"]) for r in steps]
    expected["val/loss"] = [(r["step"], r["val_loss"]) for r in evals]
    expected["val/ppl"] = [(r["step"], r["val_ppl"]) for r in evals]
    got = scalars(tb_dir)
    kinds = ["parameters", "gradients", "optimizer", "activations", "communication"]
    memory = {f"memory/{k}_bytes" for k in kinds + ["total"]}
    assert memory <= set(got), f"memory tags missing: {sorted(memory - set(got))}"
    for tag in memory:
        assert [s for s, _ in got[tag]] == [r["step"] for r in steps], f"{tag}: steps {got[tag]}"
    params = got["memory/parameters_bytes"][-1][1]
    assert params > 0 and got["memory/total_bytes"][-1][1] >= params, "memory: parameters and total"
    compare({t: v for t, v in got.items() if t not in memory}, expected)
    print(f"ok: {len(steps)} logged steps and {len(evals)} evaluations match metrics.jsonl")


def main():
    try:
        if sys.argv[1] == "check":
            check(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        elif sys.argv[1] == "run":
            run(sys.argv[2], int(sys.argv[3]))
        else:
            sys.exit(__doc__)
    except AssertionError as e:
        sys.exit(f"tensorboard_oracle.py: {e}")


if __name__ == "__main__":
    main()
