#include "collective/backend/nccl_group.h"

#include <algorithm>

#include "common/exception_text.h"
#include "common/logging.h"

namespace mwms::collective {

namespace {

using common::Clock;
using common::Deadline;

// NCCL refuses more operations than this between ncclGroupStart and ncclGroupEnd.
constexpr std::size_t kMaxGroupCalls = 2048;

using Backoff = PollBackoff;  // device_backend.h

std::string replica_text(int r) { return "local replica " + std::to_string(r); }

// A Work over the K events of one grouped launch (Note [nccl replica group]).
class GroupWork final : public PolledDeviceWork {
 public:
  GroupWork(std::shared_ptr<NcclGroupShared> shared, std::vector<NcclEvent> events,
            Deadline deadline, ErrorContext ctx, double timeout)
      : PolledDeviceWork("nccl replica group", std::move(ctx), timeout),
        shared_(std::move(shared)),
        events_(std::move(events)),
        pending_(events_.size(), true),
        deadline_(deadline) {}

  ~GroupWork() override {
    for (NcclEvent e : events_) {
      if (e != nullptr) shared_->api->event_destroy(e);
    }
  }

 private:
  // One look at the K events and communicators; true once all completed or one failed.
  bool poll() noexcept override {
    const NcclApi& api = *shared_->api;
    if (std::exception_ptr cause = shared_->failure()) return finish(cause);
    bool all = true;
    for (std::size_t r = 0; r < events_.size(); ++r) {
      if (!pending_[r]) continue;
      const int q = api.event_query(events_[r]);
      if (q == kCudaSuccess) {
        pending_[r] = false;
        continue;
      }
      all = false;
      if (q != kCudaErrorNotReady) {
        return fail(to_error(api, NativeSource::kCuda, q,
                             "cudaEventQuery (" + replica_text(static_cast<int>(r)) + ")", nullptr,
                             ctx_));
      }
    }
    if (all) return finish(nullptr);
    for (std::size_t r = 0; r < shared_->comms.size(); ++r) {
      NcclComm comm = shared_->comms[r];
      int async = kNcclSuccess;
      const int c = api.comm_get_async_error(comm, &async);
      if (c != kNcclSuccess) {
        return fail(to_error(api, NativeSource::kNccl, c,
                             "ncclCommGetAsyncError (" + replica_text(static_cast<int>(r)) + ")",
                             comm, ctx_));
      }
      if (async != kNcclSuccess && async != kNcclInProgress) {
        return fail(to_error(api, NativeSource::kNccl, async,
                             "nccl " + ctx_.op + " (" + replica_text(static_cast<int>(r)) + ")",
                             comm, ctx_));
      }
    }
    if (Clock::now() > deadline_) {
      std::string waiting;
      for (std::size_t r = 0; r < pending_.size(); ++r) {
        if (pending_[r]) waiting += (waiting.empty() ? "" : ", ") + std::to_string(r);
      }
      ErrorContext ctx = timeout_context();
      ctx.elapsed_seconds = timeout_ - common::seconds_left(deadline_);
      return fail(std::make_exception_ptr(TimeoutError(
          "nccl replica group " + ctx_.op + " seq " + std::to_string(ctx_.seq) +
              " did not complete within " + seconds_text(timeout_) + " on local replica(s) " +
              waiting +
              ": a peer is dead, stalled or never called it; all local NCCL communicators "
              "were aborted",
          ctx)));
    }
    return false;
  }

  bool fail(std::exception_ptr cause) noexcept {
    shared_->fail(cause);
    return finish(shared_->failure());
  }

