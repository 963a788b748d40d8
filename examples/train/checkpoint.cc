#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace mwms::train {
namespace {

constexpr char kMagic[8] = {'M', 'W', 'M', 'S', 'C', 'K', 'P', 'T'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 64;

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

bool host_is_little_endian() {
  const std::uint32_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

void put_u64(unsigned char* dst, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u32(unsigned char* dst, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t get_u64(const unsigned char* src) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | src[i];
  return v;
}
std::uint32_t get_u32(const unsigned char* src) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | src[i];
  return v;
}

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}
constexpr std::uint64_t kFnvOffset = 0xCBF29CE484222325ull;

void write_all(int fd, const void* data, std::size_t bytes, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("cannot write", path);
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void read_all(int fd, void* data, std::size_t bytes, const std::string& path) {
  auto* p = static_cast<unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("cannot read", path);
    if (n == 0) throw std::runtime_error("checkpoint " + path + " is truncated");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void make_dirs(const std::string& dir) {
  for (std::size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      fail_errno("cannot create checkpoint directory", prefix);
    }
  }
}

/// Makes the rename itself durable: without this a power loss can forget the new name.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: the data file itself is already on disk
  ::fsync(fd);
  ::close(fd);
}

/// Closes the descriptor on every path out of load_checkpoint.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

std::string checkpoint_path(const std::string& dir) { return dir + "/ckpt.bin"; }

void save_checkpoint(const std::string& dir, const Checkpoint& ckpt) {
  if (!host_is_little_endian()) throw std::runtime_error("checkpoints need a little-endian host");
  if (ckpt.params.size() != ckpt.velocity.size()) {
    throw std::runtime_error("checkpoint: parameter and momentum sizes differ");
  }
  make_dirs(dir);
  const std::string path = checkpoint_path(dir);
  const std::size_t payload = ckpt.params.size() * sizeof(float);
  unsigned char header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  put_u32(header + 8, kVersion);
  put_u32(header + 12, kHeaderBytes);
  put_u64(header + 16, static_cast<std::uint64_t>(ckpt.epochs_completed));
  put_u64(header + 24, ckpt.params.size());
  put_u64(header + 32, ckpt.seed);
  put_u64(header + 40, ckpt.global_batch_size);
  put_u64(header + 48, fnv1a(fnv1a(kFnvOffset, ckpt.params.data(), payload),
                             ckpt.velocity.data(), payload));
  // Same directory as the target so that rename() is atomic (same file system).
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("cannot create", tmp);
  try {
    write_all(fd, header, sizeof header, tmp);
    write_all(fd, ckpt.params.data(), payload, tmp);
    write_all(fd, ckpt.velocity.data(), payload, tmp);
    if (::fsync(fd) != 0) fail_errno("cannot fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail_errno("cannot close", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    fail_errno("cannot rename " + tmp + " to", path);
  }
  fsync_dir(dir);
}

std::optional<Checkpoint> load_checkpoint(const std::string& dir, std::size_t expected_params) {
  if (!host_is_little_endian()) throw std::runtime_error("checkpoints need a little-endian host");
  const std::string path = checkpoint_path(dir);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  if (fd < 0) fail_errno("cannot open checkpoint", path);
  FdCloser closer{fd};
  const auto bad = [&](const std::string& what) {
    return std::runtime_error("checkpoint " + path + " is invalid: " + what);
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno("cannot stat", path);
  if (static_cast<std::size_t>(st.st_size) < kHeaderBytes) throw bad("shorter than its header");
  unsigned char header[kHeaderBytes];
  read_all(fd, header, sizeof header, path);
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0) throw bad("bad magic (not a checkpoint)");
  if (get_u32(header + 8) != kVersion) {
    throw bad("format version " + std::to_string(get_u32(header + 8)) + ", expected " +
              std::to_string(kVersion));
  }
  if (get_u32(header + 12) != kHeaderBytes) throw bad("unexpected header size");
  Checkpoint ckpt;
  ckpt.epochs_completed = static_cast<std::int64_t>(get_u64(header + 16));
  const std::uint64_t count = get_u64(header + 24);
  ckpt.seed = get_u64(header + 32);
  ckpt.global_batch_size = get_u64(header + 40);
  if (count != expected_params) {
    throw bad("holds " + std::to_string(count) + " parameters, the model has " +
              std::to_string(expected_params));
  }
  if (ckpt.epochs_completed < 0) throw bad("negative epoch count");
  const std::size_t payload = count * sizeof(float);
  if (static_cast<std::uint64_t>(st.st_size) != kHeaderBytes + 2 * payload) {
    throw bad("size " + std::to_string(st.st_size) + " bytes, expected " +
              std::to_string(kHeaderBytes + 2 * payload));
  }
  ckpt.params.resize(count);
  ckpt.velocity.resize(count);
  read_all(fd, ckpt.params.data(), payload, path);
  read_all(fd, ckpt.velocity.data(), payload, path);
  const std::uint64_t sum =
      fnv1a(fnv1a(kFnvOffset, ckpt.params.data(), payload), ckpt.velocity.data(), payload);
  if (sum != get_u64(header + 48)) throw bad("checksum mismatch (corrupt payload)");
  return ckpt;
}

}  // namespace mwms::train
