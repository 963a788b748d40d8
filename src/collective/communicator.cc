// The front-end Communicator (DESIGN "The transport seam"): argument checks, sequence numbers,
// poisoning after a failure and Work handles, over a Backend that runs each collective.
// Communicator::create bootstraps: peer-info exchange, a transport per peer, the link mesh, the
// control plane, then the engine backend over those links.
#include "mwms/communicator.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/error_context.h"
#include "bootstrap/mpi_runtime.h"
#include "collective/backend/backend.h"
#include "collective/communicator_factory.h"
#include "collective/option_values.h"
#include "collective/engine/control_plane.h"
#include "collective/trace.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms {

Communicator::~Communicator() = default;
Work::~Work() = default;

namespace collective {
namespace {

class WorkImpl final : public Work {
 public:
  explicit WorkImpl(double default_timeout) : default_timeout_(default_timeout) {}
  bool test() noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  void wait(std::optional<double> timeout_seconds) override {
    const double t = seconds_or(timeout_seconds, default_timeout_, "Work::wait's timeout_seconds");
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::duration<double>(t), [&] { return done_; })) {
      throw TimeoutError("asynchronous collective did not complete within " +
                         std::to_string(static_cast<int>(t)) + " s of Work::wait");
    }
    if (error_) std::rethrow_exception(error_);
  }
  void complete(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  double default_timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class FrontEnd final : public Communicator {
 public:
  FrontEnd(ResolvedCluster cluster, std::unique_ptr<Backend> backend, double timeout)
      : cluster_(std::move(cluster)), backend_(std::move(backend)), timeout_(timeout) {
    const std::string file = common::env_string("MWMS_TRACE_FILE");
    const long long ring = common::env_int("MWMS_TRACE_BUFFER");
    if (ring < 0 || ring > 1000000) {
      throw InvalidArgument("MWMS_TRACE_BUFFER=" + std::to_string(ring) +
                            " is outside [0, 1000000]");
    }
    if (backend_ && (!file.empty() || ring > 0)) {
      tracer_ = std::make_unique<Tracer>(cluster_.task_id, file, static_cast<std::size_t>(ring),
                                         backend_->describe());
    }
  }

  ~FrontEnd() override { stop_progress(); }

  int rank() const noexcept override { return cluster_.task_id; }
  int world_size() const noexcept override { return cluster_.num_workers; }
  std::uint64_t seq() const noexcept override { return seq_; }
  const ResolvedCluster& cluster() const noexcept override { return cluster_; }
  std::string describe() const override {
    if (finalized_) return "finalized";
    return backend_ ? backend_->describe() : "world of one";
  }

  void all_reduce(void* buffer, std::size_t count, DataType dtype, ReduceOp op) override {
    run_now(all_reduce_args(buffer, count, dtype, op));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                      ReduceOp op) override {
    run_now(reduce_scatter_args(send, recv, recv_count, dtype, op));
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, DataType dtype) override {
    run_now(all_gather_args(send, recv, send_count, dtype));
  }
  void broadcast(void* buffer, std::size_t count, DataType dtype, int root) override {
    run_now(broadcast_args(buffer, count, dtype, root));
  }
  void barrier() override { run_now(barrier_args()); }

  std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DataType dtype,
                                         ReduceOp op) override {
    return enqueue(all_reduce_args(buffer, count, dtype, op));
  }
  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, std::size_t recv_count,
                                             DataType dtype, ReduceOp op) override {
    return enqueue(reduce_scatter_args(send, recv, recv_count, dtype, op));
  }
  std::shared_ptr<Work> all_gather_async(const void* send, void* recv, std::size_t send_count,
                                         DataType dtype) override {
    return enqueue(all_gather_args(send, recv, send_count, dtype));
  }
  std::shared_ptr<Work> broadcast_async(void* buffer, std::size_t count, DataType dtype,
                                        int root) override {
    return enqueue(broadcast_args(buffer, count, dtype, root));
  }
  std::shared_ptr<Work> barrier_async() override { return enqueue(barrier_args()); }