  std::shared_ptr<NcclGroupShared> shared_;
  std::vector<NcclEvent> events_;
  std::vector<bool> pending_;
  Deadline deadline_;
};

}  // namespace

void NcclGroupShared::fail(std::exception_ptr cause) noexcept {
  std::lock_guard<std::mutex> lock(mutex);
  if (!poison) poison = cause;
  if (aborted || destroyed) return;
  aborted = true;
  for (NcclComm comm : comms) {
    if (comm == nullptr) continue;
    const int r = api->comm_abort(comm);
    if (r != kNcclSuccess) {
      const char* text = api->error_string(r);
      MWMS_LOG_WARN(kColl, "ncclCommAbort returned " << r << " (" << (text ? text : "") << ")");
    }
  }
}

std::exception_ptr NcclGroupShared::failure() {
  std::lock_guard<std::mutex> lock(mutex);
  return poison;
}

NcclReplicaGroup::NcclReplicaGroup(const NcclApi& api, const NcclUniqueId& id,
                                   NcclGroupOptions options)
    : shared_(std::make_shared<NcclGroupShared>()) {
  shared_->api = &api;
  shared_->options = std::move(options);
  const NcclGroupOptions& o = shared_->options;
  const ErrorContext ctx = context("nccl group init", -1);
  const int k = static_cast<int>(o.devices.size());
  if (k == 0 || o.first_rank < 0 || o.first_rank + k > o.world_size) {
    throw InvalidArgument("nccl replica group: " + std::to_string(k) +
                              " local device(s) from rank " + std::to_string(o.first_rank) +
                              " do not fit a world of " + std::to_string(o.world_size),
                          ctx);
  }
  devices_.assign(static_cast<std::size_t>(k), -1);
  shared_->comms.assign(static_cast<std::size_t>(k), nullptr);
  check(NativeSource::kNccl, api.group_start(), "ncclGroupStart", nullptr, ctx);
  int first_error = kNcclSuccess;
  int failed = -1;
  std::exception_ptr device_error;
  for (int r = 0; r < k && first_error == kNcclSuccess && !device_error; ++r) {
    int device = -1;
    const int d = api.set_device(o.devices[static_cast<std::size_t>(r)], &device);
    if (d != kCudaSuccess) {
      device_error =
          to_error(api, NativeSource::kCuda, d,
                   d == 35 || d == 100
                       ? "no usable CUDA device for " + replica_text(r) +
                             " (no NVIDIA driver or no GPU): cudaSetDevice"
                       : "cudaSetDevice(" + std::to_string(o.devices[static_cast<std::size_t>(r)]) +
                             ") for " + replica_text(r),
                   nullptr, ctx);
      break;
    }
    for (int q = 0; q < r && !device_error; ++q) {
      if (devices_[static_cast<std::size_t>(q)] != device) continue;
      // The device is picked modulo the host's device count: more replicas than devices wrap
      // onto one GPU, which NCCL would refuse later as "Duplicate GPU detected".
      device_error = std::make_exception_ptr(InvalidUsage(
          replica_text(q) + " and " + replica_text(r) + " would share CUDA device " +
              std::to_string(device) + " (asked for devices " +
              std::to_string(o.devices.front()) + ".." + std::to_string(o.devices.back()) +
              "): this host has fewer CUDA devices than its processes' GPU replicas; use at "
              "most one replica per device (ReplicaOptions::local_replicas x processes per host)",
          ctx));
    }
    if (device_error) break;
    devices_[static_cast<std::size_t>(r)] = device;
    NcclComm comm = nullptr;
    const int c = api.comm_init_rank(&comm, o.world_size, &id, o.first_rank + r);
    shared_->comms[static_cast<std::size_t>(r)] = comm;
    if (c != kNcclSuccess && c != kNcclInProgress) {
      first_error = c;
      failed = r;
    }
  }
  // A group is always closed, even after a failed call inside it (NCCL requires it).
  const int end = api.group_end();
  if (device_error) {
    shared_->fail(device_error);
    std::rethrow_exception(device_error);
  }
  if (first_error != kNcclSuccess) {
    check(NativeSource::kNccl, first_error,
          "ncclCommInitRankConfig (" + replica_text(failed) + ", rank " +
              std::to_string(o.first_rank + failed) + ")",
          shared_->comms[static_cast<std::size_t>(failed)], ctx);
  }
  check(NativeSource::kNccl, end, "ncclGroupEnd (communicator init)", nullptr, ctx);
  wait_not_in_progress("ncclCommInitRankConfig", common::deadline_after(o.init_timeout_seconds),
                       ctx);
  if (k > 1) set_device(0, ctx);  // the constructing thread keeps local replica 0's device
  MWMS_LOG_INFO(kInit, "nccl replica group ready: " << describe());
}

NcclReplicaGroup::~NcclReplicaGroup() {
  if (std::shared_ptr<Work> last = std::move(last_)) {
    try {
      last->wait();
    } catch (const std::exception& e) {
      MWMS_LOG_WARN(kColl,
                    "nccl replica group: the last collective failed at shutdown: " << e.what());
    }
  }
  NcclGroupShared& s = *shared_;
  std::lock_guard<std::mutex> lock(s.mutex);
  // ncclCommAbort freed the communicators, or finalize() destroyed them.
  if (s.aborted || s.destroyed) return;
  if (std::exception_ptr e = finalize_locked()) {
    MWMS_LOG_WARN(kColl, "nccl replica group: finalize at shutdown failed: "
                             << common::exception_text(e));
  }
}

std::exception_ptr NcclReplicaGroup::finalize_locked() noexcept {
  NcclGroupShared& s = *shared_;
  s.destroyed = true;
  const NcclApi& api = *s.api;
  const ErrorContext ctx = context("finalize", static_cast<std::int64_t>(seq_));
  // Non-blocking communicators: each finalize returns at once (in progress), so one thread can
  // finalize all K without waiting on the first for the others.
  std::vector<int> state(s.comms.size(), kNcclInProgress);
  std::vector<const char*> call(s.comms.size(), "ncclCommFinalize");
  for (std::size_t r = 0; r < s.comms.size(); ++r) {
    if (s.comms[r] == nullptr) continue;
    const int f = api.comm_finalize(s.comms[r]);
    if (f != kNcclSuccess && f != kNcclInProgress) state[r] = f;
  }
  const Deadline deadline = common::deadline_after(s.options.timeout_seconds);
  Backoff backoff;
  bool pending = false;
  for (;;) {
    pending = false;
    for (std::size_t r = 0; r < s.comms.size(); ++r) {
      if (s.comms[r] == nullptr || state[r] != kNcclInProgress) continue;
      int async = kNcclSuccess;
      if (const int q = api.comm_get_async_error(s.comms[r], &async); q != kNcclSuccess) {
        async = q;
        call[r] = "ncclCommGetAsyncError (finalize)";
      }
      state[r] = async;
      pending = pending || async == kNcclInProgress;
    }
    if (!pending || Clock::now() > deadline) break;
    backoff.pause();
  }
  std::exception_ptr first;
  for (std::size_t r = 0; r < s.comms.size(); ++r) {
    if (s.comms[r] == nullptr) continue;
    if (state[r] == kNcclSuccess) {
      const int d = api.comm_destroy(s.comms[r]);
      if (d == kNcclSuccess) continue;
      state[r] = d;
      call[r] = "ncclCommDestroy";
    }
    if (!first) {
      const std::string who = replica_text(static_cast<int>(r));
      if (state[r] == kNcclInProgress) {
        ErrorContext t = ctx;
        t.timeout_seconds = s.options.timeout_seconds;
        try {
          first = std::make_exception_ptr(TimeoutError(
              "ncclCommFinalize of " + who + " did not complete within " +
                  seconds_text(s.options.timeout_seconds) +
                  ": a rank has not finalized (every worker must call finalize) or is dead; "
                  "the NCCL communicators were aborted",
              t));
        } catch (...) {
          first = std::current_exception();  // std::bad_alloc
        }
      } else {
        first = to_error(api, NativeSource::kNccl, state[r], std::string(call[r]) + " (" + who + ")",
                         s.comms[r], ctx);
      }
    }
  }
  if (!first) return nullptr;
  // Every communicator not destroyed cleanly (and, for a consistent state, none half-used) is
  // aborted; a destroyed one is gone and is skipped.
  s.aborted = true;
  for (std::size_t r = 0; r < s.comms.size(); ++r) {
    if (s.comms[r] == nullptr || state[r] == kNcclSuccess) continue;
    api.comm_abort(s.comms[r]);
  }
  return first;
}

void NcclReplicaGroup::finalize() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->finalized) return;
  }
  if (std::exception_ptr cause = shared_->failure()) {
    throw InvalidUsage("cannot finalize the NCCL replica group: it is poisoned by an earlier "
                       "failure: " + common::exception_text(cause),
                       context("finalize", static_cast<std::int64_t>(seq_)));
  }
  if (std::shared_ptr<Work> last = std::move(last_)) last->wait();  // its error poisoned the group
  NcclGroupShared& s = *shared_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.poison) std::rethrow_exception(s.poison);
  if (std::exception_ptr e = finalize_locked()) {
    if (!s.poison) s.poison = e;
    std::rethrow_exception(e);
  }
  s.finalized = true;
}

