#include "idx_reader.h"

#include <zlib.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace mwms::train {
namespace {

constexpr std::uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
// Upper bound on the payload we agree to allocate: the header is read from a file we do not
// trust, and a corrupt count must give an error, not a multi-gigabyte allocation.
constexpr std::uint64_t kMaxPayloadBytes = std::uint64_t{1} << 32;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

/// Owns a gzFile; zlib reads plain files through the same calls, so uncompressed IDX works too.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      fail(path, std::string("cannot open: ") + (errno ? std::strerror(errno) : "out of memory"));
    }
    gzbuffer(file_, 1 << 17);  // fewer, larger reads: the training images are 26 MB compressed
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  /// Reads exactly `bytes` bytes or throws, saying how many were expected and found.
  void read_exact(void* dst, std::size_t bytes, const char* what) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t done = 0;
    while (done < bytes) {
      const std::size_t want = std::min<std::size_t>(bytes - done, 1u << 30);
      const int got = gzread(file_, out + done, static_cast<unsigned>(want));
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        fail(path_, std::string("read error in ") + what + ": " + (msg ? msg : "unknown"));
      }
      if (got == 0) {
        fail(path_, std::string("truncated ") + what + ": expected " + std::to_string(bytes) +
                        " bytes, found " + std::to_string(done));
      }
      done += static_cast<std::size_t>(got);
    }
  }

  std::uint32_t read_be32(const char* what) {
    unsigned char b[4];
    read_exact(b, sizeof b, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) |
           (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
  }

  /// Throws when bytes remain after the payload: a header/size disagreement means a corrupt file.
  void expect_end() {
    unsigned char extra;
    if (gzread(file_, &extra, 1) > 0) fail(path_, "unexpected data after the last item");
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

void check_magic(const std::string& path, std::uint32_t magic, std::uint32_t expected,
                 const char* kind) {
  if (magic == expected) return;
  char buf[96];
  std::snprintf(buf, sizeof buf, "bad magic 0x%08x, expected 0x%08x (%s)", magic, expected, kind);
  fail(path, buf);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// `<dir>/<name>.gz` when present, else `<dir>/<name>` (already decompressed).
std::string locate(const std::string& dir, const std::string& name) {
  const std::string base = dir.empty() ? name : dir + "/" + name;
  if (file_exists(base + ".gz")) return base + ".gz";
  if (file_exists(base)) return base;
  throw std::runtime_error("dataset file not found: " + base + ".gz (nor " + base +
                           "); set --data_dir to the Fashion-MNIST directory");
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  GzReader in(path);
  check_magic(path, in.read_be32("header"), kImagesMagic, "IDX3 unsigned-byte images");
  IdxImages out;
  out.count = in.read_be32("header");
  out.rows = in.read_be32("header");
  out.cols = in.read_be32("header");
  if (out.count == 0 || out.rows == 0 || out.cols == 0) {
    fail(path, "zero dimension in header (" + std::to_string(out.count) + " x " +
                   std::to_string(out.rows) + " x " + std::to_string(out.cols) + ")");
  }
  const std::uint64_t bytes = std::uint64_t{out.count} * out.rows * out.cols;
  if (out.rows * out.cols > (1u << 24) || bytes > kMaxPayloadBytes) {
    fail(path, "implausible dimensions " + std::to_string(out.count) + " x " +
                   std::to_string(out.rows) + " x " + std::to_string(out.cols));
  }
  out.pixels.resize(static_cast<std::size_t>(bytes));
  in.read_exact(out.pixels.data(), out.pixels.size(), "image data");
  in.expect_end();
  return out;
}

std::vector<std::uint8_t> read_idx_labels(const std::string& path, int num_classes) {
  GzReader in(path);
  check_magic(path, in.read_be32("header"), kLabelsMagic, "IDX1 unsigned-byte labels");
  const std::uint32_t count = in.read_be32("header");
  if (count == 0) fail(path, "zero labels in header");
  if (count > kMaxPayloadBytes) fail(path, "implausible label count " + std::to_string(count));
  std::vector<std::uint8_t> labels(count);
  in.read_exact(labels.data(), labels.size(), "label data");
  in.expect_end();
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      fail(path, "label " + std::to_string(labels[i]) + " at item " + std::to_string(i) +
                     " is not below " + std::to_string(num_classes));
    }
  }
  return labels;
}

Dataset load_split(const std::string& dir, const std::string& split, int num_classes) {
  const std::string images_path = locate(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = locate(dir, split + "-labels-idx1-ubyte");
  Dataset ds;
  ds.images = read_idx_images(images_path);
  ds.labels = read_idx_labels(labels_path, num_classes);
  if (ds.images.count != ds.labels.size()) {
    throw std::runtime_error(images_path + " holds " + std::to_string(ds.images.count) +
                             " images but " + labels_path + " holds " +
                             std::to_string(ds.labels.size()) + " labels");
  }
  return ds;
}

}  // namespace mwms::train
