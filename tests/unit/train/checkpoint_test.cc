// The train example's checkpoints (examples/train/checkpoint.h, issue 7): every damaged byte is
// detected, a damaged newest file falls back to the previous one, an old-format file is refused
// clearly. Files are real: written by save_checkpoint, damaged here, read back.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint.h"

namespace {

using Catch::Matchers::Contains;
using mwms::train::Checkpoint;
using mwms::train::CheckpointCorruptError;
using mwms::train::CheckpointError;
using mwms::train::CheckpointFormatError;
using mwms::train::CheckpointMismatchError;

constexpr std::size_t kParams = 1000;
constexpr std::size_t kHeader = mwms::train::kCheckpointHeaderBytes;

std::string temp_dir() {
  char pattern[] = "/tmp/mwms-ckpt-test-XXXXXX";
  const char* dir = ::mkdtemp(pattern);
  REQUIRE(dir != nullptr);
  return dir;
}

Checkpoint sample(std::int64_t epochs) {
  Checkpoint c;
  c.epochs_completed = epochs;
  c.steps_per_epoch = 10;
  c.seed = 42;
  c.global_batch_size = 64;
  for (std::size_t i = 0; i < kParams; ++i) {
    c.params.push_back(static_cast<float>(i) * 0.5f + static_cast<float>(epochs));
    c.velocity.push_back(-static_cast<float>(i) * 0.25f);
  }
  return c;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// What read_checkpoint_file(path, params) throws as an E; fails the case when it accepts the
// file (another exception type propagates and fails it too).
template <typename E>
E refusal(const std::string& path, std::size_t params = kParams) {
  try {
    mwms::train::read_checkpoint_file(path, params);
  } catch (const E& e) {
    return e;
  }
  FAIL("accepted " << path);
  throw std::logic_error("unreachable");  // FAIL throws
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void put_u64(std::vector<unsigned char>& b, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u32(std::vector<unsigned char>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}
// The header CRC as checkpoint.h documents it: CRC32 of bytes [0, 76), stored at 76.
void reseal_header(std::vector<unsigned char>& b) {
  put_u32(b, 76, static_cast<std::uint32_t>(::crc32(0, b.data(), 76)));
}

// Expects the file at `path` to be refused, naming it.
void expect_refused(const std::string& path, const std::string& what_for) {
  INFO(what_for);
  try {
    mwms::train::read_checkpoint_file(path, kParams);
    FAIL("accepted a damaged checkpoint");
  } catch (const CheckpointError& e) {
    CHECK_THAT(std::string(e.what()), Contains(path));
    CHECK(e.path() == path);
  }
}

}  // namespace

TEST_CASE("a checkpoint round-trips with every field", "[unit][checkpoint]") {
  const std::string dir = temp_dir() + "/a/b";  // created on demand
  CHECK(mwms::train::save_checkpoint(dir, sample(3)).empty());
  auto loaded = mwms::train::load_checkpoint(dir, kParams);
  REQUIRE(loaded);
  CHECK(loaded->path == mwms::train::checkpoint_path(dir));
  CHECK(loaded->warning.empty());
  const Checkpoint want = sample(3);
  CHECK(loaded->checkpoint.epochs_completed == 3);
  CHECK(loaded->checkpoint.steps_per_epoch == 10);
  CHECK(loaded->checkpoint.seed == 42);
  CHECK(loaded->checkpoint.global_batch_size == 64);
  CHECK(loaded->checkpoint.params == want.params);
  CHECK(loaded->checkpoint.velocity == want.velocity);
  CHECK(read_bytes(mwms::train::checkpoint_path(dir)).size() == kHeader + 8 * kParams);
  CHECK_FALSE(mwms::train::load_checkpoint(temp_dir(), kParams));  // nothing there
}

TEST_CASE("every flipped bit of the header and flipped payload bytes are detected",
          "[unit][checkpoint]") {
  const std::string dir = temp_dir();
  mwms::train::save_checkpoint(dir, sample(1));
  const std::string path = mwms::train::checkpoint_path(dir);
  const std::vector<unsigned char> good = read_bytes(path);
  REQUIRE(good.size() == kHeader + 8 * kParams);
  int refused = 0;
  for (std::size_t at = 0; at < kHeader; ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<unsigned char> bad = good;
      bad[at] ^= static_cast<unsigned char>(1u << bit);
      write_bytes(path, bad);
      expect_refused(path, "header byte " + std::to_string(at) + " bit " + std::to_string(bit));
      // No previous checkpoint: the loader must refuse too, not fall back to anything.
      CHECK_THROWS_AS(mwms::train::load_checkpoint(dir, kParams), CheckpointError);
      ++refused;
    }
    std::vector<unsigned char> bad = good;
    bad[at] ^= 0xFF;  // the whole byte
    write_bytes(path, bad);
    expect_refused(path, "header byte " + std::to_string(at) + " inverted");
  }
  CHECK(refused == static_cast<int>(kHeader) * 8);
  for (std::size_t at : {kHeader, kHeader + 1, kHeader + 4 * kParams + 3, good.size() - 1}) {
    std::vector<unsigned char> bad = good;
    bad[at] ^= 0x01;
    write_bytes(path, bad);
    try {
      mwms::train::read_checkpoint_file(path, kParams);
      FAIL("accepted a flipped payload byte at " << at);
    } catch (const CheckpointCorruptError& e) {
      CHECK(e.field() == "payload_crc32");
    }
  }
  write_bytes(path, good);
  CHECK(mwms::train::read_checkpoint_file(path, kParams).epochs_completed == 1);
}

TEST_CASE("a truncated or overlong checkpoint is refused as such", "[unit][checkpoint]") {
  const std::string dir = temp_dir();
  mwms::train::save_checkpoint(dir, sample(2));
  const std::string path = mwms::train::checkpoint_path(dir);
  const std::vector<unsigned char> good = read_bytes(path);
  for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{12},
                          kHeader - 1, kHeader, kHeader + 1, good.size() / 2, good.size() - 1,
                          good.size() + 1}) {
    INFO("length " << len);
    std::vector<unsigned char> cut = good;
    cut.resize(len, 0);
    write_bytes(path, cut);
    {
      const CheckpointCorruptError e = refusal<CheckpointCorruptError>(path);
      CHECK(e.field() == "size");
      CHECK_THAT(std::string(e.what()), Contains(len > good.size() ? "overlong" : "truncated"));
    }
  }
}