ErrorContext NcclReplicaGroup::context(const char* op, std::int64_t seq) const {
  ErrorContext ctx = shared_->options.context;
  ctx.op = op;
  ctx.seq = seq;
  ctx.transport = "nccl";
  return ctx;
}

void NcclReplicaGroup::check(NativeSource source, int code, const std::string& call, NcclComm comm,
                             const ErrorContext& ctx) {
  const bool ok = source == NativeSource::kCuda ? code == kCudaSuccess
                                                : (code == kNcclSuccess || code == kNcclInProgress);
  if (ok) return;
  std::exception_ptr e = to_error(*shared_->api, source, code, call, comm, ctx);
  // A bad argument broke nothing; anything else leaves the communicators in an unknown state.
  if (!(source == NativeSource::kNccl && code == kNcclInvalidArgument)) shared_->fail(e);
  std::rethrow_exception(e);
}

void NcclReplicaGroup::wait_not_in_progress(const char* what, Deadline deadline,
                                            const ErrorContext& ctx) {
  const NcclApi& api = *shared_->api;
  const double limit = common::seconds_left(deadline);
  std::vector<bool> ready(shared_->comms.size(), false);
  Backoff backoff;
  for (;;) {
    bool all = true;
    for (std::size_t r = 0; r < shared_->comms.size(); ++r) {
      if (ready[r]) continue;
      NcclComm comm = shared_->comms[r];
      int async = kNcclSuccess;
      check(NativeSource::kNccl, api.comm_get_async_error(comm, &async),
            "ncclCommGetAsyncError (" + replica_text(static_cast<int>(r)) + ")", comm, ctx);
      if (async == kNcclSuccess) {
        ready[r] = true;
        continue;
      }
      all = false;
      if (async != kNcclInProgress) {
        std::exception_ptr e =
            to_error(api, NativeSource::kNccl, async,
                     std::string(what) + " (" + replica_text(static_cast<int>(r)) + ")", comm, ctx);
        shared_->fail(e);
        std::rethrow_exception(e);
      }
    }
    if (all) return;
    if (Clock::now() > deadline) {
      std::string waiting;
      for (std::size_t r = 0; r < ready.size(); ++r) {
        if (!ready[r]) waiting += (waiting.empty() ? "" : ", ") + std::to_string(r);
      }
      ErrorContext t = ctx;
      t.timeout_seconds = limit;
      std::exception_ptr e = std::make_exception_ptr(TimeoutError(
          std::string(what) + " still in progress on local replica(s) " + waiting + " after " +
              seconds_text(limit) + " (world size " + std::to_string(shared_->options.world_size) +
              "): a rank never joined or is stalled; all local NCCL communicators were aborted",
          t));
      shared_->fail(e);
      std::rethrow_exception(e);
    }
    backoff.pause();
  }
}

