// The parameter servers' checkpoint files (strategy/ps/ps_checkpoint.h, Note [ps checkpoint
// files]): shard files and manifests round-trip through real files, byte for byte as an
// independent encoder writes them (tests/fuzz/make_ps_checkpoint_corpus.py); the decoders are
// bounded and total (every truncation, every flipped byte: a CheckpointError naming the file and
// what is wrong); a file that is not the one the manifest recorded says which property differs;
// a directory lists its checkpoints by name and keeps the newest; and a write the system refuses
// says which call failed on which file, and why.
#include "strategy/ps/ps_checkpoint.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mwms/optimizer.h"

namespace {

namespace ps = mwms::strategy::ps;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

// A fresh directory per test case, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/mwms-ps-ckpt-test-XXXXXX";
    const char* dir = ::mkdtemp(pattern);
    REQUIRE(dir != nullptr);
    path_ = dir;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

std::uint32_t crc_of(const std::string& s, std::size_t from = 0,
                     std::size_t to = std::string::npos) {
  to = std::min(to, s.size());
  return static_cast<std::uint32_t>(
      ::crc32(0, reinterpret_cast<const Bytef*>(s.data()) + from, static_cast<uInt>(to - from)));
}

void put_le(std::string& s, std::size_t offset, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s[offset + i] = static_cast<char>(v >> (8 * i));
}
std::uint64_t get_le(const std::string& s, std::size_t offset, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[offset + i]);
  return v;
}

// Both CRCs recomputed, so that what a decoder then refuses is the field itself.
std::string with_crcs(std::string s, std::size_t header_bytes) {
  put_le(s, header_bytes - 8, crc_of(s, header_bytes), 4);
  put_le(s, header_bytes - 4, crc_of(s, 0, header_bytes - 4), 4);
  return s;
}

// What one ps holds: its shards (one empty), values and optimizer slots.
struct Held {
  std::vector<ps::ShardDescription> shards;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

Held sample(int slots) {
  Held h;
  h.shards = {
      {"dense/kernel/part_0", 0, 0, 0, 6}, {"dense/bias", 1, 0, 0, 0}, {"emb", 2, 1, 40, 3}};
  for (int i = 0; i < 9; ++i) h.values.push_back(0.5f * static_cast<float>(i) - 1.0f);
  for (int k = 0; k < slots; ++k) {
    h.slots.emplace_back();
    for (int i = 0; i < 9; ++i) h.slots.back().push_back(100.0f * static_cast<float>(k + 1) + i);
  }
  return h;
}

ps::ShardFileView view_of(const Held& h, int optimizer, std::uint32_t ps_index = 1,
                          std::uint32_t num_ps = 3, std::uint64_t step = 1200,
                          std::uint64_t version = 1187) {
  ps::ShardFileView v;
  v.ps_index = ps_index;
  v.num_ps = num_ps;
  v.checkpoint_step = step;
  v.version = version;
  v.optimizer = static_cast<std::uint8_t>(optimizer);
  v.shards = &h.shards;
  v.values = h.values.empty() ? nullptr : h.values.data();
  for (const std::vector<float>& s : h.slots) v.slots.push_back(s.data());
  v.total = h.values.size();
  return v;
}

ps::Manifest sample_manifest() {
  ps::Manifest m;
  m.checkpoint_step = 1200;
  m.entries = {{1187, 300, 0xdeadbeefu}, {1187, 64, 0}, {5, 1000, 1}};
  m.user_state = std::string("epoch 3\0pos 17", 14);
  return m;
}

// The decoders' refusal of `bytes` ("" when they accept); any other exception fails the case.
std::string shard_error(const std::string& bytes) {
  try {
    ps::decode_shard_file(bytes.data(), bytes.size(), "the-file");
  } catch (const mwms::CheckpointError& e) {
    CHECK(e.path() == "the-file");
    CHECK_THAT(e.message(), Contains("checkpoint the-file: "));
    return e.message();
  }
  return "";
}
std::string manifest_error(const std::string& bytes) {
  try {
    ps::decode_manifest(bytes.data(), bytes.size(), "the-file");
  } catch (const mwms::CheckpointError& e) {
    CHECK(e.path() == "the-file");
    return e.message();
  }
  return "";
}

// Every truncation, every single-bit flip and every byte inverted: refused.
void check_total(const std::string& bytes, std::string (*error)(const std::string&)) {
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " bytes");
    CHECK_FALSE(error(bytes.substr(0, n)).empty());
  }
  CHECK_THAT(error(bytes + "x"), Contains("truncated or overlong"));
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (unsigned flip : {0x01u, 0x02u, 0x04u, 0x08u, 0x10u, 0x20u, 0x40u, 0x80u, 0xffu}) {
      std::string b = bytes;
      b[i] = static_cast<char>(static_cast<unsigned char>(b[i]) ^ flip);
      INFO("byte " << i << " ^ " << flip);
      CHECK_FALSE(error(b).empty());
    }
  }
}

}  // namespace

