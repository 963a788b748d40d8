#include "strategy/ps/ps_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "mwms/optimizer.h"

namespace mwms::strategy::ps {

namespace {

// The integers are encoded byte by byte, but the floats go to disk as the caller's buffers hold
// them (no copy: Note [ps checkpoint files]), which is the format only on a little-endian host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "ps checkpoints need a little-endian host");

constexpr char kShardMagic[8] = {'M', 'W', 'M', 'S', 'P', 'S', 'S', 'H'};
constexpr char kManifestMagic[8] = {'M', 'W', 'M', 'S', 'P', 'S', 'M', 'F'};
constexpr std::size_t kMaxNameBytes = 1024;
constexpr std::size_t kRecordBytes = 28;  // a shard record without its name
constexpr std::size_t kEntryBytes = 20;   // a manifest entry
constexpr std::string_view kPrefix = "model.ckpt-";

// Little-endian, byte by byte: no struct layout or host order reaches the file.
template <class T>
void put(unsigned char* p, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
template <class T>
T get(const unsigned char* p) {
  T v = 0;
  for (std::size_t i = sizeof(T); i-- > 0;) v = static_cast<T>((v << 8) | p[i]);
  return v;
}
template <class T>
void append(std::string& s, T v) {
  unsigned char b[sizeof(T)];
  put(b, v);
  s.append(reinterpret_cast<const char*>(b), sizeof b);
}
constexpr auto get_u32 = get<std::uint32_t>;
constexpr auto get_u64 = get<std::uint64_t>;

// zlib's crc32 restarts at 0 when given a null buffer, so an empty part must not reach it.
std::uint32_t crc_of(std::uint32_t crc, const void* data, std::size_t bytes) {
  if (bytes == 0) return crc;
  return static_cast<std::uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}
std::string dir_or_dot(const std::string& dir) { return dir.empty() ? "." : dir; }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError("checkpoint " + path + ": " + what, path);
}

// A failed system call on `object` (the temporary, the directory or `path` itself). Running out
// of disk space or descriptors is said in so many words: the cure lies outside the checkpoint.
[[noreturn]] void fail_errno(const std::string& path, const char* call, const std::string& object,
                             int err) {
  std::string what = std::string(call) + "(" + object + ") failed: " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) what += " (resource exhausted: disk space or quota)";
  if (err == EMFILE || err == ENFILE) what += " (resource exhausted: open file descriptors)";
  if (err == ENOMEM) what += " (resource exhausted: memory)";
  fail(path, what);
}

void check_range(const std::string& path, const char* field, std::size_t offset, std::uint64_t v,
                 std::uint64_t lo, std::uint64_t hi) {
  if (v >= lo && v <= hi) return;
  fail(path, std::string("field ") + field + " (offset " + std::to_string(offset) + ") is " +
                 std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
}

void check_crc(const std::string& path, const char* what, std::uint32_t stored,
               std::uint32_t computed) {
  if (stored == computed) return;
  fail(path, std::string(what) + " CRC32 mismatch (stored " + hex32(stored) + ", computed " +
                 hex32(computed) + ")");
}

// What both formats start with (Note [ps checkpoint files]): magic, version and header size say
// how to read the rest; the header CRC comes next, so that a flipped bit in a field is reported
// as damage, and a field out of range behind a good CRC as a foreign or broken writer.
void check_header_start(const unsigned char* h, std::size_t avail, const char (&magic)[8],
                        const char* kind, std::uint32_t version, std::size_t header_bytes,
                        const std::string& path) {
  if (avail < header_bytes) {
    fail(path, "truncated: " + std::to_string(avail) + " bytes, less than the " +
                   std::to_string(header_bytes) + "-byte header");
  }
  if (std::memcmp(h, magic, sizeof magic) != 0) fail(path, std::string("not a ") + kind);
  check_range(path, "format version", 8, get_u32(h + 8), version, version);
  check_range(path, "header bytes", 12, get_u32(h + 12), header_bytes, header_bytes);
  check_crc(path, "header", get_u32(h + header_bytes - 4), crc_of(0, h, header_bytes - 4));
}

// The header states the payload's size; the file must be exactly header + payload.
void check_file_size(const std::string& path, std::uint64_t file_bytes, std::size_t header_bytes,
                     std::uint64_t payload) {
  if (file_bytes - header_bytes == payload) return;
  fail(path, "file is " + std::to_string(file_bytes) + " bytes, its header states " +
                 std::to_string(header_bytes) + " + " + std::to_string(payload) +
                 " (truncated or overlong)");
}

struct ShardHeader {
  std::uint32_t ps_index, num_ps, count, payload_crc;
  std::uint64_t step, version, payload;
  std::uint8_t optimizer;
};

bool known_optimizer(std::uint8_t v) {
  return mwms::to_string(static_cast<OptimizerKind>(v)) != "unknown";
}

ShardHeader parse_shard_header(const unsigned char* h, std::size_t avail, std::uint64_t file_bytes,
                               const std::string& path) {
  check_header_start(h, avail, kShardMagic, "ps shard file (bad magic)", kShardFileVersion,
                     kShardHeaderBytes, path);
  ShardHeader s{get_u32(h + 16), get_u32(h + 20), get_u32(h + 40), get_u32(h + 56),
                get_u64(h + 24), get_u64(h + 32), get_u64(h + 48), h[44]};
  check_range(path, "num_ps", 20, s.num_ps, 1, kMaxCheckpointPs);
  check_range(path, "ps_index", 16, s.ps_index, 0, s.num_ps - 1);
  check_range(path, "shard count", 40, s.count, 0, kMaxCheckpointShards);
  if (!known_optimizer(s.optimizer)) {
    fail(path, "field optimizer (offset 44) is " + std::to_string(s.optimizer) +
                   ", not a known optimizer");
  }
  for (std::size_t i = 45; i < 48; ++i) check_range(path, "reserved", i, h[i], 0, 0);
  // Each record takes at least kRecordBytes: a count the payload cannot hold is refused here,
  // before anything is reserved for it.
  if (s.payload / kRecordBytes < s.count) {
    fail(path, "field payload bytes (offset 48) is " + std::to_string(s.payload) +
                   ", too small for " + std::to_string(s.count) + " shard records");
  }
  check_file_size(path, file_bytes, kShardHeaderBytes, s.payload);
  return s;
}

struct ManifestHeader {
  std::uint64_t step, payload;
  std::uint32_t num_ps, user_bytes, payload_crc;
};

ManifestHeader parse_manifest_header(const unsigned char* h, std::size_t avail,
                                     std::uint64_t file_bytes, const std::string& path) {
  check_header_start(h, avail, kManifestMagic, "checkpoint manifest (bad magic)", kManifestVersion,
                     kManifestHeaderBytes, path);
  ManifestHeader m{get_u64(h + 16), get_u64(h + 32), get_u32(h + 24), get_u32(h + 28),
                   get_u32(h + 40)};
  check_range(path, "num_ps", 24, m.num_ps, 1, kMaxCheckpointPs);
  check_range(path, "user state bytes", 28, m.user_bytes, 0, kMaxUserStateBytes);
  const std::uint64_t want = std::uint64_t{m.num_ps} * kEntryBytes + m.user_bytes;
  check_range(path, "payload bytes", 32, m.payload, want, want);
  check_file_size(path, file_bytes, kManifestHeaderBytes, m.payload);
  return m;
}

// Closes a descriptor on every way out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void read_exact(int fd, void* data, std::size_t bytes, const std::string& path) {
  auto* p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::pread(fd, p + got, bytes - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno(path, "pread", path, errno);
    if (n == 0) fail(path, "the file shrank while it was read");
    got += static_cast<std::size_t>(n);
  }
}

// Reads the file whole, in two steps: the header alone first, verified and compared with the
// size fstat gives, so that nothing is allocated for a payload the file does not hold.
template <class ParseHeader>
std::string read_whole(const std::string& path, std::size_t header_bytes, ParseHeader parse) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0 && errno == ENOENT) fail(path, "the file does not exist");
  if (f.fd < 0) fail_errno(path, "open", path, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail_errno(path, "fstat", path, errno);
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  unsigned char head[kShardHeaderBytes];  // the larger of the two headers
  const std::size_t avail = static_cast<std::size_t>(std::min<std::uint64_t>(size, header_bytes));
  read_exact(f.fd, head, avail, path);
  parse(head, avail, size, path);
  std::string all(static_cast<std::size_t>(size), '\0');
  read_exact(f.fd, all.data(), all.size(), path);
  return all;
}