TEST_CASE("an epoch count of 4294967297 is refused, written or read", "[unit][checkpoint]") {
  const std::string dir = temp_dir();
  // Writing it: refused before anything reaches the disk.
  try {
    mwms::train::save_checkpoint(dir, sample(4294967297LL));
    FAIL("wrote 4294967297 epochs");
  } catch (const CheckpointError& e) {
    CHECK(e.field() == "epochs_completed");
    CHECK_THAT(std::string(e.what()), Contains("4294967297"));
  }
  CHECK_FALSE(exists(mwms::train::checkpoint_path(dir)));
  // Reading it: one flipped bit turns 1 epoch into 2^32 + 1.
  mwms::train::save_checkpoint(dir, sample(1));
  const std::string path = mwms::train::checkpoint_path(dir);
  std::vector<unsigned char> b = read_bytes(path);
  b[16 + 4] ^= 0x01;
  write_bytes(path, b);
  {
    const CheckpointCorruptError e = refusal<CheckpointCorruptError>(path);
    CHECK(e.field() == "epochs_completed");
    CHECK_THAT(std::string(e.what()), Contains("4294967297"));
  }
  // Even with a consistent global step and a valid header CRC (a buggy writer), the range holds.
  b = read_bytes(path);
  put_u64(b, 16, 4294967297ull);
  put_u64(b, 32, 4294967297ull * 10);
  reseal_header(b);
  write_bytes(path, b);
  {
    const CheckpointCorruptError e = refusal<CheckpointCorruptError>(path);
    CHECK(e.field() == "epochs_completed");
    CHECK_THAT(std::string(e.what()), Contains("4294967297"));
  }
  // An inconsistent global step with a valid CRC is refused naming it.
  b = read_bytes(mwms::train::checkpoint_path(dir));
  put_u64(b, 16, 1);
  put_u64(b, 32, 11);
  reseal_header(b);
  write_bytes(path, b);
  {
    const CheckpointCorruptError e = refusal<CheckpointCorruptError>(path);
    CHECK(e.field() == "global_step");
  }
}

