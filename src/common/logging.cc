#include "common/logging.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "common/env.h"
#include "mwms/errors.h"

namespace mwms::common {

namespace {

struct LogConfig {
  LogLevel level = LogLevel::kWarn;
  unsigned subsys_mask = 0;
  std::string file_pattern;  // MWMS_LOG_FILE, opened on first use (see log_stream)
  std::string host;
};

std::atomic<int> g_rank{-1};
std::atomic<int> g_world{-1};

const char* kSubsysNames[] = {"INIT", "BOOT", "RING", "NET", "COLL", "KERNEL", "STRAT", "ENV",
                              "ALLOC"};
const char* kLevelNames[] = {"OFF", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

unsigned parse_subsys(std::string list) {
  bool invert = !list.empty() && list[0] == '^';
  if (invert) list.erase(0, 1);
  unsigned mask = 0;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(start, end - start);
    if (name == "ALL") mask = ~0u;
    for (unsigned i = 0; i < sizeof(kSubsysNames) / sizeof(kSubsysNames[0]); ++i) {
      if (name == kSubsysNames[i]) mask |= 1u << i;
    }
    start = end + 1;
  }
  return invert ? ~mask : mask;
}

std::string expand_path(const std::string& pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[++i];
      char host[256] = {0};
      if (c == 'h') {
        gethostname(host, sizeof(host) - 1);
        out += host;
      } else if (c == 'p') {
        out += std::to_string(getpid());
      } else if (c == 'r') {
        out += std::to_string(g_rank.load());
      } else {
        out += pattern[i - 1];
        out += c;
      }
    } else {
      out += pattern[i];
    }
  }
  return out;
}

const LogConfig& config() {
  static const LogConfig cfg = [] {
    LogConfig c;
    try {
      std::string level = env_string("MWMS_LOG_LEVEL");
      for (int i = 0; i <= 5; ++i) {
        std::string name = kLevelNames[i];
        for (auto& ch : name) ch = static_cast<char>(std::tolower(ch));
        if (name == level) c.level = static_cast<LogLevel>(i);
      }
      c.subsys_mask = parse_subsys(env_string("MWMS_LOG_SUBSYS"));
      c.file_pattern = env_string("MWMS_LOG_FILE");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mwms: bad logging configuration: %s\n", e.what());
    }
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    c.host = host;
    return c;
  }();
  return cfg;
}

// The stream for the next line; called with the log mutex held. A pattern with %r waits until
// bootstrap has set the rank, so lines from before that go to stderr.
FILE* log_stream(const LogConfig& c) {
  static FILE* file = nullptr;
  static bool tried = false;
  if (file != nullptr) return file;
  bool needs_rank = c.file_pattern.find("%r") != std::string::npos;
  if (c.file_pattern.empty() || tried || (needs_rank && g_rank.load() < 0)) return stderr;
  tried = true;
  file = std::fopen(expand_path(c.file_pattern).c_str(), "a");
  return file != nullptr ? file : stderr;
}

}  // namespace

bool log_enabled(LogLevel level, LogSubsys subsys) noexcept {
  const LogConfig& c = config();
  // Errors and warnings always pass; MWMS_LOG_SUBSYS filters info and below.
  return level != LogLevel::kOff && level <= c.level &&
         (level <= LogLevel::kWarn || (c.subsys_mask & (1u << static_cast<unsigned>(subsys))) != 0);
}

void log_write(LogLevel level, LogSubsys subsys, const char* file, int line,
               const std::string& message) noexcept {
  const LogConfig& c = config();
  static std::mutex mutex;
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  auto usec = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()) %
              std::chrono::seconds(1);
  std::tm tm_buf{};
  localtime_r(&secs, &tm_buf);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm_buf);
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  std::lock_guard<std::mutex> lock(mutex);
  FILE* out = log_stream(c);
  std::fprintf(out, "%s.%06ld %s:%d:%ld r%d/%d mwms %s %s %s:%d %s\n", stamp,
               static_cast<long>(usec.count()), c.host.c_str(), static_cast<int>(getpid()),
               static_cast<long>(syscall(SYS_gettid)), g_rank.load(), g_world.load(),
               kLevelNames[static_cast<int>(level)], kSubsysNames[static_cast<int>(subsys)], base,
               line, message.c_str());
  std::fflush(out);
}

void set_log_rank(int rank, int world_size) noexcept {
  g_rank = rank;
  g_world = world_size;
}

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(std::string("internal check failed: ") + cond + " (" + msg + ") at " +
                      file + ":" + std::to_string(line));
}

}  // namespace mwms::common