// Note [ps checkpoint files]: the temporary lives in the final file's directory (rename() is
// atomic only within one file system) and is removed on every way out but the rename.
struct TempFile {
  std::string name;
  int fd = -1;
  bool renamed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!renamed && !name.empty()) ::unlink(name.c_str());
  }
};

void write_parts(int fd, std::vector<iovec> iov, const std::string& tmp, const std::string& path) {
  // Empty parts (no records, no values) would make writev return 0 with work left to do.
  iov.erase(std::remove_if(iov.begin(), iov.end(), [](const iovec& v) { return v.iov_len == 0; }),
            iov.end());
  std::size_t i = 0;
  while (i < iov.size()) {
    const int n_iov = static_cast<int>(std::min<std::size_t>(iov.size() - i, IOV_MAX));
    ssize_t n = ::writev(fd, &iov[i], n_iov);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno(path, "writev", tmp, errno);
    if (n == 0) fail_errno(path, "writev", tmp, EIO);  // no progress: never loop for ever
    while (n > 0) {  // a short write: skip what went out, resume inside the part it stopped in
      const std::size_t done = std::min(static_cast<std::size_t>(n), iov[i].iov_len);
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + done;
      iov[i].iov_len -= done;
      n -= static_cast<ssize_t>(done);
      if (iov[i].iov_len == 0) ++i;
    }
  }
}

