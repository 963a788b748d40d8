// The layout of a rank's flat area (Note [flat slots], transport/link.h) as the flat all-reduce
// uses it (Note [flat all-reduce], algorithms/flat_all_reduce.cc).
//
// Note [flat lines]: the area holds two sets of kFlatSetBytes, the k-th flat all-reduce of a
// communicator in set k % 2. A set is an identity line (the call's count, kind, dtype, op and
// seq, read only to report a mismatch) and up to kFlatLines data lines of 64 bytes: 56 bytes of
// the rank's contribution and an 8-byte tag, stored after them, holding k and the call's packed
// identity. A reader waits for each line's own tag, so the lines of a message travel and are
// read in parallel instead of behind one flag (a flag line and then the data lines would be two
// cache-line transfers in a row: measured 0.61 us for 64 bytes against 0.34 us for 16 bytes on
// two ranks here), and a message of up to 56 bytes is one line. This is NCCL's LL128 protocol
// (120 bytes of data and a flag per 128-byte line) at the 64-byte line of a CPU; on x86 a
// line's stores become visible in program order, and in C++ the tag's release and acquire order
// the data. Every field is an atomic word, so a peer that reads a set while its owner rewrites
// it (a runner looking for a mismatched call, Note [flat mismatch]) reads whole values.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "collective/algorithms/algorithm.h"
#include "collective/flat_layout.h"
#include "collective/frame.h"
#include "collective/plan.h"
#include "collective/transport/link.h"

namespace mwms::collective {

/// The identity line of a set.
struct alignas(64) FlatIdentity {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint32_t> count;
  std::atomic<std::uint32_t> kind_dtype_op;  // kind | dtype << 8 | op << 16
};

/// One data line.
struct alignas(64) FlatLine {
  char data[kFlatLineData];
  std::atomic<std::uint64_t> tag;  // k | flat_identity_bits(call) << 32
};
static_assert(sizeof(FlatLine) == kFlatLineBytes && sizeof(FlatIdentity) == kFlatLineBytes,
              "flat lines are cache lines");

/// The set of flat call `k` in `area`: its identity line, then kFlatLines data lines.
inline FlatIdentity* flat_identity(char* area, std::uint32_t k) {
  return reinterpret_cast<FlatIdentity*>(area + (k & 1u) * kFlatSetBytes);
}
inline const FlatIdentity* flat_identity(const char* area, std::uint32_t k) {
  return reinterpret_cast<const FlatIdentity*>(area + (k & 1u) * kFlatSetBytes);
}
inline FlatLine* flat_lines(char* area, std::uint32_t k) {
  return reinterpret_cast<FlatLine*>(area + (k & 1u) * kFlatSetBytes + kFlatLineBytes);
}
inline const FlatLine* flat_lines(const char* area, std::uint32_t k) {
  return reinterpret_cast<const FlatLine*>(area + (k & 1u) * kFlatSetBytes + kFlatLineBytes);
}

/// Data lines of a message of `bytes` (at least one: an empty call still publishes).
inline std::size_t flat_line_count(std::size_t bytes) {
  return bytes == 0 ? 1 : (bytes + kFlatLineData - 1) / kFlatLineData;
}

/// The upper half of every line's tag: count (13 bits), dtype, op and kind (3 bits each) and
/// the seq's low 10 bits, exact for every flat call (count <= kFlatPayloadBytes < 2^13).
inline std::uint32_t flat_identity_bits(const CollectiveCall& call) {
  static_assert(kFlatPayloadBytes < (1u << 13), "count must fit 13 bits");
  return static_cast<std::uint32_t>(call.count) |
         (static_cast<std::uint32_t>(call.dtype) & 7u) << 13 |
         (static_cast<std::uint32_t>(call.op) & 7u) << 16 |
         (static_cast<std::uint32_t>(call.kind) & 7u) << 19 |
         (static_cast<std::uint32_t>(call.seq) & 1023u) << 22;
}

/// Note [flat staging]: the head page of a staging set: a tag when this rank's contribution is
/// in the set's data, a tag when its segment's result is, each on a line of its own (its
/// readers spin on one while the other is written), and the call's identity.
struct FlatStageHead {
  alignas(64) std::atomic<std::uint64_t> contributed;
  alignas(64) std::atomic<std::uint64_t> reduced;
  FlatIdentity identity;
};
static_assert(sizeof(FlatStageHead) <= kFlatStageHeadBytes, "staging head exceeds its page");

inline FlatStageHead* flat_stage_head(char* area, std::uint32_t k) {
  return reinterpret_cast<FlatStageHead*>(area + (k & 1u) * kFlatStageSetBytes);
}
inline const FlatStageHead* flat_stage_head(const char* area, std::uint32_t k) {
  return reinterpret_cast<const FlatStageHead*>(area + (k & 1u) * kFlatStageSetBytes);
}
inline char* flat_stage_data(char* area, std::uint32_t k) {
  return area + (k & 1u) * kFlatStageSetBytes + kFlatStageHeadBytes;
}
inline const char* flat_stage_data(const char* area, std::uint32_t k) {
  return area + (k & 1u) * kFlatStageSetBytes + kFlatStageHeadBytes;
}

/// The upper half of a staging tag: count (20 bits: a staged call has at most 2^19 elements of
/// 2 bytes or more), dtype, op and kind (3 bits each) and the seq's low 3 bits.
inline std::uint32_t flat_stage_identity_bits(const CollectiveCall& call) {
  static_assert(kFlatStageBytes / 2 < (1u << 20), "count must fit 20 bits");
  return static_cast<std::uint32_t>(call.count) |
         (static_cast<std::uint32_t>(call.dtype) & 7u) << 20 |
         (static_cast<std::uint32_t>(call.op) & 7u) << 23 |
         (static_cast<std::uint32_t>(call.kind) & 7u) << 26 |
         (static_cast<std::uint32_t>(call.seq) & 7u) << 29;
}

/// The envelope a flat call is compared by (check_frame): kind, dtype, op, count and seq of the
/// call, algorithm flat, step 0, no payload.
inline FrameHeader flat_envelope(const CollectiveCall& call) {
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(call.kind);
  h.dtype = static_cast<std::uint8_t>(call.dtype);
  h.op = static_cast<std::uint8_t>(call.op);
  h.algorithm = static_cast<std::uint8_t>(AlgorithmId::kFlat);
  h.seq = call.seq;
  h.count = call.count;
  return h;
}

/// The envelope of the call a peer published in identity line `id` (read after a tag of it).
inline FrameHeader flat_envelope(const FlatIdentity& id) {
  FrameHeader e;
  const std::uint32_t kdo = id.kind_dtype_op.load(std::memory_order_relaxed);
  e.kind = static_cast<std::uint8_t>(kdo);
  e.dtype = static_cast<std::uint8_t>(kdo >> 8);
  e.op = static_cast<std::uint8_t>(kdo >> 16);
  e.algorithm = static_cast<std::uint8_t>(AlgorithmId::kFlat);
  e.seq = id.seq.load(std::memory_order_relaxed);
  e.count = id.count.load(std::memory_order_relaxed);
  return e;
}

}  // namespace mwms::collective