TEST_CASE("a damaged newest checkpoint falls back to the previous one and says so",
          "[unit][checkpoint]") {
  const std::string dir = temp_dir();
  const std::string newest = mwms::train::checkpoint_path(dir);
  const std::string prev = mwms::train::previous_checkpoint_path(dir);
  mwms::train::save_checkpoint(dir, sample(1));
  CHECK_FALSE(exists(prev));
  mwms::train::save_checkpoint(dir, sample(2));
  REQUIRE(exists(prev));
  CHECK(mwms::train::read_checkpoint_file(prev, kParams).epochs_completed == 1);
  const std::vector<unsigned char> good = read_bytes(newest);

  SECTION("a flipped payload byte") {
    std::vector<unsigned char> bad = good;
    bad[kHeader + 17] ^= 0x40;
    write_bytes(newest, bad);
    auto loaded = mwms::train::load_checkpoint(dir, kParams);
    REQUIRE(loaded);
    CHECK(loaded->checkpoint.epochs_completed == 1);
    CHECK(loaded->checkpoint.params == sample(1).params);
    CHECK(loaded->path == prev);
    CHECK_THAT(loaded->warning, Contains("unusable"));
    CHECK_THAT(loaded->warning, Contains(newest));
    CHECK_THAT(loaded->warning, Contains("falling back to the previous checkpoint " + prev));
  }
  SECTION("a missing newest (a crash between the two renames)") {
    REQUIRE(::unlink(newest.c_str()) == 0);
    auto loaded = mwms::train::load_checkpoint(dir, kParams);
    REQUIRE(loaded);
    CHECK(loaded->checkpoint.epochs_completed == 1);
    CHECK_THAT(loaded->warning, Contains("missing"));
  }
  SECTION("both damaged: the newest's error, saying the previous is unusable too") {
    std::vector<unsigned char> bad = good;
    bad[kHeader] ^= 0x01;
    write_bytes(newest, bad);
    write_bytes(prev, std::vector<unsigned char>(good.begin(), good.begin() + 40));
    try {
      mwms::train::load_checkpoint(dir, kParams);
      FAIL("accepted");
    } catch (const CheckpointCorruptError& e) {
      CHECK(e.path() == newest);
      CHECK(e.field() == "payload_crc32");
      CHECK_THAT(std::string(e.what()), Contains("the previous checkpoint is unusable too"));
      CHECK_THAT(std::string(e.what()), Contains(prev));
    }
  }
  SECTION("a damaged newest is replaced without pushing out the good previous one") {
    std::vector<unsigned char> bad = good;
    bad[30] ^= 0x01;
    write_bytes(newest, bad);
    const std::string warning = mwms::train::save_checkpoint(dir, sample(3));
    CHECK_THAT(warning, Contains("unusable newest"));
    CHECK(mwms::train::read_checkpoint_file(prev, kParams).epochs_completed == 1);
    CHECK(mwms::train::read_checkpoint_file(newest, kParams).epochs_completed == 3);
  }
  SECTION("rotation: the newest becomes the previous, no temporary file is left") {
    mwms::train::save_checkpoint(dir, sample(3));
    CHECK(mwms::train::read_checkpoint_file(prev, kParams).epochs_completed == 2);
    CHECK(mwms::train::read_checkpoint_file(newest, kParams).epochs_completed == 3);
    CHECK_FALSE(exists(newest + ".tmp." + std::to_string(::getpid())));
  }
}