// Creates `dir` (one level), writes `parts` to a temporary beside `path`, fsyncs it, renames it
// onto `path` and fsyncs `dir`, so that after a crash `path` is either the old file or the whole
// new one, and a returned call survives a power loss.
void write_atomically(const std::string& dir, const std::string& path, std::vector<iovec> parts) {
  if (!dir.empty() && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    fail_errno(path, "mkdir", dir, errno);
  }
  TempFile t;
  std::string name = path + ".tmp.XXXXXX";
  t.fd = ::mkostemp(name.data(), O_CLOEXEC);  // mkstemp, not inherited by a forked child
  if (t.fd < 0) fail_errno(path, "mkstemp", path + ".tmp.XXXXXX", errno);  // name may be altered
  t.name = name;
  // mkstemp creates 0600; checkpoints are data files, readable like those open(2) makes.
  if (::fchmod(t.fd, 0644) != 0) fail_errno(path, "fchmod", name, errno);
  write_parts(t.fd, std::move(parts), name, path);
  if (::fsync(t.fd) != 0) fail_errno(path, "fsync", name, errno);
  const int rc = ::close(t.fd);
  t.fd = -1;
  if (rc != 0) fail_errno(path, "close", name, errno);
  if (::rename(name.c_str(), path.c_str()) != 0) fail_errno(path, "rename", name, errno);
  t.renamed = true;
  Fd d{::open(dir_or_dot(dir).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) fail_errno(path, "open", dir_or_dot(dir), errno);
  // Some file systems cannot fsync a directory at all (EINVAL); there is nothing more to do.
  if (::fsync(d.fd) != 0 && errno != EINVAL) fail_errno(path, "fsync", dir_or_dot(dir), errno);
}

iovec part(const void* data, std::size_t bytes) { return iovec{const_cast<void*>(data), bytes}; }

void check_view(const std::string& path, const ShardFileView& v) {
  const auto refuse = [&](const std::string& why) { fail(path, "refusing to write: " + why); };
  if (v.num_ps < 1 || v.num_ps > kMaxCheckpointPs || v.ps_index >= v.num_ps) {
    refuse("ps " + std::to_string(v.ps_index) + " of " + std::to_string(v.num_ps));
  }
  if (v.shards == nullptr || v.shards->size() > kMaxCheckpointShards) {
    refuse("no shard list, or more than " + std::to_string(kMaxCheckpointShards) + " shards");
  }
  if (!known_optimizer(v.optimizer)) refuse("unknown optimizer " + std::to_string(v.optimizer));
  const int slots = num_slots(static_cast<OptimizerKind>(v.optimizer));
  if (v.slots.size() != static_cast<std::size_t>(slots)) {
    refuse(std::to_string(v.slots.size()) + " slot buffers, the optimizer keeps " +
           std::to_string(slots));
  }
  std::uint64_t total = 0;
  for (const ShardDescription& s : *v.shards) {
    if (s.name.size() > kMaxNameBytes) refuse("a shard name is too long: " + s.name.substr(0, 64));
    if (s.count > UINT64_MAX - total) refuse("shard counts overflow");
    total += s.count;
  }
  if (total > SIZE_MAX / sizeof(float) / (1 + v.slots.size())) refuse("more floats than memory");
  if (total != v.total) {
    refuse("the shards hold " + std::to_string(total) + " elements, total is " +
           std::to_string(v.total));
  }
  const bool null_slot = std::find(v.slots.begin(), v.slots.end(), nullptr) != v.slots.end();
  if (v.total > 0 && (v.values == nullptr || null_slot)) refuse("a null buffer");
}

}  // namespace

