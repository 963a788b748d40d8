// ParameterServerStrategy's private state (mwms/parameter_server.h), shared by the files that
// implement it:
//   parameter_server_strategy.cc             construction: the options' checks and the job's
//                                            connection (Note [ps job mesh], Note [ps spin]),
//                                            accessors, a ps task's join(), finalize()
//   parameter_server_strategy_variables.cc   create_variable(), value(), initialize(): placement,
//                                            each ps's description, the chief's init or a join
//   parameter_server_strategy_step.cc        the request engine (one request in flight per ps,
//                                            driven to its reply), pull(), apply_gradients()
//   parameter_server_strategy_checkpoint.cc  finding, restoring and saving checkpoints (Note [ps
//                                            checkpoint files] in ps_checkpoint.h)
// Private to src/strategy/ps: nothing outside it includes this header.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/error_context.h"
#include "collective/communicator_factory.h"
#include "collective/engine/message_channel.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/ps_checkpoint.h"
#include "strategy/ps/ps_protocol.h"
#include "strategy/ps/ps_shared_values.h"

namespace mwms {

namespace strategy::ps::detail {

inline double since(common::Clock::time_point t) {
  return std::chrono::duration<double>(common::Clock::now() - t).count();
}

struct Variable {
  VariableSpec spec;
  std::size_t count = 0;
  float* value = nullptr;
  float* gradient = nullptr;
  std::function<void(float*, std::size_t)> initializer;
};

// What a worker keeps per ps.
struct PsLink {
  int rank = 0;
  std::string name;
  JobDescription description;
  std::string blob;
  Layout layout;
  std::vector<const VariableShard*> shards;  // placement order
  std::vector<float> push_pack;
  std::vector<float> pull_pack;
  std::uint64_t version = 0;
  // One request in flight.
  enum class Phase {
    kIdle,
    kHeader,
    kReason,
    kSegments,
    kSaved,
    kAddress,  // kReady's shared-values address is arriving
    kShared,   // copying a kSharedValues reply from the ps's values (Note [ps shared values])
    kDone
  } phase = Phase::kIdle;
  PsKind expect = PsKind::kValues;
  std::size_t segment = 0;
  std::string reason;
  bool refused = false;  // kRefused (fatal) rather than kFailed (that request only)
  bool failed = false;   // the request got kFailed: `reason` says why
  std::string saved;     // kSaved's payload
  std::string request;   // a save or restore request's payload (kept while being sent)
  PsStatus status = PsStatus::kApplied;
  // Note [ps shared values]: the ps's values mapped read-only (null: replies carry them).
  std::shared_ptr<SharedValues> shared;
  std::string address;     // kReady's payload; what `shared` maps
  std::size_t copied = 0;  // elements of a kSharedValues reply copied so far
};

}  // namespace strategy::ps::detail

struct ParameterServerStrategy::Impl {
  using Variable = strategy::ps::detail::Variable;
  using PsLink = strategy::ps::detail::PsLink;

  ResolvedCluster cluster;
  ParameterServerOptions options;
  collective::ConnectedJob job;
  std::unique_ptr<collective::MessageChannel> channel;
  double timeout = 300;
  bool ps = false;
  std::vector<Variable> variables;
  std::vector<VariableShard> placement;
  std::vector<PsLink> links;
  bool initialized = false;
  bool finalized = false;
  bool stop = false;
  std::int64_t global_step = 0;
  std::string restored_from;  // the manifest initialize() restored, empty for a fresh start
  ParameterServerStats stats;

  ErrorContext ctx(const char* op) const {
    ErrorContext c = bootstrap::task_context(job.cluster, op);
    c.task = cluster.task_name();  // as the user named it: job.cluster is Note [ps job mesh]
    c.timeout_seconds = timeout;
    return c;
  }
  float* value_of(const VariableShard& s) const {
    return variables[static_cast<std::size_t>(s.variable)].value + s.element_offset;
  }
  float* gradient_of(const VariableShard& s) const {
    return variables[static_cast<std::size_t>(s.variable)].gradient + s.element_offset;
  }

  // The request engine (parameter_server_strategy_step.cc).
  void queue_segments(PsLink& l, std::uint64_t seq, bool gradients);
  void expect(PsLink& l, strategy::ps::PsKind kind);
  void expect_segment(PsLink& l);
  void unpack(PsLink& l);
  // kShared: copies what the ps has published of the reply; true when anything was copied.
  // At the end it queues kCopied and the phase becomes kDone (Note [ps shared values]).
  bool copy_shared(PsLink& l);
  [[noreturn]] void throw_failure(const PsLink& l, const ErrorContext& c);
  void on_message(PsLink& l, const ErrorContext& c);
  // A reply's first frame: its kind, version and status (or a refusal, or a failure's reason).
  void on_header(PsLink& l, const collective::FrameHeader& h, const ErrorContext& pc);

  // Drives every ps's request to its reply (Note [message channel]); the deadline counts time
  // without any progress.
  void run(const char* op, const char* waiting_for);
  void exchange(strategy::ps::PsKind request, strategy::ps::PsKind reply, const char* op,
                const char* why);
  void finish_values();

  // The variables (parameter_server_strategy_variables.cc).
  // The placement of the declared variables and, per ps, its link: the description (the job's
  // options and the shards it holds, in placement order), the layout and the pack buffers.
  void describe_job();

  // Checkpoints (parameter_server_strategy_checkpoint.cc).
  // "ps 0 at host:port: why; ps 1 ...": the requests that got kFailed.
  std::string failures() const;
  // Note [ps checkpoint files]: the newest checkpoint of `dir` whose manifest and every shard
  // file verify and hold exactly the shards this job places on each ps; older ones are tried in
  // turn (each skipped one logged). Returns its manifest and step; nullopt when `dir` holds no
  // checkpoint. @throws CheckpointError when it holds some and none is usable.
  std::optional<std::pair<std::uint64_t, strategy::ps::Manifest>> find_checkpoint(
      const std::string& dir) const;
  // The chief: every ps restores its shard file of the newest usable checkpoint of `dir`.
  // Returns false when `dir` holds none (a fresh start).
  bool restore(const std::string& dir);
};

}  // namespace mwms