TEST_CASE("a ps shard file round-trips for every optimizer", "[unit][ps][checkpoint]") {
  const int optimizer = GENERATE(0, 1, 2);
  const int slots = mwms::num_slots(static_cast<mwms::OptimizerKind>(optimizer));
  REQUIRE(slots == optimizer);
  TempDir t;
  const std::string dir = t.path() + "/ckpt";  // created by the write
  const Held h = sample(slots);
  const ps::ManifestEntry e = ps::write_shard_file(dir, view_of(h, optimizer));
  const std::string path = ps::shard_file_path(dir, 1200, 1, 3);
  CHECK(path == dir + "/model.ckpt-1200.ps-1-of-3");
  CHECK(names_in(dir) == std::vector<std::string>{"model.ckpt-1200.ps-1-of-3"});  // no temporary
  const std::string bytes = read_bytes(path);
  std::size_t records = 0;
  for (const ps::ShardDescription& s : h.shards) records += 28 + s.name.size();
  CHECK(bytes.size() == 64 + records + 9 * 4 * (1 + slots));
  CHECK(e.version == 1187);
  CHECK(e.file_bytes == bytes.size());
  CHECK(e.file_crc32 == crc_of(bytes));
  // The header at the offsets Note [ps checkpoint files] gives.
  CHECK(bytes.substr(0, 8) == "MWMSPSSH");
  CHECK(get_le(bytes, 8, 4) == 1);
  CHECK(get_le(bytes, 12, 4) == 64);
  CHECK(get_le(bytes, 16, 4) == 1);
  CHECK(get_le(bytes, 20, 4) == 3);
  CHECK(get_le(bytes, 24, 8) == 1200);
  CHECK(get_le(bytes, 32, 8) == 1187);
  CHECK(get_le(bytes, 40, 4) == 3);
  CHECK(get_le(bytes, 44, 4) == static_cast<std::uint64_t>(optimizer));  // and 3 zero bytes
  CHECK(get_le(bytes, 48, 8) == bytes.size() - 64);
  CHECK(get_le(bytes, 56, 4) == crc_of(bytes, 64));
  CHECK(get_le(bytes, 60, 4) == crc_of(bytes, 0, 60));
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  for (const ps::ManifestEntry* expected : {static_cast<const ps::ManifestEntry*>(nullptr), &e}) {
    const ps::ShardFile f = ps::read_shard_file(path, expected);
    CHECK(f.ps_index == 1);
    CHECK(f.num_ps == 3);
    CHECK(f.checkpoint_step == 1200);
    CHECK(f.version == 1187);
    CHECK(f.optimizer == optimizer);
    CHECK(f.shards == h.shards);
    CHECK(f.values == h.values);
    CHECK(f.slots == h.slots);
  }
  // A second save of the step replaces the file whole.
  Held later = sample(slots);
  later.values[4] = 42.0f;
  ps::write_shard_file(dir, view_of(later, optimizer));
  CHECK(ps::read_shard_file(path).values == later.values);
  CHECK(names_in(dir).size() == 1);
}

TEST_CASE("a ps shard file with no shards", "[unit][ps][checkpoint]") {
  TempDir t;
  const Held none;
  const ps::ManifestEntry e = ps::write_shard_file(t.path(), view_of(none, 0, 0, 1, 0, 0));
  CHECK(e.file_bytes == 64);
  const ps::ShardFile f = ps::read_shard_file(ps::shard_file_path(t.path(), 0, 0, 1), &e);
  CHECK(f.shards.empty());
  CHECK(f.values.empty());
  CHECK(f.slots.empty());
}