std::string shard_file_path(const std::string& dir, std::uint64_t step, std::uint32_t ps_index,
                            std::uint32_t num_ps) {
  return join(dir, std::string(kPrefix) + std::to_string(step) + ".ps-" + std::to_string(ps_index) +
                       "-of-" + std::to_string(num_ps));
}

std::string manifest_path(const std::string& dir, std::uint64_t step) {
  return join(dir, std::string(kPrefix) + std::to_string(step) + ".manifest");
}

ManifestEntry write_shard_file(const std::string& dir, const ShardFileView& v) {
  const std::string path = shard_file_path(dir, v.checkpoint_step, v.ps_index, v.num_ps);
  check_view(path, v);
  std::string records;  // small: the float payload is written from the view's buffers
  for (const ShardDescription& s : *v.shards) {
    append<std::uint32_t>(records, s.variable);
    append<std::uint32_t>(records, s.shard);
    append<std::uint64_t>(records, s.element_offset);
    append<std::uint64_t>(records, s.count);
    append<std::uint32_t>(records, static_cast<std::uint32_t>(s.name.size()));
    records += s.name;
  }
  const std::size_t float_bytes = v.total * sizeof(float);
  const std::uint64_t payload = records.size() + float_bytes * (1 + v.slots.size());
  std::uint32_t crc = crc_of(0, records.data(), records.size());
  crc = crc_of(crc, v.values, float_bytes);
  for (const float* slot : v.slots) crc = crc_of(crc, slot, float_bytes);

  unsigned char h[kShardHeaderBytes] = {};
  std::memcpy(h, kShardMagic, sizeof kShardMagic);
  put<std::uint32_t>(h + 8, kShardFileVersion);
  put<std::uint32_t>(h + 12, static_cast<std::uint32_t>(kShardHeaderBytes));
  put<std::uint32_t>(h + 16, v.ps_index);
  put<std::uint32_t>(h + 20, v.num_ps);
  put<std::uint64_t>(h + 24, v.checkpoint_step);
  put<std::uint64_t>(h + 32, v.version);
  put<std::uint32_t>(h + 40, static_cast<std::uint32_t>(v.shards->size()));
  h[44] = v.optimizer;
  put<std::uint64_t>(h + 48, payload);
  put<std::uint32_t>(h + 56, crc);
  put<std::uint32_t>(h + 60, crc_of(0, h, 60));

  std::vector<iovec> parts{part(h, sizeof h), part(records.data(), records.size()),
                           part(v.values, float_bytes)};
  for (const float* slot : v.slots) parts.push_back(part(slot, float_bytes));
  write_atomically(dir, path, std::move(parts));
  // The whole file's CRC from its two parts' without reading the payload a second time.
  const auto file_crc = static_cast<std::uint32_t>(
      ::crc32_combine(crc_of(0, h, sizeof h), crc, static_cast<z_off_t>(payload)));
  return ManifestEntry{v.version, kShardHeaderBytes + payload, file_crc};
}

