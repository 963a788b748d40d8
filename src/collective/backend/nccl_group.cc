// NcclReplicaGroup: the one owner of NCCL communicators (nccl_group.h; its Work and failure path
// are in nccl_work.cc).
#include "collective/backend/nccl_group.h"

#include <algorithm>

#include "collective/backend/nccl_work.h"
#include "common/exception_text.h"
#include "common/logging.h"

namespace mwms::collective {

namespace {

using common::Clock;
using common::Deadline;

// NCCL refuses more operations than this between ncclGroupStart and ncclGroupEnd.
constexpr std::size_t kMaxGroupCalls = 2048;

// What the first CUDA call of the job says when it fails: plainly that this machine has no usable
// GPU (cudaErrorInsufficientDriver: no NVIDIA driver; cudaErrorNoDevice: no GPU).
std::string set_device_call(NcclGroupRole role, int code, int r, int index) {
  const bool no_gpu = code == kCudaErrorInsufficientDriver || code == kCudaErrorNoDevice;
  if (role == NcclGroupRole::kRank) {
    return no_gpu ? "no usable CUDA device on this machine (no NVIDIA driver or no GPU; "
                    "DeviceCommunicator needs one, CPU buffers go through Communicator): "
                    "cudaGetDeviceCount/cudaSetDevice"
                  : "cudaGetDeviceCount/cudaSetDevice";
  }
  return no_gpu ? "no usable CUDA device for " + replica_text(r) +
                      " (no NVIDIA driver or no GPU): cudaSetDevice"
                : "cudaSetDevice(" + std::to_string(index) + ") for " + replica_text(r);
}

int enqueue_one(const NcclApi& api, const DeviceCall& c, NcclComm comm, void* stream) {
  switch (c.kind) {
    case DeviceCollective::kAllReduce:
      return api.all_reduce(c.send, c.recv, c.count, c.dtype, c.op, comm, stream);
    case DeviceCollective::kReduceScatter:
      return api.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op, comm, stream);
    case DeviceCollective::kAllGather:
      return api.all_gather(c.send, c.recv, c.count, c.dtype, comm, stream);
    case DeviceCollective::kBroadcast:
      return api.broadcast(c.send, c.recv, c.count, c.dtype, c.root, comm, stream);
  }
  return kNcclInvalidArgument;
}

}  // namespace

NcclReplicaGroup::NcclReplicaGroup(const NcclApi& api, const NcclUniqueId& id,
                                   NcclGroupOptions options)
    : shared_(std::make_shared<NcclGroupShared>()) {
  shared_->api = &api;
  shared_->options = std::move(options);
  const NcclGroupOptions& o = shared_->options;
  const bool grouped = o.role == NcclGroupRole::kReplicas;
  const ErrorContext ctx = context(grouped ? "nccl group init" : "nccl init", -1);
  const int k = static_cast<int>(o.devices.size());
  if (k == 0 || o.first_rank < 0 || o.first_rank + k > o.world_size) {
    throw InvalidArgument("nccl replica group: " + std::to_string(k) +
                              " local device(s) from rank " + std::to_string(o.first_rank) +
                              " do not fit a world of " + std::to_string(o.world_size),
                          ctx);
  }
  devices_.assign(static_cast<std::size_t>(k), -1);
  shared_->comms.assign(static_cast<std::size_t>(k), nullptr);
  if (grouped) check(NativeSource::kNccl, api.group_start(), "ncclGroupStart", nullptr, ctx);
  std::exception_ptr error;
  for (int r = 0; r < k && !error; ++r) {
    try {
      init_replica(r, id, ctx);
    } catch (...) {
      error = std::current_exception();
    }
  }
  // A group is always closed, even after a failed call inside it (NCCL requires it).
  const int end = grouped ? api.group_end() : kNcclSuccess;
  if (error) {
    shared_->fail(error);  // aborts the communicators init returned, if any
    std::rethrow_exception(error);
  }
  check(NativeSource::kNccl, end, "ncclGroupEnd (communicator init)", nullptr, ctx);
  wait_not_in_progress("ncclCommInitRankConfig", common::deadline_after(o.init_timeout_seconds),
                       ctx);
  if (k > 1) set_device(0, ctx);  // the constructing thread keeps local replica 0's device
  if (grouped) {
    MWMS_LOG_INFO(kInit, "nccl replica group ready: " << describe());
  } else {
    MWMS_LOG_INFO(kInit, "nccl communicator ready: rank " << o.first_rank << " of " << o.world_size
                                                          << ", device " << devices_[0]);
  }
}

