#include "collective/trace.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "collective/algorithms/algorithm.h"
#include "collective/frame.h"
#include "common/logging.h"
#include "mwms/types.h"

namespace mwms::collective {

namespace {

// Names for any byte (to_string handles values outside the enums): literals, so .data() ends
// in a NUL.
const char* dtype_text(std::uint8_t d) { return to_string(static_cast<DataType>(d)).data(); }
const char* op_text(std::uint8_t o) { return to_string(static_cast<ReduceOp>(o)).data(); }

}  // namespace

std::int64_t Tracer::now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Tracer::Tracer(int rank, const std::string& file, std::size_t ring, const std::string& describe)
    : rank_(rank), ring_(ring) {
  if (file.empty()) return;
  path_ = file;
  const std::size_t at = path_.find("%r");
  if (at != std::string::npos) {
    path_.replace(at, 2, std::to_string(rank));
  } else {
    path_ += "." + std::to_string(rank);
  }
  file_ = std::fopen(path_.c_str(), "w");
  if (file_ == nullptr) {
    MWMS_LOG_WARN(kColl, "MWMS_TRACE_FILE: cannot write " << path_ << ": " << std::strerror(errno)
                                                          << "; no trace");
    return;
  }
  // The links' transports ("1 shm 2 tcp", from "engine backend, links: 1 shm 2 tcp, chunk ..."),
  // carried by every event.
  const std::size_t links = describe.find("links: ");
  if (links != std::string::npos) {
    transports_ = describe.substr(links + 7, describe.find(',', links) - links - 7);
  }
  for (char& c : transports_) {
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  std::string name = "rank " + std::to_string(rank) + ": " + describe;
  for (char& c : name) {
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  std::fprintf(file_,
               "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"%s\"}},\n"
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"name\":\"caller\"}},\n"
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,"
               "\"args\":{\"name\":\"progress thread (async)\"}}\n]\n",
               rank, name.c_str(), rank, rank);
  std::fflush(file_);
  MWMS_LOG_INFO(kColl, "tracing every collective to " << path_);
}

Tracer::~Tracer() {
  if (file_ != nullptr) std::fclose(file_);  // already a complete array (record())
}

void Tracer::record(const TraceEvent& e) noexcept {
  if (!ring_.empty()) {
    ring_[next_] = e;
    next_ = (next_ + 1) % ring_.size();
  }
  ++count_;
  if (file_ == nullptr) return;
  // Note [trace file always valid]: the file always ends in "\n]\n"; an event overwrites that
  // tail and writes it again, in one write, so a rank killed at any moment (SIGKILL, or a
  // launcher's SIGTERM) leaves a complete JSON array of the events it finished.
  char line[768];
  const int n = std::snprintf(
      line, sizeof(line),
      ",\n{\"name\":\"%s\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
      "\"ts\":%lld,\"dur\":%lld,\"args\":{\"seq\":%llu,\"bytes\":%llu,\"dtype\":\"%s\","
      "\"op\":\"%s\",\"algorithm\":\"%s\",\"transport\":\"%s\",\"status\":\"%s\"}}\n]\n",
      kind_name(static_cast<CollectiveKind>(e.kind)), rank_, e.async ? 1 : 0,
      static_cast<long long>(e.start_us), static_cast<long long>(e.end_us - e.start_us),
      static_cast<unsigned long long>(e.seq), static_cast<unsigned long long>(e.bytes),
      dtype_text(e.dtype), op_text(e.op),
      e.algorithm == 0xff ? "none" : algorithm_name(e.algorithm), transports_.c_str(),
      e.failed ? "failed" : "ok");
  if (n <= 0 || static_cast<std::size_t>(n) >= sizeof(line)) return;
  if (std::fseek(file_, -3, SEEK_END) != 0) return;
  std::fwrite(line, 1, static_cast<std::size_t>(n), file_);
  std::fflush(file_);
}

std::vector<TraceEvent> Tracer::recent() const {
  std::vector<TraceEvent> out;
  if (ring_.empty()) return out;
  const std::size_t n = std::min(count_, ring_.size());
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(ring_[(next_ + ring_.size() - n + i) % ring_.size()]);
  }
  return out;
}

std::string Tracer::recent_text() const {
  std::ostringstream out;
  for (const TraceEvent& e : recent()) {
    out << "\n  seq " << e.seq << " " << kind_name(static_cast<CollectiveKind>(e.kind)) << " "
        << e.bytes << " bytes " << dtype_text(e.dtype) << " " << op_text(e.op) << ", "
        << (e.algorithm == 0xff ? "none" : algorithm_name(e.algorithm)) << ", "
        << (e.end_us - e.start_us) << " us" << (e.async ? ", async" : "")
        << (e.failed ? ", FAILED" : "");
  }
  return out.str();
}

}  // namespace mwms::collective