ShardFile decode_shard_file(const char* data, std::size_t bytes, const std::string& path) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  const ShardHeader h = parse_shard_header(p, bytes, bytes, path);
  const unsigned char* payload = p + kShardHeaderBytes;  // h.payload bytes, checked against `bytes`
  check_crc(path, "payload", h.payload_crc, crc_of(0, payload, h.payload));
  ShardFile f{h.ps_index, h.num_ps, h.step, h.version, h.optimizer, {}, {}, {}};
  f.shards.reserve(h.count);  // bounded by payload / kRecordBytes (parse_shard_header)
  std::uint64_t at = 0;
  std::uint64_t total = 0;
  const std::uint64_t max_floats = h.payload / sizeof(float);
  for (std::uint32_t i = 0; i < h.count; ++i) {
    const std::uint64_t start = at;
    const auto rec = [&] {
      return "shard record " + std::to_string(i) + " (payload offset " + std::to_string(start) +
             ")";
    };
    if (h.payload - at < kRecordBytes) fail(path, rec() + " is truncated");
    ShardDescription s;
    s.variable = get_u32(payload + at);
    s.shard = get_u32(payload + at + 4);
    s.element_offset = get_u64(payload + at + 8);
    s.count = get_u64(payload + at + 16);
    const std::uint32_t name_bytes = get_u32(payload + at + 24);
    at += kRecordBytes;
    if (name_bytes > kMaxNameBytes || name_bytes > h.payload - at) {
      fail(path, rec() + ": name of " + std::to_string(name_bytes) + " bytes (at most " +
                     std::to_string(kMaxNameBytes) + ", " + std::to_string(h.payload - at) +
                     " left)");
    }
    s.name.assign(reinterpret_cast<const char*>(payload + at), name_bytes);
    at += name_bytes;
    if (s.count > max_floats - total || s.element_offset > UINT64_MAX - s.count) {
      fail(path, rec() + ": " + std::to_string(s.count) + " elements at offset " +
                     std::to_string(s.element_offset) + ", more than the payload holds");
    }
    total += s.count;
    f.shards.push_back(std::move(s));
  }
  // Exactly the floats the records and the optimizer's slots call for, no byte more or less.
  const std::uint64_t copies =
      1 + static_cast<std::uint64_t>(num_slots(static_cast<OptimizerKind>(h.optimizer)));
  const std::uint64_t float_bytes = h.payload - at;
  const std::uint64_t floats = float_bytes / sizeof(float);
  if (float_bytes % sizeof(float) != 0 || floats % copies != 0 || floats / copies != total) {
    fail(path, "payload holds " + std::to_string(float_bytes) + " bytes after the records, the " +
                   "shards need " + std::to_string(total) + " floats x " + std::to_string(copies) +
                   " (values and slots)");
  }
  const unsigned char* q = payload + at;  // the values, then each slot: `total` floats each
  const auto take = [&](std::vector<float>& to) {
    to.resize(total);
    if (total > 0) std::memcpy(to.data(), q, total * sizeof(float));  // data() may be null
    q += total * sizeof(float);
  };
  take(f.values);
  f.slots.resize(copies - 1);
  for (std::vector<float>& slot : f.slots) take(slot);
  return f;
}