void NcclReplicaGroup::init_replica(int r, const NcclUniqueId& id, const ErrorContext& ctx) {
  const NcclApi& api = *shared_->api;
  const NcclGroupOptions& o = shared_->options;
  const int index = o.devices[static_cast<std::size_t>(r)];
  int device = -1;
  if (const int d = api.set_device(index, &device); d != kCudaSuccess) {
    std::rethrow_exception(
        to_error(api, NativeSource::kCuda, d, set_device_call(o.role, d, r, index), nullptr, ctx));
  }
  for (int q = 0; q < r; ++q) {
    if (devices_[static_cast<std::size_t>(q)] != device) continue;
    // The device is picked modulo the host's device count: more replicas than devices wrap
    // onto one GPU, which NCCL would refuse later as "Duplicate GPU detected".
    throw InvalidUsage(
        replica_text(q) + " and " + replica_text(r) + " would share CUDA device " +
            std::to_string(device) + " (asked for devices " + std::to_string(o.devices.front()) +
            ".." + std::to_string(o.devices.back()) +
            "): this host has fewer CUDA devices than its processes' GPU replicas; use at "
            "most one replica per device (ReplicaOptions::local_replicas x processes per host)",
        ctx);
  }
  devices_[static_cast<std::size_t>(r)] = device;
  NcclComm comm = nullptr;
  const int c = api.comm_init_rank(&comm, o.world_size, &id, o.first_rank + r);
  shared_->comms[static_cast<std::size_t>(r)] = comm;
  if (c != kNcclSuccess && c != kNcclInProgress) {
    const std::string call = o.role == NcclGroupRole::kRank
                                 ? std::string("ncclCommInitRankConfig")
                                 : "ncclCommInitRankConfig (" + replica_text(r) + ", rank " +
                                       std::to_string(o.first_rank + r) + ")";
    std::rethrow_exception(to_error(api, NativeSource::kNccl, c, call, comm, ctx));
  }
}

NcclReplicaGroup::~NcclReplicaGroup() {
  const char* label = role_text(shared_->options.role).label;
  if (std::shared_ptr<Work> last = std::move(last_)) {
    try {
      last->wait();
    } catch (const std::exception& e) {
      MWMS_LOG_WARN(kColl, label << ": the last collective failed at shutdown: " << e.what());
    }
  }
  NcclGroupShared& s = *shared_;
  std::lock_guard<std::mutex> lock(s.mutex);
  // ncclCommAbort freed the communicators, or finalize() destroyed them.
  if (s.aborted || s.destroyed) return;
  if (std::exception_ptr e = finalize_locked()) {
    MWMS_LOG_WARN(kColl, label << ": finalize at shutdown failed, the communicators were aborted: "
                               << common::exception_text(e));
  }
}

namespace {

// ncclCommFinalize on every communicator, then each polled until NCCL reports it globally
// quiescent or an error, or the deadline passed: (*state)[r] is the last status (in progress:
// the deadline passed), (*call)[r] the call that gave it. Non-blocking communicators: each
// finalize returns at once (in progress), so one thread can finalize all K without waiting on the
// first for the others.
void finalize_all(const NcclGroupShared& s, std::vector<int>* state,
                  std::vector<const char*>* call) noexcept {
  const NcclApi& api = *s.api;
  state->assign(s.comms.size(), kNcclInProgress);
  call->assign(s.comms.size(), "ncclCommFinalize");
  for (std::size_t r = 0; r < s.comms.size(); ++r) {
    if (s.comms[r] == nullptr) continue;
    const int f = api.comm_finalize(s.comms[r]);
    if (f != kNcclSuccess && f != kNcclInProgress) (*state)[r] = f;
  }
  const Deadline deadline = common::deadline_after(s.options.timeout_seconds);
  PollBackoff backoff;
  for (;;) {
    bool pending = false;
    for (std::size_t r = 0; r < s.comms.size(); ++r) {
      if (s.comms[r] == nullptr || (*state)[r] != kNcclInProgress) continue;
      int async = kNcclSuccess;
      if (const int q = api.comm_get_async_error(s.comms[r], &async); q != kNcclSuccess) {
        async = q;
        (*call)[r] = "ncclCommGetAsyncError (finalize)";
      }
      (*state)[r] = async;
      pending = pending || async == kNcclInProgress;
    }
    if (!pending || Clock::now() > deadline) return;
    backoff.pause();
  }
}

// The TimeoutError of a finalize of communicator r that never completed. Never throws.
std::exception_ptr finalize_timeout(const NcclGroupShared& s, std::size_t r,
                                    const ErrorContext& ctx) noexcept {
  try {
    const NcclRoleText& words = role_text(s.options.role);
    ErrorContext t = ctx;
    t.timeout_seconds = s.options.timeout_seconds;
    const std::string of = s.options.role == NcclGroupRole::kRank
                               ? std::string()
                               : " of " + replica_text(static_cast<int>(r));
    return std::make_exception_ptr(TimeoutError(
        "ncclCommFinalize" + of + " did not complete within " +
            seconds_text(s.options.timeout_seconds) + ": a rank has not finalized (every " +
            words.peers + " must call finalize) or is dead; " + words.aborted,
        t));
  } catch (...) {
    return std::current_exception();  // std::bad_alloc
  }
}

}  // namespace