  // Note [finalize] (engine/control_plane.h): the barrier, then the notice, then the links close.
  void finalize() override {
    if (finalized_) return;
    // Like every call, the barrier runs after the asynchronous collectives still queued, so
    // their Work completes (or fails) first; it waits under the communicator's timeout.
    run_now(barrier_args());
    stop_progress();  // the queue is empty: nothing else can touch the backend
    if (backend_) {
      backend_->finalize(seq_);
      backend_.reset();  // closes every link
    }
    finalized_ = true;
  }

  void abort(const std::string& reason) noexcept override {
    dump_flight_recorder("abort() called by this process: " + reason);
    if (backend_) backend_->abort(rank(), reason, AbortCause::kPeer, FailureCause::kUnknown);
    std::lock_guard<std::mutex> lock(poison_mutex_);
    if (poisoned_.empty()) poisoned_ = "aborted by this process: " + reason;
    poisoned_flag_.store(true, std::memory_order_release);
  }

 private:
  struct Pending {
    CollectiveArgs args;
    std::shared_ptr<WorkImpl> work;
  };

  // Note [flight recorder dump]: the ring (MWMS_TRACE_BUFFER) goes to the log at warn whenever
  // this rank learns that the job failed: a collective that failed here (timeout, dead or lost
  // peer, mismatch), an abort relayed from a peer (it fails the collective that reads it, or
  // the next one: Note [heartbeat]) and this process's own abort(). The lines name the rank, the
  // cause and, with MWMS_TRACE_FILE, the file that holds every collective; once per
  // communicator (the first failure is the one that explains the others). Never throws.
  void dump_flight_recorder(const std::string& why) noexcept {
    if (!tracer_) return;
    try {
      std::lock_guard<std::mutex> lock(trace_mutex_);
      if (dumped_) return;
      dumped_ = true;
      const std::size_t kept = tracer_->recent().size();
      std::string where = tracer_->path().empty()
                              ? std::string()
                              : "\n  every collective of this rank: " + tracer_->path();
      if (kept == 0) {
        MWMS_LOG_WARN(kColl, "flight recorder of rank " << rank() << " (MWMS_TRACE_BUFFER): no "
                                 "collective ran before " << why << where);
        return;
      }
      MWMS_LOG_WARN(kColl, "flight recorder of rank " << rank() << ": the last " << kept
                               << " collective(s) (MWMS_TRACE_BUFFER), oldest first, before "
                               << why << ":" << tracer_->recent_text() << where);
    } catch (...) {
    }
  }

  ErrorContext context(const char* op, std::uint64_t seq) const {
    ErrorContext ctx = bootstrap::task_context(cluster_, op);
    ctx.seq = static_cast<std::int64_t>(seq);
    ctx.timeout_seconds = timeout_;
    return ctx;
  }

  void check_pointer(const void* p, std::size_t count, const char* what) const {
    if (p == nullptr && count > 0) {
      throw InvalidArgument(std::string(what) + " buffer is null but count is " +
                                std::to_string(count),
                            context(what, seq_));
    }
  }

  // Validates a call and assigns its sequence number.
  CollectiveArgs begin(CollectiveKind kind, const void* send, void* recv, std::size_t count,
                       DataType dtype, ReduceOp op, int root) {
    const char* name = kind_name(kind);
    if (finalized_) {
      throw InvalidUsage("communicator finalized: " + std::string(name) + " called after "
                         "finalize(), which closed the links after " + std::to_string(seq_) +
                         " collective(s); create a new communicator to run more",
                         context(name, seq_));
    }
    check_pointer(recv, count, name);
    if (dtype_size(dtype) == 0) throw InvalidArgument("unknown dtype", context(name, seq_));
    if (static_cast<std::uint8_t>(op) > static_cast<std::uint8_t>(ReduceOp::kProd)) {
      throw InvalidArgument("unknown reduce op", context(name, seq_));
    }
    CollectiveArgs a;
    a.call = CollectiveCall{kind, dtype, op, count, root, seq_++, rank(), world_size()};
    a.buffers.send = static_cast<const char*>(send);
    a.buffers.recv = static_cast<char*>(recv);
    return a;
  }

