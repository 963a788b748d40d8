// Collective tracing (docs/env.md MWMS_TRACE_FILE, MWMS_TRACE_BUFFER): a record of every
// collective this rank ran, written as a Chrome trace (chrome://tracing, Perfetto: the JSON array
// format, one "X" event per collective) and/or kept as a flight recorder of the last K
// collectives that is logged when one fails (c10d's flight recorder).
//
// Note [trace cost]: off by default; when on, a collective costs two clock reads and a few
// stores into a preallocated ring, plus, with a file, one formatted line written at once (a seek
// and a write: the file is a complete JSON array after every event, so a rank that is killed
// leaves a valid trace; Note [trace file always valid] in trace.cc). Nothing is allocated per
// collective.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mwms::collective {

/// One finished (or failed) collective.
struct TraceEvent {
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;         // of the caller's buffer (all-reduce, broadcast) or send side
  std::int64_t start_us = 0;       // wall clock (system_clock), microseconds since the epoch
  std::int64_t end_us = 0;
  std::uint8_t kind = 0;           // CollectiveKind
  std::uint8_t dtype = 0;          // DataType
  std::uint8_t op = 0;             // ReduceOp
  std::uint8_t algorithm = 0xff;   // AlgorithmId, 0xff: none (world of one, or failed before)
  bool async = false;              // ran on the progress thread
  bool failed = false;
};

/// Records TraceEvents. Thread safety: record() from one thread at a time (the front end runs
/// one collective at a time, on the caller's or the progress thread).
class Tracer {
 public:
  /// `file`: Chrome trace path ("%r" becomes the rank; without "%r", ".<rank>" is appended);
  /// empty: none. `ring`: events kept for recent() (0: none). `describe`: the links, written as
  /// the trace's process name. A file that cannot be opened is logged and skipped.
  Tracer(int rank, const std::string& file, std::size_t ring, const std::string& describe);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  bool enabled() const noexcept { return file_ != nullptr || !ring_.empty(); }
  /// Appends `e` to the ring and the file. Never throws, never allocates.
  void record(const TraceEvent& e) noexcept;
  /// The ring's events, oldest first (at most `ring`).
  std::vector<TraceEvent> recent() const;
  /// One line per event of recent(), for the failure log.
  std::string recent_text() const;
  /// The path the trace goes to ("" when none).
  const std::string& path() const noexcept { return path_; }

  /// Microseconds since the epoch (the trace's clock).
  static std::int64_t now_us() noexcept;

 private:
  int rank_;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::string transports_;  // of the links, in every event ("1 shm 2 tcp")
  std::vector<TraceEvent> ring_;
  std::size_t next_ = 0;   // ring slot of the next event
  std::size_t count_ = 0;  // events recorded
};

}  // namespace mwms::collective