std::exception_ptr NcclReplicaGroup::finalize_locked() noexcept {
  NcclGroupShared& s = *shared_;
  s.destroyed = true;  // no one asks NCCL about these communicators from now on
  const NcclApi& api = *s.api;
  const ErrorContext ctx = context("finalize", static_cast<std::int64_t>(seq_));
  std::vector<int> state;
  std::vector<const char*> call;
  finalize_all(s, &state, &call);
  std::exception_ptr first;
  for (std::size_t r = 0; r < s.comms.size(); ++r) {
    if (s.comms[r] == nullptr) continue;
    if (state[r] == kNcclSuccess) {
      const int d = api.comm_destroy(s.comms[r]);
      if (d == kNcclSuccess) continue;
      state[r] = d;
      call[r] = "ncclCommDestroy";
    }
    if (first) continue;
    first = state[r] == kNcclInProgress ? finalize_timeout(s, r, ctx)
                                        : to_error(api, NativeSource::kNccl, state[r],
                                                   call[r] + s.where(r), s.comms[r], ctx);
  }
  if (!first) return nullptr;
  // Every communicator not destroyed cleanly is aborted; a destroyed one is gone and is skipped.
  s.aborted = true;
  for (std::size_t r = 0; r < s.comms.size(); ++r) {
    if (s.comms[r] != nullptr && state[r] != kNcclSuccess) abort_comm(api, s.comms[r]);
  }
  return first;
}

void NcclReplicaGroup::finalize() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->finalized) return;
  }
  throw_if_unusable(context("finalize", static_cast<std::int64_t>(seq_)));
  if (std::shared_ptr<Work> last = std::move(last_)) last->wait();  // its error poisoned the group
  NcclGroupShared& s = *shared_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.poison) std::rethrow_exception(s.poison);  // another thread's failure meanwhile
  if (std::exception_ptr e = finalize_locked()) {
    if (!s.poison) s.poison = e;
    std::rethrow_exception(e);
  }
  s.finalized = true;
  MWMS_LOG_DEBUG(kColl,
                 role_text(s.options.role).label << ": finalized after " << seq_ << " launch(es)");
}

void NcclReplicaGroup::throw_if_unusable(const ErrorContext& ctx) const {
  std::exception_ptr cause;
  bool finalized = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    cause = shared_->poison;
    finalized = shared_->finalized;
  }
  const NcclGroupRole role = shared_->options.role;
  const std::string subject = role_text(role).subject;
  if (finalized) {
    throw InvalidUsage(subject + " was finalized" +
                           (role == NcclGroupRole::kRank ? " (DeviceCommunicator::finalize)" : "") +
                           "; no collective can follow",
                       ctx);
  }
  if (cause) {
    throw InvalidUsage(
        subject + " is poisoned by an earlier failure: " + common::exception_text(cause), ctx);
  }
}