ShardFile read_shard_file(const std::string& path, const ManifestEntry* expected) {
  const std::string all = read_whole(path, kShardHeaderBytes, parse_shard_header);
  ShardFile f = decode_shard_file(all.data(), all.size(), path);
  if (expected == nullptr) return f;
  // A valid file that is not the one the manifest recorded (left by another save of this step).
  std::string diff;
  const auto differs = [&](const char* what, const std::string& got, const std::string& want) {
    diff += std::string(diff.empty() ? "" : ", ") + what + " " + got + " (the manifest says " +
            want + ")";
  };
  const std::uint32_t crc = crc_of(0, all.data(), all.size());
  if (all.size() != expected->file_bytes) {
    differs("size", std::to_string(all.size()), std::to_string(expected->file_bytes));
  }
  if (crc != expected->file_crc32) differs("CRC32", hex32(crc), hex32(expected->file_crc32));
  if (f.version != expected->version) {
    differs("version", std::to_string(f.version), std::to_string(expected->version));
  }
  if (!diff.empty()) fail(path, "not the file the manifest recorded: " + diff);
  return f;
}

void write_manifest(const std::string& dir, const Manifest& m) {
  const std::string path = manifest_path(dir, m.checkpoint_step);
  if (m.entries.empty() || m.entries.size() > kMaxCheckpointPs ||
      m.user_state.size() > kMaxUserStateBytes) {
    fail(path, "refusing to write: " + std::to_string(m.entries.size()) + " entries, " +
                   std::to_string(m.user_state.size()) + " bytes of user state");
  }
  std::string payload;
  payload.reserve(m.entries.size() * kEntryBytes + m.user_state.size());
  for (const ManifestEntry& e : m.entries) {
    append<std::uint64_t>(payload, e.version);
    append<std::uint64_t>(payload, e.file_bytes);
    append<std::uint32_t>(payload, e.file_crc32);
  }
  payload += m.user_state;
  unsigned char h[kManifestHeaderBytes] = {};
  std::memcpy(h, kManifestMagic, sizeof kManifestMagic);
  put<std::uint32_t>(h + 8, kManifestVersion);
  put<std::uint32_t>(h + 12, static_cast<std::uint32_t>(kManifestHeaderBytes));
  put<std::uint64_t>(h + 16, m.checkpoint_step);
  put<std::uint32_t>(h + 24, static_cast<std::uint32_t>(m.entries.size()));
  put<std::uint32_t>(h + 28, static_cast<std::uint32_t>(m.user_state.size()));
  put<std::uint64_t>(h + 32, payload.size());
  put<std::uint32_t>(h + 40, crc_of(0, payload.data(), payload.size()));
  put<std::uint32_t>(h + 44, crc_of(0, h, 44));
  write_atomically(dir, path, {part(h, sizeof h), part(payload.data(), payload.size())});
}

Manifest decode_manifest(const char* data, std::size_t bytes, const std::string& path) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  const ManifestHeader h = parse_manifest_header(p, bytes, bytes, path);
  const unsigned char* payload = p + kManifestHeaderBytes;  // h.payload bytes, == bytes - 48
  check_crc(path, "payload", h.payload_crc, crc_of(0, payload, h.payload));
  Manifest m;
  m.checkpoint_step = h.step;
  m.entries.resize(h.num_ps);
  for (std::uint32_t i = 0; i < h.num_ps; ++i) {
    const unsigned char* e = payload + std::size_t{i} * kEntryBytes;
    m.entries[i] = ManifestEntry{get_u64(e), get_u64(e + 8), get_u32(e + 16)};
    if (m.entries[i].file_bytes < kShardHeaderBytes) {
      fail(path, "entry " + std::to_string(i) + ": shard file of " +
                     std::to_string(m.entries[i].file_bytes) + " bytes, less than its header");
    }
  }
  m.user_state.assign(reinterpret_cast<const char*>(payload) + h.num_ps * kEntryBytes,
                      h.user_bytes);
  return m;
}

Manifest read_manifest(const std::string& path) {
  const std::string all = read_whole(path, kManifestHeaderBytes, parse_manifest_header);
  return decode_manifest(all.data(), all.size(), path);
}

}  // namespace mwms::strategy::ps
