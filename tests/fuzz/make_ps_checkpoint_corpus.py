#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_ps_checkpoint (tests/fuzz/corpus/ps_checkpoint): ps shard files
and checkpoint manifests as Note [ps checkpoint files] (src/strategy/ps/ps_checkpoint.h) lays
them out, encoded here independently of the C++ writer, and a few damaged ones, each prefixed
with the mode byte of Note [ps checkpoint fuzz input] (tests/fuzz/fuzz_ps_checkpoint.cc: 1 =
recompute the CRCs). Read without that byte, the files named valid_* must be accepted and every
other one refused: tests/unit/strategy/ps_checkpoint_test.cc checks both, and compares two valid
ones with what the C++ writer makes, so this script is also a second reading of the byte layout.
Rerun it after a format change: python3 tests/fuzz/make_ps_checkpoint_corpus.py"""
import os
import struct
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "ps_checkpoint")
SLOTS = {0: 0, 1: 1, 2: 2}  # OptimizerKind -> num_slots: sgd, momentum, adam


def shard_file(shards, optimizer=0, ps_index=0, num_ps=2, step=100, version=37, reserved=0,
               payload_bytes=None, name_bytes=None, floats=None):
    """shards: (name, variable, shard, element_offset, count) tuples; floats: the values and
    slots, by default as many as the counts call for."""
    records = b""
    for name, variable, shard, offset, count in shards:
        n = len(name) if name_bytes is None else name_bytes
        records += struct.pack("<IIQQI", variable, shard, offset, count, n) + name.encode()
    total = sum(s[4] for s in shards)
    if floats is None:
        floats = [0.25 * i - 3.0 for i in range(total * (1 + SLOTS.get(optimizer, 0)))]
    payload = records + struct.pack("<%df" % len(floats), *floats)
    head = b"MWMSPSSH" + struct.pack("<IIIIQQIB3sQ", 1, 64, ps_index, num_ps, step, version,
                                     len(shards), optimizer, bytes([reserved, 0, 0]),
                                     len(payload) if payload_bytes is None else payload_bytes)
    head += struct.pack("<I", zlib.crc32(payload))
    head += struct.pack("<I", zlib.crc32(head))
    return head + payload


def manifest(entries, user_state=b"", step=100, num_ps=None):
    payload = b"".join(struct.pack("<QQI", *e) for e in entries) + user_state
    head = b"MWMSPSMF" + struct.pack("<IIQIIQ", 1, 48, step,
                                     len(entries) if num_ps is None else num_ps,
                                     len(user_state), len(payload))
    head += struct.pack("<I", zlib.crc32(payload))
    head += struct.pack("<I", zlib.crc32(head))
    return head + payload


def flip(data, offset, bit=0):
    b = bytearray(data)
    b[offset] ^= 1 << bit
    return bytes(b)


mlp = [("dense/kernel", 0, 0, 0, 6), ("dense/bias", 1, 0, 0, 3)]
seeds = {
    "valid_shard_sgd": shard_file(mlp),
    "valid_shard_momentum": shard_file(mlp + [("empty", 2, 0, 0, 0)], optimizer=1, ps_index=1),
    "valid_shard_adam": shard_file([("emb/part_1", 0, 1, 40, 5)], optimizer=2, num_ps=1),
    "valid_shard_no_shards": shard_file([], num_ps=1, version=0),
    "valid_manifest": manifest([(37, 160, 0x12345678), (37, 172, 0x9abcdef0)], b"epoch=3\x00pos=17"),
    "valid_manifest_one_ps": manifest([(0, 64, 0)], step=0),
    "shard_payload_crc_flip": flip(shard_file(mlp), 70, 3),
    "shard_header_crc_flip": flip(shard_file(mlp), 30),
    "shard_truncated": shard_file(mlp)[:-4],
    "shard_overlong": shard_file(mlp) + b"\x00" * 4,
    "shard_unknown_optimizer": shard_file(mlp, optimizer=3),
    "shard_ps_index_too_big": shard_file(mlp, ps_index=2, num_ps=2),
    "shard_reserved_set": shard_file(mlp, reserved=1),
    "shard_name_too_long": shard_file(mlp, name_bytes=5000),
    "shard_count_2pow32": shard_file([("x", 0, 0, 0, 1 << 32)], floats=[1.0, 2.0]),
    "manifest_num_ps_zero": manifest([], num_ps=0),
    "manifest_entries_short": manifest([(1, 64, 0)], num_ps=2),
    "manifest_payload_crc_flip": flip(manifest([(37, 160, 1)], b"state"), 60),
    "empty": b"",
}
# Mode 1 (the CRCs recomputed) where the CRCs are right anyway: mutations of these get past them.
FIX_CRC = {"valid_shard_sgd", "valid_shard_momentum", "valid_manifest", "shard_unknown_optimizer",
           "shard_name_too_long", "shard_count_2pow32", "manifest_entries_short"}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([1 if name in FIX_CRC else 0]) + data)
print("wrote %d seeds to %s" % (len(seeds), OUT))
