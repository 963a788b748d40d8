// Checkpoints of a parameter-server job (issue 16, item 5; docs/parameter_server.md,
// "Checkpoints"): every ps writes the shards it holds to its own shard file, the chief writes a
// manifest naming every shard file once all of them are written. A checkpoint exists when its
// manifest does: a crash while writing leaves the previous checkpoint the newest usable one.
//
// Note [ps checkpoint files]: in a checkpoint directory D, the checkpoint of global step S is
//   D/model.ckpt-S.ps-I-of-N   the shards of ps I (of N ps tasks), written by ps I
//   D/model.ckpt-S.manifest    written by the chief after every ps answered
// (TF's Saver(sharded=True) writes model.ckpt-S.data-I-of-N and model.ckpt-S.index the same way).
// Both files are written atomically and durably (a temporary file in D, written, fsync'ed,
// renamed into place, then D fsync'ed) and checked on reading as train's checkpoint is: a magic,
// a format version, every header field range-checked, a CRC32 (zlib) of the header and one of
// the payload, the file's size equal to what the header states. All integers little-endian,
// floats IEEE-754 binary32 little-endian.
//
// Shard file, format version 1:
//   offset  0  char[8]  magic "MWMSPSSH"
//           8  u32      format version (1)
//          12  u32      header bytes (64)
//          16  u32      ps index I, < num_ps
//          20  u32      num_ps N, in [1, 65536]
//          24  u64      checkpoint step S (the chief's global step: the file name's)
//          32  u64      version: updates this ps applied (its global step; Adam's t)
//          40  u32      shard count K, in [0, 2^20]
//          44  u8       optimizer (OptimizerKind); u8[3] zero
//          48  u64      payload bytes
//          56  u32      CRC32 of the payload
//          60  u32      CRC32 of header bytes [0, 60)
//          64  payload: K shard records (u32 variable, u32 shard, u64 element_offset, u64 count,
//                       u32 name bytes (<= 1024), the name), then f32[total] values, then
//                       num_slots(optimizer) x f32[total] slots, where total = the sum of the
//                       counts, in ps_layout order (Note [ps segments] in ps_protocol.h)
//
// Manifest, format version 1:
//   offset  0  char[8]  magic "MWMSPSMF"
//           8  u32      format version (1)
//          12  u32      header bytes (48)
//          16  u64      checkpoint step S
//          24  u32      num_ps N, in [1, 65536]
//          28  u32      user state bytes U, at most kMaxUserStateBytes
//          32  u64      payload bytes
//          40  u32      CRC32 of the payload
//          44  u32      CRC32 of header bytes [0, 44)
//          48  payload: N entries (u64 version, u64 file bytes, u32 file CRC32 of the whole
//                       shard file), then U bytes of user state (opaque to the library: what
//                       the session stores beside the variables, e.g. the input position)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mwms/errors.h"
#include "strategy/ps/ps_protocol.h"

namespace mwms::strategy::ps {

inline constexpr std::uint32_t kShardFileVersion = 1;
inline constexpr std::uint32_t kManifestVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 64;
inline constexpr std::size_t kManifestHeaderBytes = 48;
inline constexpr std::uint32_t kMaxCheckpointPs = 65536;
inline constexpr std::uint32_t kMaxCheckpointShards = 1u << 20;
inline constexpr std::size_t kMaxUserStateBytes = std::size_t{1} << 20;

/// What one ps holds at one moment: its shards' descriptions, values and optimizer slots.
/// Borrowed pointers: encoding reads them, nothing is copied into a temporary.
struct ShardFileView {
  std::uint32_t ps_index = 0;
  std::uint32_t num_ps = 1;
  std::uint64_t checkpoint_step = 0;
  std::uint64_t version = 0;
  std::uint8_t optimizer = 0;                    // OptimizerKind
  const std::vector<ShardDescription>* shards = nullptr;
  const float* values = nullptr;                 // total floats
  std::vector<const float*> slots;               // num_slots(optimizer) pointers, total floats each
  std::size_t total = 0;                         // sum of the shards' counts
};

/// A shard file as read back.
struct ShardFile {
  std::uint32_t ps_index = 0;
  std::uint32_t num_ps = 1;
  std::uint64_t checkpoint_step = 0;
  std::uint64_t version = 0;
  std::uint8_t optimizer = 0;
  std::vector<ShardDescription> shards;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

/// One ps's entry in a manifest.
struct ManifestEntry {
  std::uint64_t version = 0;     // as in its shard file
  std::uint64_t file_bytes = 0;  // the shard file's size
  std::uint32_t file_crc32 = 0;  // CRC32 of the whole shard file
};

struct Manifest {
  std::uint64_t checkpoint_step = 0;
  std::vector<ManifestEntry> entries;  // by ps index; size num_ps
  std::string user_state;              // at most kMaxUserStateBytes
};

/// `<dir>/model.ckpt-<step>.ps-<ps_index>-of-<num_ps>` and `<dir>/model.ckpt-<step>.manifest`.
std::string shard_file_path(const std::string& dir, std::uint64_t step, std::uint32_t ps_index,
                            std::uint32_t num_ps);
std::string manifest_path(const std::string& dir, std::uint64_t step);

/// Writes `view` to shard_file_path(dir, ...) atomically and durably (Note [ps checkpoint
/// files]), creating `dir` (one level) if needed; the payload is written straight from the
/// view's buffers (no copy of the values). Returns the entry the manifest records. Blocking
/// (file I/O). @throws CheckpointError naming the file and the system error (ENOSPC, EACCES, ...)
/// or an out-of-range field (nothing is left behind but what was there before).
ManifestEntry write_shard_file(const std::string& dir, const ShardFileView& view);

/// Reads and verifies the shard file at `path` (every field, both checksums, the size, and
/// each shard record: names at most 1024 bytes, counts summing to the payload's floats, the
/// slots num_slots(optimizer) allows). When `expected` is given, also checks the file's size and
/// CRC32 against it. Bounded: allocates at most what the file's verified header and size allow.
/// @throws CheckpointError naming `path` and the field at fault (only CheckpointError, or
///   std::bad_alloc).
ShardFile read_shard_file(const std::string& path, const ManifestEntry* expected = nullptr);
/// As read_shard_file, from bytes already in memory (the fuzz target's entry point).
ShardFile decode_shard_file(const char* data, std::size_t bytes, const std::string& path);

/// Writes `manifest` to manifest_path(dir, manifest.checkpoint_step), atomically and durably.
/// @throws CheckpointError as write_shard_file.
void write_manifest(const std::string& dir, const Manifest& manifest);
/// Reads and verifies a manifest. @throws CheckpointError naming `path` (only CheckpointError, or
///   std::bad_alloc).
Manifest read_manifest(const std::string& path);
Manifest decode_manifest(const char* data, std::size_t bytes, const std::string& path);

/// The steps of every `model.ckpt-<step>.manifest` in `dir`, newest (largest step) first;
/// empty when `dir` does not exist or holds none. Only the names are looked at (a damaged
/// manifest is listed; reading it throws). @throws CheckpointError when `dir` exists but cannot
/// be read.
std::vector<std::uint64_t> list_checkpoints(const std::string& dir);

/// Removes every checkpoint of `dir` (its manifest first, then its shard files) except the
/// `keep` newest (TF's Saver max_to_keep), and shard files of steps that have no manifest and are
/// older than the newest kept one (left by a crash). Never throws: a file that cannot be removed
/// is logged at warn.
void remove_old_checkpoints(const std::string& dir, std::size_t keep);

}  // namespace mwms::strategy::ps
