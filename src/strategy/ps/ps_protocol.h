// The parameter-server protocol (DESIGN "Parameter servers"): requests and replies between a
// worker and one ps over the job's links (collective/engine/message_channel.h).
//
// Note [ps messages]: every request or reply starts with an announcing envelope without payload
// (a FrameHeader whose kind is one of PsKind); what follows has sizes both sides already know or
// that the announcement states (count = bytes of a description that follows, bounded by
// kMaxDescriptionBytes before anything is received):
//   init      chief -> ps   kInit(count = n) + description(n) + the shards' values (segments)
//   join      worker -> ps  kJoin(count = n) + description(n)            -> kReady or kRefused
//   push      worker -> ps  kPush(seq = version pulled) + gradients (segments)  -> kValues
//   pull      worker -> ps  kPull                                               -> kValues
//   goodbye   worker -> ps  kBye(count = 1 from the chief: the job ends)
//   kValues   ps -> worker  kValues(seq = version, count = PsStatus) + values (segments)
//   kSharedValues ps -> worker  kSharedValues(seq = version, count = PsStatus): instead of
//                           kValues when the worker maps the ps's values (Note [ps shared
//                           values] in ps_shared_values.h); it copies them from there, then
//   copied    worker -> ps  kCopied(seq = version): that copy is done (before any other request)
//   kReady    ps -> worker  kReady(seq = version, count = n) + the shared values' address(n),
//                           n = 0 (nothing follows) when the worker receives kValues
//   kRefused  ps -> worker  kRefused(count = n) + reason text(n)
//   save      chief -> ps   kSave(seq = checkpoint step, count = n) + directory(n)
//                                                                -> kSaved or kFailed
//   restore   chief -> ps   kRestore(seq = checkpoint step, count = n) + restore request(n)
//                           (encode_restore: description, the manifest's entry, directory)
//                                                                -> kReady or kFailed
//   kSaved    ps -> chief   kSaved(seq = version, count = kSavedBytes) + encode_saved(...)
//   kFailed   ps -> chief   kFailed(count = n) + reason text(n): that request failed (a file
//                           could not be written or read), nothing else did
// Note [ps checkpoint files] in ps_checkpoint.h says what save and restore write and read.
// Note [ps segments]: the shards one ps holds travel as segments, in an order both sides compute
// from the description alone (ps_layout): first one pack of every small shard (below
// kSmallShardBytes), back to back, then each large shard alone. The worker copies small shards
// into and out of its pack (one message instead of dozens), and sends and receives large shards
// straight from and into the caller's buffers; the ps keeps its shards in that same order, so
// every segment lands where it stays, without a copy. Each segment's envelope (kData: root =
// segment index, seq = the request's version, count = elements, dtype float32) is checked against
// what the layout expects: a worker with another layout is refused, not trusted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collective/frame.h"
#include "mwms/errors.h"

