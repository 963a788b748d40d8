// libFuzzer target: a parameter-server checkpoint file as it comes back from disk, damaged or
// written by something else (strategy/ps/ps_checkpoint.h, Note [ps checkpoint files]). Every
// input goes to both decoders, a ps shard file's and a manifest's (the magic tells them apart).
// The decoders are total: they accept, or throw CheckpointError; nothing else escapes, and what
// they accept accounts for every input byte and stays within the published bounds.
//
// Note [ps checkpoint fuzz input]: byte 0 is a mode, the rest the file. With mode bit 0 set,
// both CRC32s are recomputed first (for each decoder at its own format's offsets), so that
// mutations reach the fields and records behind the checksums instead of stopping at them.
// tests/fuzz/make_ps_checkpoint_corpus.py writes the seeds with that byte.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "mwms/optimizer.h"
#include "strategy/ps/ps_checkpoint.h"

namespace {

namespace ps = mwms::strategy::ps;

void put_crc(std::string& s, std::size_t at, std::size_t from, std::size_t to) {
  const auto crc = static_cast<std::uint32_t>(
      ::crc32(0, reinterpret_cast<const Bytef*>(s.data()) + from, static_cast<uInt>(to - from)));
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(crc >> (8 * i));
}

// The payload CRC sits 8 bytes before the header's end, the header CRC 4 bytes before it.
std::string with_crcs(const char* data, std::size_t size, std::size_t header_bytes) {
  std::string s(data, size);
  if (size < header_bytes) return s;
  put_crc(s, header_bytes - 8, header_bytes, size);
  put_crc(s, header_bytes - 4, 0, header_bytes - 4);
  return s;
}

void shard_file(const char* data, std::size_t size) {
  try {
    const ps::ShardFile f = ps::decode_shard_file(data, size, "fuzz");
    if (f.num_ps < 1 || f.num_ps > ps::kMaxCheckpointPs || f.ps_index >= f.num_ps) __builtin_trap();
    if (f.shards.size() > ps::kMaxCheckpointShards) __builtin_trap();
    const auto slots = mwms::num_slots(static_cast<mwms::OptimizerKind>(f.optimizer));
    if (f.slots.size() != static_cast<std::size_t>(slots)) __builtin_trap();
    std::size_t bytes = ps::kShardHeaderBytes, total = 0;
    for (const ps::ShardDescription& s : f.shards) {
      if (s.name.size() > 1024) __builtin_trap();
      bytes += 28 + s.name.size();
      total += s.count;
    }
    if (f.values.size() != total) __builtin_trap();
    for (const std::vector<float>& slot : f.slots) {
      if (slot.size() != total) __builtin_trap();
    }
    if (bytes + total * sizeof(float) * (1 + f.slots.size()) != size) __builtin_trap();
  } catch (const mwms::CheckpointError&) {
  }
}

void manifest(const char* data, std::size_t size) {
  try {
    const ps::Manifest m = ps::decode_manifest(data, size, "fuzz");
    if (m.entries.empty() || m.entries.size() > ps::kMaxCheckpointPs) __builtin_trap();
    if (m.user_state.size() > ps::kMaxUserStateBytes) __builtin_trap();
    if (ps::kManifestHeaderBytes + 20 * m.entries.size() + m.user_state.size() != size) {
      __builtin_trap();
    }
  } catch (const mwms::CheckpointError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* file = reinterpret_cast<const char*>(data) + 1;
  const std::size_t bytes = size - 1;
  if ((data[0] & 1) == 0) {
    shard_file(file, bytes);
    manifest(file, bytes);
    return 0;
  }
  const std::string shard = with_crcs(file, bytes, ps::kShardHeaderBytes);
  shard_file(shard.data(), shard.size());
  const std::string mf = with_crcs(file, bytes, ps::kManifestHeaderBytes);
  manifest(mf.data(), mf.size());
  return 0;
}
