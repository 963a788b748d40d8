// Level x subsystem logging (NCCL debug.cc idea, UCX message style). Macros check the level before
// formatting anything; nothing prints unless MWMS_LOG_LEVEL allows it.
//   MWMS_LOG_INFO(kBoot, "ring position " << pos << " task " << name);
#pragma once

#include <sstream>
#include <string>

namespace mwms::common {

enum class LogLevel { kOff = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4, kTrace = 5 };
enum class LogSubsys { kInit, kBoot, kRing, kNet, kColl, kKernel, kStrat, kEnv, kAlloc };

/// True when a message at `level` for `subsys` would be written (cheap after the first call).
bool log_enabled(LogLevel level, LogSubsys subsys) noexcept;
/// Writes one line with the fixed prefix (time, host:pid:tid, r<rank>/<world>, level, subsys,
/// file:line). Never throws.
void log_write(LogLevel level, LogSubsys subsys, const char* file, int line,
               const std::string& message) noexcept;
/// Sets the rank shown in the prefix (-1 before bootstrap).
void set_log_rank(int rank, int world_size) noexcept;

}  // namespace mwms::common

#ifndef MWMS_MAX_LOG_LEVEL
#define MWMS_MAX_LOG_LEVEL 5
#endif

#define MWMS_LOG_AT(level, subsys, expr)                                                       \
  do {                                                                                         \
    if (static_cast<int>(level) <= MWMS_MAX_LOG_LEVEL &&                                       \
        ::mwms::common::log_enabled(level, ::mwms::common::LogSubsys::subsys)) {               \
      std::ostringstream mwms_log_stream_;                                                     \
      mwms_log_stream_ << expr;                                                                \
      ::mwms::common::log_write(level, ::mwms::common::LogSubsys::subsys, __FILE__, __LINE__,  \
                                mwms_log_stream_.str());                                       \
    }                                                                                          \
  } while (0)

#define MWMS_LOG_ERROR(subsys, expr) MWMS_LOG_AT(::mwms::common::LogLevel::kError, subsys, expr)
#define MWMS_LOG_WARN(subsys, expr) MWMS_LOG_AT(::mwms::common::LogLevel::kWarn, subsys, expr)
#define MWMS_LOG_INFO(subsys, expr) MWMS_LOG_AT(::mwms::common::LogLevel::kInfo, subsys, expr)
#define MWMS_LOG_DEBUG(subsys, expr) MWMS_LOG_AT(::mwms::common::LogLevel::kDebug, subsys, expr)
#define MWMS_LOG_TRACE(subsys, expr) MWMS_LOG_AT(::mwms::common::LogLevel::kTrace, subsys, expr)

/// Invariant check: throws mwms::InternalError with file:line. Only for libmwms's own invariants,
/// never for what another rank or the caller can cause.
#define MWMS_CHECK(cond, msg)                                                                  \
  do {                                                                                         \
    if (!(cond)) ::mwms::common::throw_internal(__FILE__, __LINE__, #cond, msg);               \
  } while (0)

namespace mwms::common {
[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 const std::string& msg);
}  // namespace mwms::common