TEST_CASE("a checkpoint manifest round-trips with its user state", "[unit][ps][checkpoint]") {
  TempDir t;
  const ps::Manifest m = sample_manifest();
  ps::write_manifest(t.path(), m);
  const std::string path = ps::manifest_path(t.path(), 1200);
  CHECK(path == t.path() + "/model.ckpt-1200.manifest");
  CHECK(names_in(t.path()) == std::vector<std::string>{"model.ckpt-1200.manifest"});
  const std::string bytes = read_bytes(path);
  CHECK(bytes.size() == 48 + 3 * 20 + 14);
  CHECK(bytes.substr(0, 8) == "MWMSPSMF");
  CHECK(get_le(bytes, 24, 4) == 3);
  CHECK(get_le(bytes, 28, 4) == 14);
  CHECK(get_le(bytes, 44, 4) == crc_of(bytes, 0, 44));
  const ps::Manifest back = ps::read_manifest(path);
  CHECK(back.checkpoint_step == 1200);
  REQUIRE(back.entries.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(back.entries[i].version == m.entries[i].version);
    CHECK(back.entries[i].file_bytes == m.entries[i].file_bytes);
    CHECK(back.entries[i].file_crc32 == m.entries[i].file_crc32);
  }
  CHECK(back.user_state == m.user_state);
}

TEST_CASE("the checkpoint decoders are bounded and total", "[unit][ps][checkpoint]") {
  TempDir t;
  const Held h = sample(1);
  ps::write_shard_file(t.path(), view_of(h, 1));
  check_total(read_bytes(ps::shard_file_path(t.path(), 1200, 1, 3)), shard_error);
  ps::write_manifest(t.path(), sample_manifest());
  check_total(read_bytes(ps::manifest_path(t.path(), 1200)), manifest_error);
  // A read from disk refuses a truncated file the same way, before reading its payload.
  const std::string path = ps::shard_file_path(t.path(), 1200, 1, 3);
  const std::string bytes = read_bytes(path);
  for (std::size_t n :
       {std::size_t{0}, std::size_t{10}, std::size_t{63}, std::size_t{64}, bytes.size() - 1}) {
    write_bytes(path, bytes.substr(0, n));
    CHECK_THROWS_WITH(ps::read_shard_file(path), Contains(n < 64 ? "truncated" : "overlong"));
  }
  CHECK_THROWS_WITH(ps::read_shard_file(t.path() + "/none"), Contains("does not exist"));
  CHECK_THROWS_WITH(ps::read_manifest(t.path()), Contains("not a regular file"));
}

