#include "checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace mwms::train {

// Note [checkpoint rotation]: save writes a temporary file next to the target (same file system,
// so rename is atomic), fsyncs it, renames the current newest to ckpt.prev.bin (only if it
// verifies: a damaged newest must not push out a good previous one), renames the temporary file
// to ckpt.bin and fsyncs the directory after each rename, so the names themselves survive a power
// loss. A crash between the two renames leaves only ckpt.prev.bin, which load_checkpoint then
// uses with a warning; at every instant one of the two names holds a complete, verified file.
//
// Note [checkpoint checks]: load checks, in order, the magic, the version (so an old file gets a
// clear "version 1" error, not a checksum one), the header size, every field's range and the
// fields' consistency (global step = epochs x steps per epoch, payload bytes = 8 n), the header's
// CRC32, the parameter count against the model, the file size against the header, then the
// payload's CRC32. Range checks come before the header CRC only to name the field in the error:
// the CRC catches any flip they let through. No length read from the file sizes an allocation
// before it has matched both the model's parameter count and the file size.

CheckpointError::CheckpointError(const std::string& path, const std::string& field,
                                 const std::string& what)
    : Error("checkpoint " + path + ": " + what), path_(path), field_(field), detail_(what) {}

CheckpointIoError::CheckpointIoError(const std::string& path, const std::string& what,
                                     int native_code)
    : CheckpointError(path, "", what), native_code_(native_code) {}

