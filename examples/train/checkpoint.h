/// @file checkpoint.h
/// Training checkpoints: `<dir>/ckpt.bin` (the newest) and `<dir>/ckpt.prev.bin` (the one before
/// it), each a small header, the parameters and the momentum buffers. Every header field is
/// range-checked on load and two CRC32s (zlib) cover the header and the payload, so a flipped bit
/// anywhere is reported, never trained on; an unusable newest file falls back to the previous one
/// (Note [checkpoint rotation] in checkpoint.cc).
///
/// Layout, format version 2 (all integers little-endian; floats IEEE-754 binary32, little-endian):
///   offset  0  char[8]  magic "MWMSCKPT"
///           8  u32      format version (2)
///          12  u32      header size in bytes (80)
///          16  u64      epochs completed, in [0, kMaxCheckpointEpochs]
///          24  u64      steps per epoch, in [0, kMaxCheckpointSteps]
///          32  u64      global step = epochs completed x steps per epoch
///          40  u64      parameter count n, in [1, kMaxCheckpointParams], = the model's count
///          48  u64      payload bytes = 8 n; header size + payload bytes = the file's size
///          56  u64      seed of the run
///          64  u64      global batch size of the run, in [1, kMaxCheckpointBatch]
///          72  u32      CRC32 of the payload
///          76  u32      CRC32 of header bytes [0, 76) (which include the payload's CRC)
///          80  f32[n]   parameters, then f32[n] momentum buffers
/// Version 1 (a 64-byte header whose checksum covered the payload only) is refused with a
/// CheckpointFormatError that says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mwms/errors.h"

namespace mwms::train {

constexpr std::uint32_t kCheckpointVersion = 2;
constexpr std::size_t kCheckpointHeaderBytes = 80;
constexpr std::uint64_t kMaxCheckpointEpochs = 1000000;
constexpr std::uint64_t kMaxCheckpointSteps = 1ull << 31;
constexpr std::uint64_t kMaxCheckpointParams = 1ull << 32;
constexpr std::uint64_t kMaxCheckpointBatch = 1ull << 31;

/// Everything needed to continue a run where it stopped.
struct Checkpoint {
  std::int64_t epochs_completed = 0;  ///< in [0, kMaxCheckpointEpochs]
  std::uint64_t steps_per_epoch = 0;  ///< global batches per epoch of the run that wrote it
  std::uint64_t seed = 0;
  std::uint64_t global_batch_size = 0;
  std::vector<float> params;
  std::vector<float> velocity;  ///< momentum buffers, same layout as params
};

/// A checkpoint file that cannot be written or used. what() names the file and, where one field
/// is at fault, the field ("field epochs_completed (offset 16) is 4294967297, outside [0,
/// 1000000]"). path() and field() give them to programs.
class CheckpointError : public Error {
 public:
  CheckpointError(const std::string& path, const std::string& field, const std::string& what);
  /// The file concerned.
  const std::string& path() const noexcept { return path_; }
  /// The header field at fault ("epochs_completed", "header_crc32", ...), empty when none is.
  const std::string& field() const noexcept { return field_; }
  /// What is wrong, without the "checkpoint <path>: " prefix.
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::string path_;
  std::string field_;
  std::string detail_;
};

/// Not a checkpoint (magic), or a format version this program does not read (e.g. version 1).
class CheckpointFormatError : public CheckpointError { using CheckpointError::CheckpointError; };
/// Damaged: a checksum mismatch, a field out of range or inconsistent, a truncated or overlong
/// file.
class CheckpointCorruptError : public CheckpointError { using CheckpointError::CheckpointError; };
/// Intact, but written for another model or run (parameter count, seed).
class CheckpointMismatchError : public CheckpointError { using CheckpointError::CheckpointError; };
/// A system call on the file failed (open, read, write, fsync, rename); native_code() is errno.
class CheckpointIoError : public CheckpointError {
 public:
  /// `what` already holds the system error's text.
  CheckpointIoError(const std::string& path, const std::string& what, int native_code);
  int native_code() const noexcept { return native_code_; }

 private:
  int native_code_;
};

/// `<dir>/ckpt.bin`: the newest checkpoint.
std::string checkpoint_path(const std::string& dir);
/// `<dir>/ckpt.prev.bin`: the checkpoint before the newest.
std::string previous_checkpoint_path(const std::string& dir);

/// Writes `ckpt` as the newest checkpoint of `dir` (created if needed), keeping the current
/// newest as the previous one when it verifies (a damaged newest is replaced and not kept, so a
/// good previous checkpoint survives). Atomic and durable: a temporary file in `dir`, written,
/// fsync'ed, renamed into place, then `dir` fsync'ed; a crash at any point leaves a usable newest
/// or previous checkpoint (Note [checkpoint rotation]). Blocking (file I/O). Returns a warning to
/// show the user, empty when there is none. @throws CheckpointError (a field of `ckpt` outside the
/// format's range, e.g. 4294967297 epochs, or params and velocity of different sizes: nothing is
/// written), CheckpointIoError (naming the file and the system error).
std::string save_checkpoint(const std::string& dir, const Checkpoint& ckpt);

/// Removes the temporaries that checkpoint writers of this host left in `dir` when they died
/// before renaming them (Note [checkpoint temporaries] in checkpoint.cc); never one whose writer
/// is alive or on another host. save_checkpoint() calls it first. Returns what it removed (or
/// could not), empty when nothing; never throws for a file it cannot read or remove.
std::string remove_stale_temporaries(const std::string& dir);

/// What load_checkpoint found.
struct LoadedCheckpoint {
  Checkpoint checkpoint;
  std::string path;     ///< the file it came from (the newest, or the previous after a fallback)
  std::string warning;  ///< non-empty after a fallback: why the newest was not used
};

/// Reads and verifies one checkpoint file (every field, both checksums, the size) for a model of
/// `expected_params` parameters. @throws CheckpointFormatError, CheckpointCorruptError,
/// CheckpointMismatchError, CheckpointIoError (ENOENT included), each naming `path`.
Checkpoint read_checkpoint_file(const std::string& path, std::size_t expected_params);

/// The newest usable checkpoint of `dir`: checkpoint_path(dir), or, when that is missing or
/// unusable, previous_checkpoint_path(dir) with `warning` saying why. std::nullopt when neither
/// file exists. @throws the newest file's CheckpointError when neither file is usable (the
/// message also says what was wrong with the previous one).
std::optional<LoadedCheckpoint> load_checkpoint(const std::string& dir,
                                                std::size_t expected_params);

}  // namespace mwms::train