TEST_CASE("a checkpoint decoder names the field at fault", "[unit][ps][checkpoint]") {
  TempDir t;
  ps::write_shard_file(t.path(), view_of(sample(1), 1));
  const std::string good = read_bytes(ps::shard_file_path(t.path(), 1200, 1, 3));
  const auto with = [&](std::size_t offset, std::uint64_t v, int bytes) {
    std::string s = good;
    put_le(s, offset, v, bytes);
    return with_crcs(s, 64);
  };
  CHECK(shard_error(with_crcs(good, 64)).empty());
  CHECK_THAT(shard_error(with(20, 0, 4)),
             Contains("field num_ps (offset 20) is 0, outside [1, 65536]"));
  CHECK_THAT(shard_error(with(16, 3, 4)),
             Contains("field ps_index (offset 16) is 3, outside [0, 2]"));
  CHECK_THAT(shard_error(with(8, 2, 4)), Contains("format version (offset 8) is 2"));
  CHECK_THAT(shard_error(with(12, 72, 4)), Contains("header bytes (offset 12) is 72"));
  CHECK_THAT(shard_error(with(40, (1u << 20) + 1, 4)), Contains("shard count (offset 40)"));
  CHECK_THAT(shard_error(with(40, 1u << 20, 4)), Contains("too small for 1048576 shard records"));
  CHECK_THAT(shard_error(with(44, 3, 1)), Contains("optimizer (offset 44) is 3"));
  CHECK_THAT(shard_error(with(46, 1, 1)), Contains("reserved (offset 46) is 1"));
  CHECK_THAT(shard_error(with(48, ~std::uint64_t{0}, 8)), Contains("its header states"));
  // In the records: a name longer than 1024 bytes, counts the floats do not match.
  CHECK_THAT(shard_error(with(64 + 24, 5000, 4)),
             Contains("shard record 0 (payload offset 0): name of 5000 bytes"));
  CHECK_THAT(shard_error(with(64 + 16, 7, 8)), Contains("the shards need 10 floats x 2"));
  CHECK_THAT(shard_error(with(64 + 16, ~std::uint64_t{0}, 8)),
             Contains("more than the payload holds"));
  std::string flipped = good;
  flipped[100] ^= 4;
  CHECK_THAT(shard_error(flipped), Contains("payload CRC32 mismatch (stored 0x"));
  flipped = good;
  flipped[30] ^= 1;
  CHECK_THAT(shard_error(flipped), Contains("header CRC32 mismatch"));
  CHECK_THAT(shard_error("MWMSPSMF" + good.substr(8)), Contains("not a ps shard file"));
  CHECK_THAT(manifest_error(good), Contains("not a checkpoint manifest"));

  ps::write_manifest(t.path(), sample_manifest());
  const std::string m = read_bytes(ps::manifest_path(t.path(), 1200));
  const auto mwith = [&](std::size_t offset, std::uint64_t v, int bytes) {
    std::string s = m;
    put_le(s, offset, v, bytes);
    return with_crcs(s, 48);
  };
  CHECK(manifest_error(with_crcs(m, 48)).empty());
  CHECK_THAT(manifest_error(mwith(24, 0, 4)), Contains("num_ps (offset 24) is 0"));
  CHECK_THAT(manifest_error(mwith(24, 4, 4)),
             Contains("payload bytes (offset 32) is 74, outside [94, 94]"));
  CHECK_THAT(manifest_error(mwith(28, (1u << 20) + 1, 4)),
             Contains("user state bytes (offset 28)"));
  CHECK_THAT(manifest_error(mwith(48 + 28, 10, 8)), Contains("entry 1: shard file of 10 bytes"));
}

TEST_CASE("a shard file that is not the one the manifest recorded", "[unit][ps][checkpoint]") {
  TempDir t;
  const ps::ManifestEntry e = ps::write_shard_file(t.path(), view_of(sample(2), 2));
  const std::string path = ps::shard_file_path(t.path(), 1200, 1, 3);
  ps::ManifestEntry wrong = e;
  wrong.file_crc32 ^= 1;
  CHECK_THROWS_WITH(
      ps::read_shard_file(path, &wrong),
      Contains("not the file the manifest recorded: CRC32 0x") && Contains("the manifest says 0x"));
  wrong = e;
  wrong.file_bytes += 1;
  CHECK_THROWS_WITH(ps::read_shard_file(path, &wrong),
                    Contains("size " + std::to_string(e.file_bytes) + " (the manifest says " +
                             std::to_string(e.file_bytes + 1) + ")"));
  wrong = e;
  wrong.version = 5;
  CHECK_THROWS_WITH(ps::read_shard_file(path, &wrong),
                    Contains("version 1187 (the manifest says 5)"));
  CHECK_NOTHROW(ps::read_shard_file(path, &e));
}

TEST_CASE("what a shard file writer refuses", "[unit][ps][checkpoint]") {
  TempDir t;
  const std::string dir = t.path() + "/ckpt";
  const Held h = sample(1);
  ps::ShardFileView v = view_of(h, 2);  // adam: two slots, one given
  CHECK_THROWS_WITH(ps::write_shard_file(dir, v), Contains("refusing to write: 1 slot buffers"));
  v = view_of(h, 1);
  v.total = 8;
  CHECK_THROWS_WITH(ps::write_shard_file(dir, v), Contains("the shards hold 9 elements"));
  v = view_of(h, 1, 3, 3);
  CHECK_THROWS_AS(ps::write_shard_file(dir, v), mwms::CheckpointError);
  ps::Manifest m = sample_manifest();
  m.entries.clear();
  CHECK_THROWS_WITH(ps::write_manifest(dir, m), Contains("refusing to write: 0 entries"));
  CHECK_FALSE(fs::exists(dir));  // refused before anything was created
}