  CollectiveArgs all_reduce_args(void* buffer, std::size_t count, DataType dtype, ReduceOp op) {
    return begin(CollectiveKind::kAllReduce, buffer, buffer, count, dtype, op, -1);
  }
  CollectiveArgs reduce_scatter_args(const void* send, void* recv, std::size_t recv_count,
                                     DataType dtype, ReduceOp op) {
    check_pointer(send, recv_count, "reduce_scatter send");
    std::size_t n = static_cast<std::size_t>(world_size());
    return begin(CollectiveKind::kReduceScatter, send, recv, recv_count * n, dtype, op, -1);
  }
  CollectiveArgs all_gather_args(const void* send, void* recv, std::size_t send_count,
                                 DataType dtype) {
    check_pointer(send, send_count, "all_gather send");
    std::size_t n = static_cast<std::size_t>(world_size());
    return begin(CollectiveKind::kAllGather, send, recv, send_count * n, dtype, ReduceOp::kSum,
                 -1);
  }
  CollectiveArgs broadcast_args(void* buffer, std::size_t count, DataType dtype, int root) {
    if (root < 0 || root >= world_size()) {
      throw InvalidArgument("broadcast root " + std::to_string(root) + " is outside [0, " +
                                std::to_string(world_size()) + ")",
                            context("broadcast", seq_));
    }
    return begin(CollectiveKind::kBroadcast, buffer, buffer, count, dtype, ReduceOp::kSum, root);
  }
  CollectiveArgs barrier_args() {
    // The token lives in the front end: asynchronous barriers need storage that outlives the call.
    return begin(CollectiveKind::kBarrier, &barrier_token_, &barrier_token_, 1, DataType::kInt32,
                 ReduceOp::kSum, -1);
  }

  // Runs one collective on the calling thread (or the progress thread); on failure poisons the
  // communicator and tells every peer.
  void execute(const CollectiveArgs& a, bool async = false) {
    const char* name = kind_name(a.call.kind);
    if (poisoned_flag_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(poison_mutex_);
      if (!poisoned_.empty()) {
        throw InvalidUsage("communicator is unusable after an earlier failure; rebuild it "
                           "(restart the job): " + poisoned_,
                           context(name, a.call.seq));
      }
    }
    if (!backend_) return;  // world of one: nothing to move (the backend handles size 1 too)
    if (a.call.kind == CollectiveKind::kBarrier) barrier_token_ = 1;
    // One collective runs at a time: its context lives in the front end and is filled in place
    // (a small collective must not pay for building strings it only needs when it fails).
    ErrorContext& ctx = call_ctx_;
    if (ctx.rank < 0) ctx = context(name, a.call.seq);
    ctx.op = name;
    ctx.seq = static_cast<std::int64_t>(a.call.seq);
    ctx.bytes = static_cast<std::int64_t>(a.call.count * dtype_size(a.call.dtype));
    // Note [trace cost] in trace.h: nothing but this test when tracing is off.
    TraceEvent ev;
    if (tracer_) {
      ev.seq = a.call.seq;
      ev.bytes = static_cast<std::uint64_t>(ctx.bytes);
      ev.kind = static_cast<std::uint8_t>(a.call.kind);
      ev.dtype = static_cast<std::uint8_t>(a.call.dtype);
      ev.op = static_cast<std::uint8_t>(a.call.op);
      ev.async = async;
      ev.start_us = Tracer::now_us();
    }
    try {
      backend_->run(a, ctx);
      if (tracer_) {
        ev.end_us = Tracer::now_us();
        ev.algorithm = backend_->last_algorithm();
        std::lock_guard<std::mutex> lock(trace_mutex_);
        tracer_->record(ev);
      }
    } catch (const Error& e) {
      if (tracer_) {
        ev.end_us = Tracer::now_us();
        ev.algorithm = backend_->last_algorithm();
        ev.failed = true;
        {
          std::lock_guard<std::mutex> lock(trace_mutex_);
          tracer_->record(ev);
        }
        dump_flight_recorder(std::string("the failure of ") + name + " seq " +
                             std::to_string(a.call.seq) + ": " + e.what());
      }
      {
        std::lock_guard<std::mutex> lock(poison_mutex_);
        if (poisoned_.empty()) poisoned_ = e.what();  // an abort() that caused this one stays
        poisoned_flag_.store(true, std::memory_order_release);
      }
      int failed = e.context().peer_rank >= 0 ? e.context().peer_rank : rank();
      AbortCause cause = AbortCause::kPeer;
      if (dynamic_cast<const CollectiveMismatchError*>(&e) != nullptr) {
        cause = AbortCause::kMismatch;
        failed = rank();
      } else if (dynamic_cast<const TimeoutError*>(&e) != nullptr) {
        cause = AbortCause::kTimeout;
      }
      if (dynamic_cast<const InvalidArgument*>(&e) == nullptr) {
        // Note [no finalize after a stall]: a stalled peer would hold MPI_Finalize at exit. The
        // cause was set where the error was raised (or came with a relayed abort).
        if (cause == AbortCause::kTimeout || e.context().cause == FailureCause::kStalled) {
          bootstrap::MpiRuntime::note_peer_stalled();
        }
        backend_->abort(failed, e.message(), cause, e.context().cause);
      }
      MWMS_LOG_WARN(kColl, "collective failed: " << e.what());
      throw;
    }
  }