namespace {

constexpr char kMagic[8] = {'M', 'W', 'M', 'S', 'C', 'K', 'P', 'T'};
constexpr std::size_t kHeaderBytes = kCheckpointHeaderBytes;
constexpr std::size_t kHeaderCrcCovers = 76;  // bytes [0, 76) are covered by the header CRC

// Field offsets (checkpoint.h).
constexpr std::size_t kOffVersion = 8, kOffHeaderBytes = 12, kOffEpochs = 16, kOffSteps = 24,
                      kOffGlobalStep = 32, kOffCount = 40, kOffPayload = 48, kOffSeed = 56,
                      kOffBatch = 64, kOffPayloadCrc = 72, kOffHeaderCrc = 76;

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  const int err = errno;
  throw CheckpointIoError(path, what + " " + path + ": " + std::strerror(err), err);
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

std::uint32_t crc32_of(std::uint32_t crc, const void* data, std::size_t bytes) {
  return static_cast<std::uint32_t>(
      ::crc32_z(crc, static_cast<const Bytef*>(data), static_cast<z_size_t>(bytes)));
}

std::uint32_t payload_crc(const std::vector<float>& params, const std::vector<float>& velocity) {
  std::uint32_t crc = static_cast<std::uint32_t>(::crc32_z(0, Z_NULL, 0));
  crc = crc32_of(crc, params.data(), params.size() * sizeof(float));
  return crc32_of(crc, velocity.data(), velocity.size() * sizeof(float));
}

std::uint32_t header_crc(const unsigned char* header) {
  return crc32_of(static_cast<std::uint32_t>(::crc32_z(0, Z_NULL, 0)), header, kHeaderCrcCovers);
}

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

// Reads up to `bytes`; returns how many arrived before end of file.
std::size_t read_up_to(int fd, void* data, std::size_t bytes, const std::string& path) {
  auto* p = static_cast<unsigned char*>(data);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::read(fd, p + got, bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("cannot read", path);
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got;
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

// Makes renames in `dir` durable: without this a power loss can forget the new names.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open directory for fsync", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    errno = err;
    fail_errno("cannot fsync directory", dir);
  }
}

// Closes the descriptor on every path out of read_checkpoint_file.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

std::string field_text(const char* name, std::size_t offset) {
  return std::string("field ") + name + " (offset " + std::to_string(offset) + ")";
}

// Throws unless lo <= v <= hi, naming the field (Note [checkpoint checks]).
void check_range(const std::string& path, const char* name, std::size_t offset, std::uint64_t v,
                 std::uint64_t lo, std::uint64_t hi) {
  if (v >= lo && v <= hi) return;
  throw CheckpointCorruptError(path, name,
                               field_text(name, offset) + " is " + std::to_string(v) +
                                   ", outside [" + std::to_string(lo) + ", " +
                                   std::to_string(hi) + "]");
}

void check_fields(const std::string& path, const unsigned char* h) {
  const std::uint64_t epochs = get_u64(h + kOffEpochs);
  const std::uint64_t steps = get_u64(h + kOffSteps);
  const std::uint64_t count = get_u64(h + kOffCount);
  check_range(path, "epochs_completed", kOffEpochs, epochs, 0, kMaxCheckpointEpochs);
  check_range(path, "steps_per_epoch", kOffSteps, steps, 0, kMaxCheckpointSteps);
  // Both bounded above: the product cannot overflow (2^20 x 2^31).
  const std::uint64_t global_step = get_u64(h + kOffGlobalStep);
  if (global_step != epochs * steps) {
    throw CheckpointCorruptError(
        path, "global_step",
        field_text("global_step", kOffGlobalStep) + " is " + std::to_string(global_step) +
            ", inconsistent with " + std::to_string(epochs) + " epochs x " +
            std::to_string(steps) + " steps per epoch");
  }
  check_range(path, "param_count", kOffCount, count, 1, kMaxCheckpointParams);
  const std::uint64_t payload = get_u64(h + kOffPayload);
  if (payload != 2 * count * sizeof(float)) {
    throw CheckpointCorruptError(path, "payload_bytes",
                                 field_text("payload_bytes", kOffPayload) + " is " +
                                     std::to_string(payload) + ", inconsistent with " +
                                     std::to_string(count) + " parameters (expected " +
                                     std::to_string(2 * count * sizeof(float)) + ")");
  }
  check_range(path, "global_batch_size", kOffBatch, get_u64(h + kOffBatch), 1,
              kMaxCheckpointBatch);
}

// The version check, with the story of version 1 (Note [checkpoint checks]).
void check_version(const std::string& path, std::uint32_t version) {
  if (version == kCheckpointVersion) return;
  if (version == 1) {
    throw CheckpointFormatError(
        path, "version",
        "format version 1 (written by an older train, whose checksum covered only the payload); "
        "this train reads version " + std::to_string(kCheckpointVersion) +
            " only: move the file away and train from scratch, or resume with the older build");
  }
  throw CheckpointFormatError(path, "version",
                              field_text("version", kOffVersion) + " is " +
                                  std::to_string(version) + ", this train reads version " +
                                  std::to_string(kCheckpointVersion));
}

void validate_for_save(const std::string& path, const Checkpoint& c) {
  const auto bad = [&](const char* field, const std::string& what) {
    return CheckpointError(path, field, std::string("refusing to write: ") + what);
  };
  if (c.params.size() != c.velocity.size()) {
    throw bad("param_count", "parameter and momentum sizes differ (" +
                                 std::to_string(c.params.size()) + " vs " +
                                 std::to_string(c.velocity.size()) + ")");
  }
  const auto range = [&](const char* field, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
    if (v < lo || v > hi) {
      throw bad(field, std::string(field) + " is " + std::to_string(v) + ", outside [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  };
  if (c.epochs_completed < 0) {
    throw bad("epochs_completed",
              "epochs_completed is negative (" + std::to_string(c.epochs_completed) + ")");
  }
  range("epochs_completed", static_cast<std::uint64_t>(c.epochs_completed), 0,
        kMaxCheckpointEpochs);
  range("steps_per_epoch", c.steps_per_epoch, 0, kMaxCheckpointSteps);
  range("param_count", c.params.size(), 1, kMaxCheckpointParams);
  range("global_batch_size", c.global_batch_size, 1, kMaxCheckpointBatch);
}

void encode_header(const Checkpoint& c, unsigned char* h) {
  std::memset(h, 0, kHeaderBytes);
  std::memcpy(h, kMagic, sizeof kMagic);
  put_u32(h + kOffVersion, kCheckpointVersion);
  put_u32(h + kOffHeaderBytes, static_cast<std::uint32_t>(kHeaderBytes));
  const auto epochs = static_cast<std::uint64_t>(c.epochs_completed);
  put_u64(h + kOffEpochs, epochs);
  put_u64(h + kOffSteps, c.steps_per_epoch);
  put_u64(h + kOffGlobalStep, epochs * c.steps_per_epoch);
  put_u64(h + kOffCount, c.params.size());
  put_u64(h + kOffPayload, 2 * c.params.size() * sizeof(float));
  put_u64(h + kOffSeed, c.seed);
  put_u64(h + kOffBatch, c.global_batch_size);
  put_u32(h + kOffPayloadCrc, payload_crc(c.params, c.velocity));
  put_u32(h + kOffHeaderCrc, header_crc(h));
}

// Writes, fsyncs and closes `tmp`; removes it on failure.
void write_temp(const std::string& tmp, const unsigned char* header, const Checkpoint& c) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("cannot create", tmp);
  const std::size_t payload = c.params.size() * sizeof(float);
  try {
    write_all(fd, header, kHeaderBytes, tmp);
    write_all(fd, c.params.data(), payload, tmp);
    write_all(fd, c.velocity.data(), payload, tmp);
    if (::fsync(fd) != 0) fail_errno("cannot fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail_errno("cannot close", tmp);
  }
}

// `e`'s class and fields with `note` appended to its message.
[[noreturn]] void rethrow_with(const CheckpointError& e, const std::string& note) {
  const std::string what = e.detail() + note;
  if (const auto* io = dynamic_cast<const CheckpointIoError*>(&e)) {
    throw CheckpointIoError(e.path(), what, io->native_code());
  }
  if (dynamic_cast<const CheckpointFormatError*>(&e) != nullptr) {
    throw CheckpointFormatError(e.path(), e.field(), what);
  }
  if (dynamic_cast<const CheckpointCorruptError*>(&e) != nullptr) {
    throw CheckpointCorruptError(e.path(), e.field(), what);
  }
  if (dynamic_cast<const CheckpointMismatchError*>(&e) != nullptr) {
    throw CheckpointMismatchError(e.path(), e.field(), what);
  }
  throw CheckpointError(e.path(), e.field(), what);
}

bool is_missing(const CheckpointError& e) {
  const auto* io = dynamic_cast<const CheckpointIoError*>(&e);
  return io != nullptr && io->native_code() == ENOENT;
}

}  // namespace

std::string checkpoint_path(const std::string& dir) { return dir + "/ckpt.bin"; }

// Note [checkpoint temporaries]: a writer killed between creating its temporary and renaming it
// leaves `ckpt.bin.tmp.<host>.<pid>` behind, as large as the model, and nothing else would ever
// remove it. The name says who wrote it: one of this host's whose process no longer exists
// (kill(pid, 0) fails with ESRCH) is a dead writer's and removed; one of a live process (a
// writer at work, or a recycled pid: kept, never guessed at) or of another host (a shared
// directory) is left alone. Names of the earlier format, `ckpt.bin.tmp.<pid>`, count as this
// host's.
std::string remove_stale_temporaries(const std::string& dir) {
  const std::string prefix = "ckpt.bin.tmp.";
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (d == nullptr) return "";
  std::string removed, failed;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const std::size_t dot = rest.rfind('.');
    const std::string owner = dot == std::string::npos ? host : rest.substr(0, dot);
    const std::string pid_text = dot == std::string::npos ? rest : rest.substr(dot + 1);
    if (owner != host || pid_text.empty() || pid_text.size() > 9 ||
        pid_text.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const long pid = std::stol(pid_text);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 ||
        errno != ESRCH) {
      continue;
    }
    const std::string path = dir + "/" + name;
    if (::unlink(path.c_str()) == 0) {
      removed += (removed.empty() ? "" : ", ") + name;
    } else if (errno != ENOENT) {
      failed += (failed.empty() ? "" : ", ") + name + " (" + std::strerror(errno) + ")";
    }
  }
  std::string text;
  if (!removed.empty()) {
    text = "removed the temporaries of checkpoint writers that died before renaming them: " +
           removed;
  }
  if (!failed.empty()) {
    text += (text.empty() ? "" : "; ") +
            std::string("cannot remove dead writers' checkpoint temporaries: ") + failed;
  }
  return text;
}
std::string previous_checkpoint_path(const std::string& dir) { return dir + "/ckpt.prev.bin"; }

std::string save_checkpoint(const std::string& dir, const Checkpoint& ckpt) {
  const std::string path = checkpoint_path(dir);
  if (!host_is_little_endian()) {
    throw CheckpointError(path, "", "checkpoints need a little-endian host");
  }
  validate_for_save(path, ckpt);
  make_dirs(dir);
  unsigned char header[kHeaderBytes];
  encode_header(ckpt, header);
  // Same directory as the target so that rename() is atomic (same file system).
  // Note [checkpoint temporaries].
  std::string warning = remove_stale_temporaries(dir);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::string tmp = path + ".tmp." + host + "." + std::to_string(::getpid());
  write_temp(tmp, header, ckpt);
  // Note [checkpoint rotation]: keep the current newest as the previous one if it verifies.
  bool rotate = false;
  try {
    read_checkpoint_file(path, ckpt.params.size());
    rotate = true;
  } catch (const CheckpointError& e) {
    if (!is_missing(e)) {
      warning += std::string(warning.empty() ? "" : "; ") +
                 "replacing an unusable newest checkpoint without keeping it as the previous "
                 "one (" + e.what() + ")";
    }
  }
  const std::string prev = previous_checkpoint_path(dir);
  if (rotate) {
    if (::rename(path.c_str(), prev.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      errno = err;
      fail_errno("cannot rename " + path + " to", prev);
    }
    fsync_dir(dir);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail_errno("cannot rename " + tmp + " to", path);
  }
  fsync_dir(dir);
  return warning;
}

Checkpoint read_checkpoint_file(const std::string& path, std::size_t expected_params) {
  if (!host_is_little_endian()) {
    throw CheckpointError(path, "", "checkpoints need a little-endian host");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", path);
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno("cannot stat", path);
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  unsigned char h[kHeaderBytes] = {};
  const std::size_t got = read_up_to(fd, h, kHeaderBytes, path);
  const auto truncated = [&](std::size_t needed) {
    return CheckpointCorruptError(path, "size",
                                  "truncated: " + std::to_string(got) + " bytes, shorter than "
                                  "the " + std::to_string(needed) + "-byte header");
  };
  // Note [checkpoint checks], in order.
  if (got < sizeof kMagic) throw truncated(kHeaderBytes);
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    throw CheckpointFormatError(path, "magic", "not a checkpoint (bad magic, expected MWMSCKPT)");
  }
  if (got < kOffEpochs) throw truncated(kHeaderBytes);
  check_version(path, get_u32(h + kOffVersion));
  if (get_u32(h + kOffHeaderBytes) != kHeaderBytes) {
    throw CheckpointCorruptError(path, "header_bytes",
                                 field_text("header_bytes", kOffHeaderBytes) + " is " +
                                     std::to_string(get_u32(h + kOffHeaderBytes)) + ", expected " +
                                     std::to_string(kHeaderBytes));
  }
  if (got < kHeaderBytes) throw truncated(kHeaderBytes);
  check_fields(path, h);
  if (header_crc(h) != get_u32(h + kOffHeaderCrc)) {
    throw CheckpointCorruptError(path, "header_crc32",
                                 "header checksum mismatch (CRC32 of bytes 0-75 is not the one "
                                 "stored at offset 76): the header is corrupt");
  }
  const std::uint64_t count = get_u64(h + kOffCount);
  if (count != expected_params) {
    throw CheckpointMismatchError(path, "param_count",
                                  "holds " + std::to_string(count) + " parameters, the model "
                                  "has " + std::to_string(expected_params) +
                                      " (another model or layer sizes)");
  }
  const std::uint64_t expected_bytes = kHeaderBytes + get_u64(h + kOffPayload);
  if (file_bytes != expected_bytes) {
    throw CheckpointCorruptError(path, "size",
                                 (file_bytes < expected_bytes ? "truncated: " : "overlong: ") +
                                     std::to_string(file_bytes) + " bytes, the header says " +
                                     std::to_string(expected_bytes));
  }
  Checkpoint c;
  c.epochs_completed = static_cast<std::int64_t>(get_u64(h + kOffEpochs));
  c.steps_per_epoch = get_u64(h + kOffSteps);
  c.seed = get_u64(h + kOffSeed);
  c.global_batch_size = get_u64(h + kOffBatch);
  c.params.resize(count);
  c.velocity.resize(count);
  const std::size_t payload = count * sizeof(float);
  if (read_up_to(fd, c.params.data(), payload, path) != payload ||
      read_up_to(fd, c.velocity.data(), payload, path) != payload) {
    throw CheckpointCorruptError(path, "size", "truncated while reading (the file shrank)");
  }
  if (payload_crc(c.params, c.velocity) != get_u32(h + kOffPayloadCrc)) {
    throw CheckpointCorruptError(path, "payload_crc32",
                                 "payload checksum mismatch (parameters or momentum corrupt)");
  }
  return c;
}

std::optional<LoadedCheckpoint> load_checkpoint(const std::string& dir,
                                                std::size_t expected_params) {
  const std::string newest = checkpoint_path(dir);
  const std::string prev = previous_checkpoint_path(dir);
  try {
    return LoadedCheckpoint{read_checkpoint_file(newest, expected_params), newest, ""};
  } catch (const CheckpointError& e) {
    const bool missing = is_missing(e);
    LoadedCheckpoint out;
    try {
      out.checkpoint = read_checkpoint_file(prev, expected_params);
    } catch (const CheckpointError& p) {
      if (missing && is_missing(p)) return std::nullopt;
      if (missing) throw;  // only the previous one exists, and it is unusable
      rethrow_with(e, is_missing(p) ? std::string(" (no previous checkpoint to fall back to)")
                                    : "; the previous checkpoint is unusable too: " +
                                          std::string(p.what()));
    }
    out.path = prev;
    out.warning = (missing ? "the newest checkpoint " + newest + " is missing"
                           : std::string("the newest checkpoint is unusable: ") + e.what()) +
                  "; falling back to the previous checkpoint " + prev + " (" +
                  std::to_string(out.checkpoint.epochs_completed) + " epoch(s) completed)";
    return out;
  }
}

}  // namespace mwms::train