TEST_CASE("a checkpoint write the system refuses names the call and the file",
          "[unit][ps][checkpoint]") {
  TempDir t;
  // A directory under a regular file: refused even to root, which permission bits do not stop.
  write_bytes(t.path() + "/file", "x");
  const std::string dir = t.path() + "/file/ckpt";
  const Held h = sample(0);
  try {
    ps::write_shard_file(dir, view_of(h, 0));
    FAIL("written under a regular file");
  } catch (const mwms::CheckpointError& e) {
    CHECK(e.path() == ps::shard_file_path(dir, 1200, 1, 3));
    CHECK_THAT(e.message(),
               Contains("mkdir(" + dir + ") failed: ") && Contains(std::strerror(ENOTDIR)));
  }
  try {
    ps::write_manifest(t.path() + "/file", sample_manifest());  // the "directory" is the file
    FAIL("written into a regular file");
  } catch (const mwms::CheckpointError& e) {
    CHECK(e.path() == ps::manifest_path(t.path() + "/file", 1200));
    CHECK_THAT(e.message(), Contains("mkstemp(" + e.path() + ".tmp.XXXXXX) failed: ") &&
                                Contains(std::strerror(ENOTDIR)));
  }
  CHECK(names_in(t.path()) == std::vector<std::string>{"file"});
}

TEST_CASE("a checkpoint write out of descriptors says so", "[unit][ps][checkpoint]") {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan's vptr check probes memory through a pipe: with no descriptor left it reports every
  // virtual call as an invalid object. The Release run checks this case.
  SUCCEED("not under the sanitizers (their runtime needs descriptors itself)");
  return;
#endif
  TempDir t;
  const Held h = sample(0);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  const int probe = ::dup(2);  // the lowest free descriptor: the next open would get it
  REQUIRE(probe >= 0);
  ::close(probe);
  struct Restore {
    rlimit limit;
    ~Restore() { ::setrlimit(RLIMIT_NOFILE, &limit); }
  } restore{old};
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(probe);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::string message;
  try {
    ps::write_shard_file(t.path(), view_of(h, 0));
  } catch (const mwms::CheckpointError& e) {
    message = e.message();
  }
  ::setrlimit(RLIMIT_NOFILE, &old);
  CHECK_THAT(message, Contains("mkstemp(") && Contains(std::strerror(EMFILE)) &&
                          Contains("resource exhausted: open file descriptors"));
  CHECK(names_in(t.path()).empty());
}

TEST_CASE("list_checkpoints reads manifest names exactly", "[unit][ps][checkpoint]") {
  TempDir t;
  for (const char* name :
       {"model.ckpt-10.manifest", "model.ckpt-9.manifest", "model.ckpt-x.manifest",
        "model.ckpt-10.manifest.tmp.abc", "model.ckpt-+5.manifest", "model.ckpt--5.manifest",
        "model.ckpt-.manifest", "model.ckpt-010.manifest", "model.ckpt- 4.manifest",
        "model.ckpt-18446744073709551616.manifest", "model.ckpt-18446744073709551615.manifest",
        "model.ckpt-0.manifest", "model.ckpt-7.ps-0-of-1", "model.ckpt-8.manifestx",
        "model.ckpt-11.manifest.bak", "xmodel.ckpt-12.manifest", "model.ckpt-13"}) {
    write_bytes(t.path() + "/" + name, "");
  }
  CHECK(ps::list_checkpoints(t.path()) ==
        std::vector<std::uint64_t>{18446744073709551615u, 10, 9, 0});
  CHECK(ps::list_checkpoints(t.path() + "/none").empty());
  CHECK_THROWS_WITH(ps::list_checkpoints(t.path() + "/model.ckpt-9.manifest"),
                    Contains("opendir failed: ") && Contains(std::strerror(ENOTDIR)));
}

