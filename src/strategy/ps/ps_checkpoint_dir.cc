// The checkpoint directory of Note [ps checkpoint files] (ps_checkpoint.h): which checkpoints
// it holds (by their manifests' names alone) and the removal of old ones (TF's max_to_keep).
// The files' contents are ps_checkpoint.cc's.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string_view>

#include "common/logging.h"
#include "strategy/ps/ps_checkpoint.h"

namespace mwms::strategy::ps {

namespace {

constexpr std::string_view kPrefix = "model.ckpt-";

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// A decimal number exactly as std::to_string writes it: digits only (no sign, no space), no
// leading zero, no overflow, so that a listed step names the file manifest_path() gives.
std::optional<std::uint64_t> parse_decimal(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// A file of Note [ps checkpoint files]: a manifest, a shard file, or a temporary of either.
struct CheckpointFile {
  std::string name;
  std::uint64_t step = 0;
  bool manifest = false;  // exactly model.ckpt-<step>.manifest
};

std::optional<CheckpointFile> classify(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string_view::npos) return std::nullopt;
  const auto step = parse_decimal(name.substr(kPrefix.size(), dot - kPrefix.size()));
  std::string_view rest = name.substr(dot + 1);
  const std::size_t tmp = rest.find(".tmp.");
  const bool temporary = tmp != std::string_view::npos;
  if (!step || rest.empty()) return std::nullopt;
  if (temporary) rest = rest.substr(0, tmp);
  if (rest == "manifest") return CheckpointFile{std::string(name), *step, !temporary};
  const std::size_t of = rest.find("-of-");
  if (rest.substr(0, 3) != "ps-" || of == std::string_view::npos ||
      !parse_decimal(rest.substr(3, of - 3)) || !parse_decimal(rest.substr(of + 4))) {
    return std::nullopt;
  }
  return CheckpointFile{std::string(name), *step, false};
}

[[noreturn]] void fail_dir(const std::string& dir, const char* call, int err) {
  throw CheckpointError(
      "checkpoint directory " + dir + ": " + call + " failed: " + std::strerror(err), dir);
}

// The checkpoint files in `dir`; none when it does not exist (no checkpoint written yet).
std::vector<CheckpointFile> scan(const std::string& dir) {
  const std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.empty() ? "." : dir.c_str()),
                                              ::closedir);
  if (d == nullptr && errno == ENOENT) return {};
  if (d == nullptr) fail_dir(dir, "opendir", errno);
  std::vector<CheckpointFile> files;
  for (;;) {
    errno = 0;  // readdir's end and its failure differ only in errno
    const dirent* e = ::readdir(d.get());
    if (e == nullptr && errno != 0) fail_dir(dir, "readdir", errno);
    if (e == nullptr) return files;
    if (auto f = classify(e->d_name)) files.push_back(std::move(*f));
  }
}

// False (logged) when `name` is still there; a file already gone counts as removed.
bool remove_file(const std::string& dir, const std::string& name) {
  const std::string path = join(dir, name);
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) {
    MWMS_LOG_DEBUG(kStrat, "checkpoint " << path << ": removed");
    return true;
  }
  const int err = errno;  // before logging, which may touch errno
  MWMS_LOG_WARN(
      kStrat, "checkpoint " << path << ": cannot remove it: unlink failed: " << std::strerror(err));
  return false;
}

}  // namespace

std::vector<std::uint64_t> list_checkpoints(const std::string& dir) {
  std::vector<std::uint64_t> steps;
  for (const CheckpointFile& f : scan(dir)) {
    if (f.manifest) steps.push_back(f.step);
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  return steps;
}

void remove_old_checkpoints(const std::string& dir, std::size_t keep) {
  try {
    const std::vector<CheckpointFile> files = scan(dir);
    std::vector<std::uint64_t> steps;
    for (const CheckpointFile& f : files) {
      if (f.manifest) steps.push_back(f.step);
    }
    std::sort(steps.begin(), steps.end(), std::greater<>());
    const std::set<std::uint64_t> listed(steps.begin(), steps.end());
    const std::size_t kept = std::min(keep, steps.size());
    // Note [ps checkpoint files]: a checkpoint exists while its manifest does, so the manifest
    // goes first; a crash part-way leaves shard files without one (removed next time as
    // orphans), never a manifest naming missing files. A manifest that stays keeps its shards.
    std::set<std::uint64_t> dropped;
    for (std::size_t i = kept; i < steps.size(); ++i) {
      if (remove_file(dir, manifest_path("", steps[i]))) dropped.insert(steps[i]);
    }
    // Files of steps without a manifest that are newer than the newest kept checkpoint may be
    // a save in progress: only older ones are a crash's leftovers.
    for (const CheckpointFile& f : files) {
      if (f.manifest) continue;
      const bool orphan = listed.count(f.step) == 0 && kept > 0 && f.step < steps[0];
      if (dropped.count(f.step) != 0 || orphan) remove_file(dir, f.name);
    }
  } catch (const std::exception& e) {
    MWMS_LOG_WARN(kStrat, "checkpoint " << dir << ": old checkpoints not removed: " << e.what());
  } catch (...) {
    MWMS_LOG_WARN(kStrat, "checkpoint " << dir << ": old checkpoints not removed");
  }
}

}  // namespace mwms::strategy::ps