void NcclReplicaGroup::set_device(int r, const ErrorContext& ctx) {
  int device = -1;
  check(NativeSource::kCuda,
        shared_->api->set_device(shared_->options.devices[static_cast<std::size_t>(r)], &device),
        "cudaSetDevice (" + replica_text(r) + ")", nullptr, ctx);
}

std::shared_ptr<Work> NcclReplicaGroup::launch(const DeviceCall* calls, std::size_t per_replica,
                                               void* const* streams) {
  const NcclApi& api = *shared_->api;
  const NcclGroupOptions& o = shared_->options;
  const int k = size();
  const char* op = per_replica == 1 ? to_string(calls[0].kind) : "group";
  ErrorContext ctx = context(op, static_cast<std::int64_t>(seq_));
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->finalized) {
      throw InvalidUsage("the NCCL replica group was finalized; no collective can follow", ctx);
    }
  }
  if (std::exception_ptr cause = shared_->failure()) {
    throw InvalidUsage(
        "the NCCL replica group is poisoned by an earlier failure: " + common::exception_text(cause),
        ctx);
  }
  const std::size_t total = per_replica * static_cast<std::size_t>(k);
  for (std::size_t i = 0; i < total; ++i) {
    const DeviceCall& c = calls[i];
    const std::string who = replica_text(static_cast<int>(i / per_replica));
    if (c.count > 0 &&
        (c.recv == nullptr || (c.kind != DeviceCollective::kBroadcast && c.send == nullptr))) {
      throw InvalidArgument(std::string("nccl ") + to_string(c.kind) + " of " + who +
                                ": null device buffer with count " + std::to_string(c.count),
                            ctx);
    }
    if (c.kind == DeviceCollective::kBroadcast && (c.root < 0 || c.root >= o.world_size)) {
      throw InvalidArgument("nccl broadcast of " + who + ": root " + std::to_string(c.root) +
                                " out of range for world size " + std::to_string(o.world_size),
                            ctx);
    }
  }
  const Deadline deadline = common::deadline_after(o.timeout_seconds);
  ++seq_;
  // Groups of at most kMaxGroupCalls NCCL calls, each holding whole tensors of every replica
  // (tensor i of all K replicas in the same group: they are one collective).
  const std::size_t per_group =
      std::max<std::size_t>(1, kMaxGroupCalls / static_cast<std::size_t>(k));
  for (std::size_t begin = 0; begin < per_replica; begin += per_group) {
    const std::size_t end_call = std::min(per_replica, begin + per_group);
    check(NativeSource::kNccl, api.group_start(), "ncclGroupStart", nullptr, ctx);
    int first_error = kNcclSuccess;
    std::string failed;
    NcclComm failed_comm = nullptr;
    for (int r = 0; r < k && first_error == kNcclSuccess; ++r) {
      NcclComm comm = shared_->comms[static_cast<std::size_t>(r)];
      void* stream = streams[r];
      for (std::size_t i = begin; i < end_call && first_error == kNcclSuccess; ++i) {
        const DeviceCall& c = calls[static_cast<std::size_t>(r) * per_replica + i];
        int res = kNcclSuccess;
        switch (c.kind) {
          case DeviceCollective::kAllReduce:
            res = api.all_reduce(c.send, c.recv, c.count, c.dtype, c.op, comm, stream);
            break;
          case DeviceCollective::kReduceScatter:
            res = api.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op, comm, stream);
            break;
          case DeviceCollective::kAllGather:
            res = api.all_gather(c.send, c.recv, c.count, c.dtype, comm, stream);
            break;
          case DeviceCollective::kBroadcast:
            res = api.broadcast(c.send, c.recv, c.count, c.dtype, c.root, comm, stream);
            break;
        }
        if (res != kNcclSuccess && res != kNcclInProgress) {
          first_error = res;
          failed = std::string("nccl ") + to_string(c.kind) + " (" + replica_text(r) + ")";
          failed_comm = comm;
        }
      }
    }
    const int end = api.group_end();  // always closed, even after a failed call inside it
    if (first_error != kNcclSuccess) {
      check(NativeSource::kNccl, first_error, failed, failed_comm, ctx);
    }
    check(NativeSource::kNccl, end, "ncclGroupEnd", nullptr, ctx);
    wait_not_in_progress("nccl enqueue", deadline, ctx);  // non-blocking: enqueue finished
  }
  std::vector<NcclEvent> events(static_cast<std::size_t>(k), nullptr);
  for (int r = 0; r < k; ++r) {
    // The division kernel and the event belong to replica r's device, as its stream does.
    set_device(r, ctx);
    void* stream = streams[r];
    for (std::size_t i = 0; i < per_replica; ++i) {
      const DeviceCall& c = calls[static_cast<std::size_t>(r) * per_replica + i];
      if (c.op == ReduceOp::kMean &&
          (c.kind == DeviceCollective::kAllReduce || c.kind == DeviceCollective::kReduceScatter)) {
        check(NativeSource::kCuda, api.scale_divide(c.recv, c.count, c.dtype, o.world_size, stream),
              "mean division kernel (" + replica_text(r) + ")", nullptr, ctx);
      }
    }
    NcclEvent event = nullptr;
    const int e = api.event_create(&event);
    if (e != kCudaSuccess) {
      for (NcclEvent made : events) {
        if (made != nullptr) api.event_destroy(made);
      }
      check(NativeSource::kCuda, e, "cudaEventCreate (" + replica_text(r) + ")", nullptr, ctx);
    }
    events[static_cast<std::size_t>(r)] = event;
  }
  // Last to first: the caller returns with local replica 0's device current, as it came in
  // when it is replica 0's thread (CUDA's current device is per thread).
  for (int r = k - 1; r >= 0; --r) {
    set_device(r, ctx);
    const int e = api.event_record(events[static_cast<std::size_t>(r)], streams[r]);
    if (e != kCudaSuccess) {
      for (NcclEvent made : events) api.event_destroy(made);
      check(NativeSource::kCuda, e, "cudaEventRecord (" + replica_text(r) + ")", nullptr, ctx);
    }
  }
  auto work =
      std::make_shared<GroupWork>(shared_, std::move(events), deadline, ctx, o.timeout_seconds);
  last_ = work;
  return work;
}

void NcclReplicaGroup::abort(const std::string& reason) noexcept {
  ErrorContext ctx = context("abort", static_cast<std::int64_t>(seq_));
  shared_->fail(std::make_exception_ptr(
      InvalidUsage("the NCCL replica group was aborted by this process: " + reason, ctx)));
}

std::string NcclReplicaGroup::describe() const {
  std::string devices;
  for (int d : devices_) devices += (devices.empty() ? "" : ",") + std::to_string(d);
  const NcclGroupOptions& o = shared_->options;
  return std::string(shared_->api->name) + " (" + std::to_string(size()) + " local device(s) " +
         devices + ", ranks " + std::to_string(o.first_rank) + ".." +
         std::to_string(o.first_rank + size() - 1) + " of " + std::to_string(o.world_size) + ")";
}

}  // namespace mwms::collective
