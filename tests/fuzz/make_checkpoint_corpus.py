#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_checkpoint (tests/fuzz/corpus/checkpoint): valid checkpoints
(format 2, examples/train/checkpoint.h) and one of each kind of damage the reader must refuse,
each prefixed with the mode byte of Note [checkpoint fuzz input] (tests/fuzz/fuzz_checkpoint.cc).
Rerun it after a format change: python3 tests/fuzz/make_checkpoint_corpus.py"""
import os
import struct
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "checkpoint")


def checkpoint(n=3, epochs=2, steps=5, seed=42, batch=64, version=2, header_bytes=80,
               global_step=None, payload_bytes=None, params=None):
    params = params if params is not None else [0.5 * i - 1.0 for i in range(2 * n)]
    payload = struct.pack("<%df" % len(params), *params)
    head = b"MWMSCKPT" + struct.pack(
        "<IIQQQQQQQ", version, header_bytes, epochs, steps,
        epochs * steps if global_step is None else global_step, n,
        8 * n if payload_bytes is None else payload_bytes, seed, batch)
    head += struct.pack("<I", zlib.crc32(payload))
    head += struct.pack("<I", zlib.crc32(head))
    return head + payload


def flip(data, offset, bit=0):
    b = bytearray(data)
    b[offset] ^= 1 << bit
    return bytes(b)


def two(first, second, mode=2):
    split = len(first)
    return bytes([mode, split & 0xFF, split >> 8]) + first + second


good = checkpoint()
seeds = {
    "valid_n3": b"\x00" + good,
    "valid_n1_fixcrc": b"\x01" + checkpoint(n=1, epochs=0, steps=0),
    "valid_mismatch_count": b"\x04" + good,
    "empty_file": b"\x00",
    "bad_magic": b"\x00" + b"MWMSCKPX" + good[8:],
    "truncated_header": b"\x00" + good[:40],
    "version_1": b"\x01" + checkpoint(version=1),
    "version_99": b"\x01" + checkpoint(version=99),
    "header_bytes_64": b"\x01" + checkpoint(header_bytes=64),
    "epochs_huge": b"\x01" + checkpoint(epochs=(1 << 32) + 1, steps=0),
    "global_step_inconsistent": b"\x01" + checkpoint(global_step=11),
    "count_2pow32": b"\x01" + checkpoint(n=1 << 32, params=[1.0, 2.0]),
    "payload_bytes_inconsistent": b"\x01" + checkpoint(payload_bytes=7),
    "batch_zero": b"\x01" + checkpoint(batch=0),
    "header_crc_flip": b"\x00" + flip(good, 56),
    "payload_crc_flip": b"\x00" + flip(good, 90, 3),
    "truncated_payload": b"\x01" + good[:-4],
    "overlong": b"\x01" + good + b"\x00" * 8,
    "dir_both_valid": two(checkpoint(epochs=3), good),
    "dir_newest_corrupt": two(flip(good, 100), checkpoint(epochs=1)),
    "dir_both_corrupt": two(flip(good, 100), flip(good, 20)),
    "dir_newest_missing": two(b"", good, mode=2 | 8),
    "dir_prev_missing": two(good, b"", mode=2 | 16),
    "dir_none": bytes([2 | 8 | 16, 0, 0]),
}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print("wrote %d seeds to %s" % (len(seeds), OUT))