bool NcclReplicaGroup::released() const noexcept {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->aborted || shared_->destroyed;
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
  const double limit = common::seconds_left(deadline);
  std::vector<bool> pending(shared_->comms.size(), true);
  PollBackoff backoff;
  for (;;) {
    bool any = false;
    for (std::size_t r = 0; r < pending.size(); ++r) {
      if (!pending[r]) continue;
      bool in_progress = false;
      if (std::exception_ptr e = shared_->async_failure(r, what, ctx, &in_progress)) {
        shared_->fail(e);
        std::rethrow_exception(e);
      }
      pending[r] = in_progress;
      any = any || in_progress;
    }
    if (!any) return;
    if (Clock::now() > deadline) {
      const NcclGroupRole role = shared_->options.role;
      ErrorContext t = ctx;
      t.timeout_seconds = limit;
      std::exception_ptr e = std::make_exception_ptr(TimeoutError(
          std::string(what) + " still in progress" + on_replicas(role, pending) + " after " +
              seconds_text(limit) + " (world size " + std::to_string(shared_->options.world_size) +
              "): a rank never joined or is stalled; " + role_text(role).aborted,
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
        "cudaSetDevice" + shared_->where(static_cast<std::size_t>(r)), nullptr, ctx);
}

void NcclReplicaGroup::check_calls(const DeviceCall* calls, std::size_t per_replica,
                                   const ErrorContext& ctx) {
  const int world = shared_->options.world_size;
  const bool named = shared_->options.role == NcclGroupRole::kReplicas;
  const std::size_t total = per_replica * static_cast<std::size_t>(size());
  for (std::size_t i = 0; i < total; ++i) {
    const DeviceCall& c = calls[i];
    const std::string who =
        named ? " of " + replica_text(static_cast<int>(i / per_replica)) : std::string();
    if (c.count > 0 &&
        (c.recv == nullptr || (c.kind != DeviceCollective::kBroadcast && c.send == nullptr))) {
      throw InvalidArgument(std::string("nccl ") + to_string(c.kind) + who +
                                ": null device buffer with count " + std::to_string(c.count),
                            ctx);
    }
    if (c.kind == DeviceCollective::kBroadcast && (c.root < 0 || c.root >= world)) {
      throw InvalidArgument("nccl broadcast" + who + ": root " + std::to_string(c.root) +
                                " out of range for world size " + std::to_string(world),
                            ctx);
    }
  }
}

void NcclReplicaGroup::enqueue(const DeviceCall* calls, std::size_t per_replica, std::size_t begin,
                               std::size_t end, void* const* streams, const ErrorContext& ctx) {
  const NcclApi& api = *shared_->api;
  // kRank groups only a bucket; kReplicas always (Note [nccl replica group]).
  const bool grouped = shared_->options.role == NcclGroupRole::kReplicas || end - begin > 1;
  if (grouped) check(NativeSource::kNccl, api.group_start(), "ncclGroupStart", nullptr, ctx);
  int first_error = kNcclSuccess;
  std::string failed;
  NcclComm failed_comm = nullptr;
  for (int r = 0; r < size() && first_error == kNcclSuccess; ++r) {
    NcclComm comm = shared_->comms[static_cast<std::size_t>(r)];
    for (std::size_t i = begin; i < end && first_error == kNcclSuccess; ++i) {
      const DeviceCall& c = calls[static_cast<std::size_t>(r) * per_replica + i];
      const int res = enqueue_one(api, c, comm, streams[r]);
      if (res != kNcclSuccess && res != kNcclInProgress) {
        first_error = res;
        failed =
            std::string("nccl ") + to_string(c.kind) + shared_->where(static_cast<std::size_t>(r));
        failed_comm = comm;
      }
    }
  }
  // A group is always closed, even after a failed call inside it (NCCL requires it).
  const int group_end = grouped ? api.group_end() : kNcclSuccess;
  if (first_error != kNcclSuccess)
    check(NativeSource::kNccl, first_error, failed, failed_comm, ctx);
  check(NativeSource::kNccl, group_end, "ncclGroupEnd", nullptr, ctx);
}

std::vector<NcclEvent> NcclReplicaGroup::record_events(const DeviceCall* calls,
                                                       std::size_t per_replica,
                                                       void* const* streams,
                                                       const ErrorContext& ctx) {
  const NcclApi& api = *shared_->api;
  const int k = size();
  std::vector<NcclEvent> events(static_cast<std::size_t>(k), nullptr);
  const auto destroy_all = [&] {
    for (NcclEvent made : events) {
      if (made != nullptr) api.event_destroy(made);
    }
  };
  for (int r = 0; r < k; ++r) {
    const std::string where = shared_->where(static_cast<std::size_t>(r));
    // The division kernel and the event belong to replica r's device, as its stream does (the
    // calling thread may not be the one that created the group: the current device is per
    // thread). K = 1: launch() made it current.
    if (k > 1) set_device(r, ctx);
    for (std::size_t i = 0; i < per_replica; ++i) {
      const DeviceCall& c = calls[static_cast<std::size_t>(r) * per_replica + i];
      if (c.op == ReduceOp::kMean &&
          (c.kind == DeviceCollective::kAllReduce || c.kind == DeviceCollective::kReduceScatter)) {
        check(NativeSource::kCuda,
              api.scale_divide(c.recv, c.count, c.dtype, shared_->options.world_size, streams[r]),
              "mean division kernel" + where, nullptr, ctx);
      }
    }
    NcclEvent event = nullptr;
    if (const int e = api.event_create(&event); e != kCudaSuccess) {
      destroy_all();
      check(NativeSource::kCuda, e, "cudaEventCreate" + where, nullptr, ctx);
    }
    events[static_cast<std::size_t>(r)] = event;
  }
  // Last to first: the caller returns with local replica 0's device current, as it came in when
  // it is replica 0's thread.
  for (int r = k - 1; r >= 0; --r) {
    if (k > 1) set_device(r, ctx);
    if (const int e = api.event_record(events[static_cast<std::size_t>(r)], streams[r]);
        e != kCudaSuccess) {
      destroy_all();
      check(NativeSource::kCuda, e, "cudaEventRecord" + shared_->where(static_cast<std::size_t>(r)),
            nullptr, ctx);
    }
  }
  return events;
}

std::shared_ptr<Work> NcclReplicaGroup::launch(const DeviceCall* calls, std::size_t per_replica,
                                               void* const* streams, const char* op) {
  const NcclGroupOptions& o = shared_->options;
  if (op == nullptr) op = per_replica == 1 ? to_string(calls[0].kind) : "group";
  const ErrorContext ctx = context(op, static_cast<std::int64_t>(seq_));
  throw_if_unusable(ctx);
  check_calls(calls, per_replica, ctx);
  const Deadline deadline = common::deadline_after(o.timeout_seconds);
  ++seq_;
  // One device: make it current for the calling thread once, before NCCL sees the stream (K > 1:
  // record_events sets each replica's in turn).
  if (size() == 1) set_device(0, ctx);
  // Groups of at most kMaxGroupCalls NCCL calls, each holding whole tensors of every replica
  // (tensor i of all K replicas in the same group: they are one collective).
  const std::size_t per_group =
      std::max<std::size_t>(1, kMaxGroupCalls / static_cast<std::size_t>(size()));
  for (std::size_t begin = 0; begin < per_replica; begin += per_group) {
    enqueue(calls, per_replica, begin, std::min(per_replica, begin + per_group), streams, ctx);
    wait_not_in_progress("nccl enqueue", deadline, ctx);  // non-blocking: enqueue finished
  }
  last_ = make_nccl_work(shared_, record_events(calls, per_replica, streams, ctx), deadline, ctx,
                         o.timeout_seconds);
  return last_;
}

void NcclReplicaGroup::abort(const std::string& reason) noexcept {
  const bool rank = shared_->options.role == NcclGroupRole::kRank;
  ErrorContext ctx = context("abort", static_cast<std::int64_t>(seq_));
  shared_->fail(std::make_exception_ptr(
      InvalidUsage(std::string(role_text(shared_->options.role).subject) + " was aborted by this " +
                       (rank ? "rank: " : "process: ") + reason,
                   ctx)));
}

std::string NcclReplicaGroup::describe() const {
  const NcclGroupOptions& o = shared_->options;
  if (o.role == NcclGroupRole::kRank) {
    return std::string(shared_->api->name) + " (device " + std::to_string(devices_[0]) +
           ", world size " + std::to_string(o.world_size) + ")";
  }
  std::string devices;
  for (int d : devices_) devices += (devices.empty() ? "" : ",") + std::to_string(d);
  return std::string(shared_->api->name) + " (" + std::to_string(size()) + " local device(s) " +
         devices + ", ranks " + std::to_string(o.first_rank) + ".." +
         std::to_string(o.first_rank + size() - 1) + " of " + std::to_string(o.world_size) + ")";
}

}  // namespace mwms::collective