  void run_now(const CollectiveArgs& a) {
    // Only the calling thread enqueues, so "nothing outstanding" cannot change under us.
    if (outstanding_.load(std::memory_order_acquire) == 0) {
      execute(a);  // the common case: no asynchronous work outstanding, no thread hop
      return;
    }
    enqueue(a)->wait(timeout_ * 2 + 10);  // keeps the call order
  }

  std::shared_ptr<Work> enqueue(const CollectiveArgs& a) {
    auto work = std::make_shared<WorkImpl>(timeout_ * 2 + 10);
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      queue_.push_back(Pending{a, work});
      outstanding_.fetch_add(1, std::memory_order_acq_rel);
      if (!progress_.joinable()) progress_ = std::thread([this] { progress_loop(); });
    }
    queue_cv_.notify_one();
    return work;
  }

  void stop_progress() noexcept {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    if (progress_.joinable()) progress_.join();
  }

  // STYLE item 15: no exception escapes the thread; each lands in its Work.
  void progress_loop() noexcept {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        execute(p.args, /*async=*/true);
      } catch (...) {
        error = std::current_exception();
      }
      outstanding_.fetch_sub(1, std::memory_order_acq_rel);
      p.work->complete(error);
    }
  }

  ResolvedCluster cluster_;
  std::unique_ptr<Backend> backend_;
  double timeout_;
  std::uint64_t seq_ = 0;
  std::int32_t barrier_token_ = 1;
  ErrorContext call_ctx_;  // of the collective running now
  std::mutex poison_mutex_;
  std::string poisoned_;
  std::atomic<bool> poisoned_flag_{false};
  std::atomic<int> outstanding_{0};  // asynchronous collectives queued or running
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::thread progress_;
  bool finalized_ = false;  // read and written by the calling thread only
  std::unique_ptr<Tracer> tracer_;  // MWMS_TRACE_FILE / MWMS_TRACE_BUFFER; null when off
  std::mutex trace_mutex_;          // tracer_'s ring: collectives record, abort() may dump
  bool dumped_ = false;             // under trace_mutex_ (Note [flight recorder dump])
};

}  // namespace

std::unique_ptr<Communicator> make_front_end(ResolvedCluster cluster,
                                             std::unique_ptr<Backend> backend, double timeout) {
  return std::make_unique<FrontEnd>(std::move(cluster), std::move(backend), timeout);
}

}  // namespace collective

std::unique_ptr<Communicator> Communicator::create(const ResolvedCluster& cluster,
                                                   const CommunicatorOptions& options) {
  return collective::create_communicator(cluster, options);
}

}  // namespace mwms
