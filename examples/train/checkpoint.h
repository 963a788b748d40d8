/// @file checkpoint.h
/// Training checkpoints: one file `<dir>/ckpt.bin` holding a small header, the parameters and the
/// momentum buffers, written atomically (temporary file in the same directory, fsync, rename), so
/// a crash leaves either the previous checkpoint or the new one, never a torn file.
///
/// Layout (all integers little-endian; floats IEEE-754 binary32, little-endian):
///   offset  0  char[8]  magic "MWMSCKPT"
///           8  u32      format version (1)
///          12  u32      header size in bytes (64)
///          16  i64      epochs completed
///          24  u64      parameter count n
///          32  u64      seed of the run
///          40  u64      global batch size of the run
///          48  u64      FNV-1a 64 of the payload bytes
///          56  u64      reserved (0)
///          64  f32[n]   parameters, then f32[n] momentum buffers
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mwms::train {

/// Everything needed to continue a run where it stopped.
struct Checkpoint {
  std::int64_t epochs_completed = 0;
  std::uint64_t seed = 0;
  std::uint64_t global_batch_size = 0;
  std::vector<float> params;
  std::vector<float> velocity;  ///< momentum buffers, same layout as params
};

/// `<dir>/ckpt.bin`.
std::string checkpoint_path(const std::string& dir);

/// Writes `ckpt` atomically to checkpoint_path(dir), creating `dir` if needed.
/// @throws std::runtime_error naming the file and the system error.
void save_checkpoint(const std::string& dir, const Checkpoint& ckpt);

/// Reads checkpoint_path(dir); std::nullopt when the file does not exist. Validates magic,
/// version, parameter count (must be `expected_params`), file size and checksum.
/// @throws std::runtime_error naming the file and what is wrong with it.
std::optional<Checkpoint> load_checkpoint(const std::string& dir, std::size_t expected_params);

}  // namespace mwms::train
