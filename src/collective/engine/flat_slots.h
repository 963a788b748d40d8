// The layout of a rank's flat area (Note [flat slots], transport/link.h) as the flat all-reduce
// uses it (Note [flat all-reduce], algorithms/flat_all_reduce.cc).
//
// Note [flat lines]: the area holds two sets of kFlatSetBytes, the k-th flat all-reduce of a
// communicator in set k % 2. A set is an identity line (the call's count, kind, dtype, op and
// seq, read only to report a mismatch) and up to kFlatLines data lines of 64 bytes: 48 bytes of
// the rank's contribution and a 16-byte tag (FlatTag), stored after them: the call's exact
// identity and then its number k, 64 bits that never wrap, so neither a zeroed tag nor one of
// an earlier call ever reads as current. A reader waits for each line's own tag, so the lines
// of a message travel and are read in parallel instead of behind one flag (a flag line and then
// the data lines would be two cache-line transfers in a row: measured 0.61 us for 64 bytes
// against 0.34 us for 16 bytes on two ranks here), and a message of up to 48 bytes is one
// line. This is NCCL's LL128 protocol (120 bytes of data and a flag per 128-byte line) at the
// 64-byte line of a CPU; on x86 a line's stores become visible in program order, and in C++ the
// release store of k and the reader's acquire load order the data and the identity. Every field
// is an atomic word, so a peer that reads a set while its owner rewrites it (a runner looking for
// a mismatched call, Note [flat mismatch]) reads whole values.
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

/// What a rank publishes last of a line or a staging step: the call's identity
/// (flat_identity_word), then its number (release).
struct FlatTag {
  std::atomic<std::uint64_t> identity;
  std::atomic<std::uint64_t> k;  // 0: never published; calls are numbered from 1
};

/// One data line.
struct alignas(64) FlatLine {
  char data[kFlatLineData];
  FlatTag tag;
};
static_assert(sizeof(FlatLine) == kFlatLineBytes && sizeof(FlatIdentity) == kFlatLineBytes,
              "flat lines are cache lines");

/// The set of flat call `k` in `area`: its identity line, then kFlatLines data lines.
inline FlatIdentity* flat_identity(char* area, std::uint64_t k) {
  return reinterpret_cast<FlatIdentity*>(area + (k & 1u) * kFlatSetBytes);
}
inline const FlatIdentity* flat_identity(const char* area, std::uint64_t k) {
  return reinterpret_cast<const FlatIdentity*>(area + (k & 1u) * kFlatSetBytes);
}
inline FlatLine* flat_lines(char* area, std::uint64_t k) {
  return reinterpret_cast<FlatLine*>(area + (k & 1u) * kFlatSetBytes + kFlatLineBytes);
}
inline const FlatLine* flat_lines(const char* area, std::uint64_t k) {
  return reinterpret_cast<const FlatLine*>(area + (k & 1u) * kFlatSetBytes + kFlatLineBytes);
}

/// Data lines of a message of `bytes` (at least one: an empty call still publishes).
inline std::size_t flat_line_count(std::size_t bytes) {
  return bytes == 0 ? 1 : (bytes + kFlatLineData - 1) / kFlatLineData;
}

/// The identity word of a tag: count (32 bits), dtype, op and kind (8 bits each) and the seq's
/// low 8 bits, exact for every field a caller passes.
inline std::uint64_t flat_identity_word(const CollectiveCall& call) {
  return (call.count & 0xffffffffu) | static_cast<std::uint64_t>(call.dtype) << 32 |
         static_cast<std::uint64_t>(call.op) << 40 | static_cast<std::uint64_t>(call.kind) << 48 |
         (call.seq & 0xffu) << 56;
}

/// Stores `identity` and then k into `t`: release, or seq_cst when the caller rings doorbells
/// next (Note [doorbell]: the store must precede the loads of the sleepers).
inline void flat_publish(FlatTag& t, std::uint64_t identity, std::uint64_t k, bool last) {
  t.identity.store(identity, std::memory_order_relaxed);
  t.k.store(k, last ? std::memory_order_seq_cst : std::memory_order_release);
}

/// Note [flat staging]: the head page of a staging set: a tag when this rank's contribution is
/// in the set's data, a tag when its segment's result is, each on a line of its own (its
/// readers spin on one while the other is written), and the call's identity.
struct FlatStageHead {
  alignas(64) FlatTag contributed;
  alignas(64) FlatTag reduced;
  FlatIdentity identity;
};
static_assert(sizeof(FlatStageHead) <= kFlatStageHeadBytes, "staging head exceeds its page");

inline FlatStageHead* flat_stage_head(char* area, std::uint64_t k) {
  return reinterpret_cast<FlatStageHead*>(area + (k & 1u) * kFlatStageSetBytes);
}
inline const FlatStageHead* flat_stage_head(const char* area, std::uint64_t k) {
  return reinterpret_cast<const FlatStageHead*>(area + (k & 1u) * kFlatStageSetBytes);
}
inline char* flat_stage_data(char* area, std::uint64_t k) {
  return area + (k & 1u) * kFlatStageSetBytes + kFlatStageHeadBytes;
}
inline const char* flat_stage_data(const char* area, std::uint64_t k) {
  return area + (k & 1u) * kFlatStageSetBytes + kFlatStageHeadBytes;
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