namespace mwms::strategy::ps {

enum class PsKind : std::uint8_t {
  kInit = 0x40,
  kJoin = 0x41,
  kReady = 0x42,
  kPush = 0x43,
  kPull = 0x44,
  kValues = 0x45,
  kData = 0x46,
  kBye = 0x47,
  kRefused = 0x48,
  kSave = 0x49,
  kSaved = 0x4A,
  kRestore = 0x4B,
  kFailed = 0x4C,
  kSharedValues = 0x4D,
  kCopied = 0x4E,
};
const char* kind_name(PsKind kind) noexcept;
bool is_ps_kind(std::uint8_t kind) noexcept;

/// kValues' count.
enum class PsStatus : std::uint64_t { kApplied = 0, kDropped = 1, kEnded = 2 };

inline constexpr std::size_t kSmallShardBytes = std::size_t{64} << 10;
inline constexpr std::size_t kMaxDescriptionBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxReasonBytes = 4096;
inline constexpr std::uint32_t kDescriptionMagic = 0x53504D4D;  // "MMPS"
inline constexpr std::uint16_t kDescriptionVersion = 1;
inline constexpr std::size_t kMaxDirectoryBytes = 4096;
inline constexpr std::size_t kSavedBytes = 20;
inline constexpr std::size_t kMaxRestoreBytes = kMaxDescriptionBytes + kMaxDirectoryBytes + 64;

/// One shard as the ps needs to know it.
struct ShardDescription {
  std::string name;         // "dense/kernel" or "dense/kernel/part_1"
  std::uint32_t variable = 0;
  std::uint32_t shard = 0;
  std::uint64_t element_offset = 0;  // in the full variable
  std::uint64_t count = 0;
  bool operator==(const ShardDescription& o) const {
    return name == o.name && variable == o.variable && shard == o.shard &&
           element_offset == o.element_offset && count == o.count;
  }
};

/// What a worker tells one ps at init or join: the options every task must share and the
/// shards this ps holds, in placement order.
struct JobDescription {
  std::uint8_t sync_replicas = 0;
  std::int32_t replicas_to_aggregate = 0;  // resolved (never 0)
  std::int32_t total_num_replicas = 0;     // resolved
  std::int32_t max_staleness = -1;
  std::uint8_t optimizer = 0;              // OptimizerKind
  double learning_rate = 0;
  double momentum = 0;
  std::uint8_t use_nesterov = 0;
  double beta1 = 0, beta2 = 0, epsilon = 0;
  std::int32_t num_workers = 0;
  std::int32_t num_ps = 0;
  std::vector<ShardDescription> shards;
};

/// Little-endian encoding: magic, version, the fields, the shards (names at most 1024 bytes).
std::string encode(const JobDescription& d);
/// Bounded total decoder of encode()'s output: every length is checked against what is left;
/// at most kMaxDescriptionBytes in, 2^20 shards, names of at most 1024 bytes, counts below 2^40.
/// @throws PeerError naming `ctx`'s peer and what is wrong (never another exception type but
///   std::bad_alloc).
JobDescription decode(const char* data, std::size_t bytes, const ErrorContext& ctx);
/// The first field in which `worker` differs from `chief` ("optimizer: adam vs sgd",
/// "shard 3 name: a vs b"), empty when they agree.
std::string first_difference(const JobDescription& chief, const JobDescription& worker);

/// What a ps reports of the shard file it wrote (kSaved), and what the chief's restore request
/// expects of it (the manifest's entry).
struct ShardFileStamp {
  std::uint64_t version = 0;
  std::uint64_t file_bytes = 0;
  std::uint32_t file_crc32 = 0;
};
std::string encode_saved(const ShardFileStamp& stamp);  // kSavedBytes
/// @throws PeerError naming ctx's peer unless `bytes` == kSavedBytes.
ShardFileStamp decode_saved(const char* data, std::size_t bytes, const ErrorContext& ctx);

struct RestoreRequest {
  std::string description;  // encode(JobDescription)
  ShardFileStamp expected;  // the manifest's entry for this ps
  std::string directory;    // at most kMaxDirectoryBytes
};
std::string encode_restore(const RestoreRequest& r);
/// Bounded total decoder of encode_restore's output (the description is not decoded here).
/// @throws PeerError naming ctx's peer.
RestoreRequest decode_restore(const char* data, std::size_t bytes, const ErrorContext& ctx);

/// Note [ps segments]: where each shard of one ps lives in the ps's flat buffer and in which
/// segment it travels.
struct Segment {
  std::size_t first_shard = 0;   // into JobDescription::shards
  std::size_t last_shard = 0;    // one past
  std::size_t element_offset = 0;  // in the ps's flat buffer
  std::size_t count = 0;           // elements
  bool pack = false;               // the small shards, copied through a pack buffer
};
struct Layout {
  std::vector<Segment> segments;
  std::vector<std::size_t> shard_offset;  // by shard: element offset in the ps's flat buffer
  std::size_t total = 0;                  // elements
};
/// The layout of `shards` (Note [ps segments]). Pure: every side computes the same.
Layout ps_layout(const std::vector<ShardDescription>& shards);

/// The announcing envelope of `kind`.
collective::FrameHeader envelope(PsKind kind, std::uint64_t seq = 0, std::uint64_t count = 0,
                                 std::int32_t root = -1);
/// The envelope of segment `index` of `layout` for a request of version `seq`.
collective::FrameHeader segment_header(const Layout& layout, std::size_t index,
                                       std::uint64_t seq);
/// Checks a received segment envelope against segment_header(layout, index, seq), and an
/// announcing one against `want`. @throws CollectiveMismatchError / PeerError naming ctx's peer.
void check_segment(const collective::FrameHeader& got, const Layout& layout, std::size_t index,
                   std::uint64_t seq, const ErrorContext& ctx);

}  // namespace mwms::strategy::ps