TEST_CASE("an old-format, foreign or other-model file gets a clear error", "[unit][checkpoint]") {
  const std::string dir = temp_dir();
  const std::string path = mwms::train::checkpoint_path(dir);
  // Format version 1: a 64-byte header (magic, version 1, header size 64, epochs, count, seed,
  // batch, FNV-1a of the payload, reserved), then the payload.
  std::vector<unsigned char> v1(64 + 8 * kParams, 0);
  std::memcpy(v1.data(), "MWMSCKPT", 8);
  put_u32(v1, 8, 1);
  put_u32(v1, 12, 64);
  put_u64(v1, 16, 2);
  put_u64(v1, 24, kParams);
  write_bytes(path, v1);
  try {
    mwms::train::load_checkpoint(dir, kParams);
    FAIL("accepted a version 1 file");
  } catch (const CheckpointFormatError& e) {
    CHECK(e.field() == "version");
    CHECK_THAT(std::string(e.what()), Contains("format version 1"));
    CHECK_THAT(std::string(e.what()), Contains("older train"));
    CHECK_THAT(std::string(e.what()), Contains(path));
  }
  write_bytes(path, std::vector<unsigned char>(200, 'x'));
  {
    const CheckpointFormatError e = refusal<CheckpointFormatError>(path);
    CHECK(e.field() == "magic");
  }
  mwms::train::save_checkpoint(dir, sample(1));
  {
    const CheckpointMismatchError e = refusal<CheckpointMismatchError>(path, kParams + 1);
    CHECK(e.field() == "param_count");
    CHECK_THAT(std::string(e.what()), Contains("1000 parameters"));
  }
}

TEST_CASE("a save removes the temporaries of dead writers on this host, never a live one's",
          "[unit][checkpoint]") {
  // Note [checkpoint temporaries]: 20 kills while saving used to leave 20 model-sized files.
  const std::string dir = temp_dir();
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);  // a pid whose process is gone
  const std::string dead = std::to_string(child);
  const std::string live = std::to_string(::getppid());
  const std::vector<unsigned char> junk(64, 0xAB);
  const std::string dead_here = "ckpt.bin.tmp." + std::string(host) + "." + dead;
  const std::string dead_old_format = "ckpt.bin.tmp." + dead;
  const std::string live_here = "ckpt.bin.tmp." + std::string(host) + "." + live;
  const std::string dead_elsewhere = "ckpt.bin.tmp.other-host.example." + dead;
  const std::string not_ours = "ckpt.bin.tmp.notapid";
  for (const std::string& f : {dead_here, dead_old_format, live_here, dead_elsewhere, not_ours}) {
    write_bytes(dir + "/" + f, junk);
  }
  const std::string warning = mwms::train::save_checkpoint(dir, sample(1));
  CHECK_FALSE(exists(dir + "/" + dead_here));
  CHECK_FALSE(exists(dir + "/" + dead_old_format));
  CHECK(exists(dir + "/" + live_here));
  CHECK(exists(dir + "/" + dead_elsewhere));
  CHECK(exists(dir + "/" + not_ours));
  CHECK_THAT(warning, Contains(dead_here) && Contains(dead_old_format) &&
                          Contains("died before renaming"));
  CHECK(mwms::train::read_checkpoint_file(dir + "/ckpt.bin", kParams).epochs_completed == 1);
  // Nothing of this save's own is left behind, and a second save has nothing to say.
  CHECK(mwms::train::save_checkpoint(dir, sample(2)).empty());
  std::system(("rm -rf " + dir).c_str());
}
