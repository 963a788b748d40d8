// libFuzzer target: a checkpoint file as train finds it on disk after a crash, a bad disk or a
// hostile user (examples/train/checkpoint.h, format 2). Every input must be either accepted or
// refused with a CheckpointError; another exception, a crash, a sanitizer report, an allocation
// sized from an unchecked field or a hang is a finding. An accepted file must re-encode to the
// very same bytes (every header byte is a field, so there is exactly one valid encoding of a
// checkpoint): a reader that accepts anything else has let a corruption through.
//
// Input layout (Note [checkpoint fuzz input]): byte 0 selects what is done with the rest.
//   bit 0  fix the CRCs: recompute the payload CRC (bytes 80.. of the file) and the header CRC
//          (bytes 0-75) before writing, so the fuzzer also reaches the checks after them
//   bit 1  two files: bytes 1-2 (little-endian, modulo the remaining length + 1) split the rest
//          into ckpt.bin and ckpt.prev.bin, loaded with load_checkpoint (the fallback); bit 3
//          leaves ckpt.bin out, bit 4 leaves ckpt.prev.bin out
//   bit 2  expect one parameter more than the header's count (the model-mismatch path)
// The model's parameter count is otherwise the header's count field when it is at most 2^20
// (so that valid files are reachable), else 1.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "checkpoint.h"

namespace {

namespace ckpt = mwms::train;

// A scratch directory of this process (removed at exit): the reader takes paths, not bytes.
// Never destroyed, so that the exit handler can still use it.
const std::string& scratch_dir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* d = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                              "/mwms-fuzz-ckpt-XXXXXX");
    if (::mkdtemp(d->data()) == nullptr) std::abort();
    std::atexit([] {
      for (const char* name :
           {"/ckpt.bin", "/ckpt.prev.bin", "/out/ckpt.bin", "/out/ckpt.prev.bin"}) {
        ::unlink((scratch_dir() + name).c_str());
      }
      ::rmdir((scratch_dir() + "/out").c_str());
      ::rmdir(scratch_dir().c_str());
    });
    return d;
  }();
  return *dir;
}

std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// Makes both CRCs of `file` match its bytes (bit 0 of the mode byte).
void fix_crcs(std::string* file) {
  auto* p = reinterpret_cast<std::uint8_t*>(file->data());
  if (file->size() < ckpt::kCheckpointHeaderBytes) return;
  const std::size_t payload = file->size() - ckpt::kCheckpointHeaderBytes;
  put_u32(p + 72, static_cast<std::uint32_t>(::crc32_z(0, p + 80, payload)));
  put_u32(p + 76, static_cast<std::uint32_t>(::crc32_z(0, p, 76)));
}

void write_file(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) std::abort();
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::size_t model_params(const std::string& file, bool one_more) {
  std::uint64_t count = 1;
  if (file.size() >= 48) {
    const std::uint64_t c = get_u64(reinterpret_cast<const std::uint8_t*>(file.data()) + 40);
    if (c <= (1u << 20)) count = c;
  }
  return static_cast<std::size_t>(count + (one_more ? 1 : 0));
}

// An accepted checkpoint must be the model's and re-encode to the bytes it was read from.
void expect_canonical(const ckpt::Checkpoint& c, std::size_t params, const std::string& file) {
  if (c.params.size() != params || c.velocity.size() != params) __builtin_trap();
  const std::string out = scratch_dir() + "/out";
  ::unlink((out + "/ckpt.bin").c_str());
  ::unlink((out + "/ckpt.prev.bin").c_str());
  if (!ckpt::save_checkpoint(out, c).empty()) __builtin_trap();  // nothing to replace: no warning
  if (read_file(ckpt::checkpoint_path(out)) != file) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  const std::string& dir = scratch_dir();
  const std::string newest = ckpt::checkpoint_path(dir);
  const std::string prev = ckpt::previous_checkpoint_path(dir);
  ::unlink(newest.c_str());
  ::unlink(prev.c_str());
  const bool one_more = (mode & 4) != 0;
  try {
    if ((mode & 2) == 0) {
      std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
      if ((mode & 1) != 0) fix_crcs(&file);
      write_file(newest, file);
      const std::size_t params = model_params(file, one_more);
      expect_canonical(ckpt::read_checkpoint_file(newest, params), params, file);
      return 0;
    }
    if (size < 3) return 0;
    const std::size_t rest = size - 3;
    const std::size_t split = (data[1] | (std::size_t{data[2]} << 8)) % (rest + 1);
    std::string first(reinterpret_cast<const char*>(data + 3), split);
    std::string second(reinterpret_cast<const char*>(data + 3 + split), rest - split);
    if ((mode & 1) != 0) {
      fix_crcs(&first);
      fix_crcs(&second);
    }
    const bool with_newest = (mode & 8) == 0, with_prev = (mode & 16) == 0;
    if (with_newest) write_file(newest, first);
    if (with_prev) write_file(prev, second);
    const std::size_t params = model_params(with_newest ? first : second, one_more);
    const auto loaded = ckpt::load_checkpoint(dir, params);
    if (!loaded) {
      if (with_newest || with_prev) __builtin_trap();  // a file was there: load or throw
      return 0;
    }
    const bool fell_back = loaded->path == prev;
    if (!fell_back && loaded->path != newest) __builtin_trap();
    if (fell_back != !loaded->warning.empty()) __builtin_trap();  // a fallback always says why
    expect_canonical(loaded->checkpoint, params, fell_back ? second : first);
  } catch (const ckpt::CheckpointError&) {
    // refused, naming the file: the expected outcome for almost every input
  }
  return 0;
}