TEST_CASE("remove_old_checkpoints keeps the newest and clears a crash's leftovers",
          "[unit][ps][checkpoint]") {
  TempDir t;
  const auto make = [&](const std::string& name) { write_bytes(t.path() + "/" + name, ""); };
  for (int step : {2, 3, 5, 7}) make("model.ckpt-" + std::to_string(step) + ".manifest");
  for (int step : {2, 3, 4, 5, 7, 8}) {  // 4: a save that crashed; 8: a save in progress
    for (const char* ps : {".ps-0-of-2", ".ps-1-of-2"}) {
      make("model.ckpt-" + std::to_string(step) + ps);
    }
  }
  for (const char* name : {"model.ckpt-3.ps-0-of-2.tmp.Ab12Cd", "model.ckpt-4.manifest.tmp.zz",
                           "model.ckpt-9.ps-0-of-2.tmp.q", "notes.txt", "model.ckpt-1.data"}) {
    make(name);
  }
  ps::remove_old_checkpoints(t.path(), 2);
  CHECK(names_in(t.path()) ==
        std::vector<std::string>{
            "model.ckpt-1.data", "model.ckpt-5.manifest", "model.ckpt-5.ps-0-of-2",
            "model.ckpt-5.ps-1-of-2", "model.ckpt-7.manifest", "model.ckpt-7.ps-0-of-2",
            "model.ckpt-7.ps-1-of-2", "model.ckpt-8.ps-0-of-2", "model.ckpt-8.ps-1-of-2",
            "model.ckpt-9.ps-0-of-2.tmp.q", "notes.txt"});
  ps::remove_old_checkpoints(t.path(), 1);
  CHECK(ps::list_checkpoints(t.path()) == std::vector<std::uint64_t>{7});
  CHECK(names_in(t.path()).size() == 8);
  ps::remove_old_checkpoints(t.path(), 5);  // fewer than 5: nothing to do
  CHECK(names_in(t.path()).size() == 8);
  // Never throws: a missing directory, or one that cannot be read.
  CHECK_NOTHROW(ps::remove_old_checkpoints(t.path() + "/none", 1));
  CHECK_NOTHROW(ps::remove_old_checkpoints(t.path() + "/notes.txt", 1));
}

TEST_CASE("the ps_checkpoint fuzz seeds read as their names say", "[unit][ps][checkpoint]") {
  // Written by tests/fuzz/make_ps_checkpoint_corpus.py, an encoder independent of this one;
  // byte 0 is the fuzz target's mode (Note [ps checkpoint fuzz input]), the rest the file.
  const fs::path corpus = fs::path(MWMS_SOURCE_DIR) / "tests/fuzz/corpus/ps_checkpoint";
  REQUIRE(fs::is_directory(corpus));
  const auto file = [&](const char* name) {
    return read_bytes((corpus / name).string()).substr(1);
  };
  int valid = 0;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    const std::string name = entry.path().filename();
    const std::string bytes = read_bytes(entry.path()).substr(1);
    INFO(name);
    const bool shard = shard_error(bytes).empty();
    const bool manifest = manifest_error(bytes).empty();
    CHECK(shard == (name.rfind("valid_shard", 0) == 0));
    CHECK(manifest == (name.rfind("valid_manifest", 0) == 0));
    valid += shard || manifest;
  }
  CHECK(valid == 6);
  // Byte for byte what this writer makes of the same state.
  TempDir t;
  Held h;
  h.shards = {{"dense/kernel", 0, 0, 0, 6}, {"dense/bias", 1, 0, 0, 3}, {"empty", 2, 0, 0, 0}};
  h.slots.resize(1);
  for (int i = 0; i < 9; ++i) {
    h.values.push_back(0.25f * static_cast<float>(i) - 3.0f);
    h.slots[0].push_back(0.25f * static_cast<float>(9 + i) - 3.0f);
  }
  ps::write_shard_file(t.path(), view_of(h, 1, 1, 2, 100, 37));
  CHECK(read_bytes(ps::shard_file_path(t.path(), 100, 1, 2)) == file("valid_shard_momentum"));
  ps::Manifest m;
  m.checkpoint_step = 100;
  m.entries = {{37, 160, 0x12345678u}, {37, 172, 0x9abcdef0u}};
  m.user_state = std::string("epoch=3\0pos=17", 14);
  ps::write_manifest(t.path(), m);
  CHECK(read_bytes(ps::manifest_path(t.path(), 100)) == file("valid_manifest"));
}
