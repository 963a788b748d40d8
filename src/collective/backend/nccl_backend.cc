#include "collective/backend/nccl_backend.h"

#include "collective/backend/cuda_api.h"
#include "common/exception_text.h"
#include "common/logging.h"

namespace mwms::collective {

namespace {

using common::Clock;
using common::Deadline;

using Backoff = PollBackoff;  // device_backend.h

const char* or_empty(const char* s) { return s ? s : ""; }


// A Work over a CUDA event recorded after the collective (Note [nccl deadlines]).
class NcclWork final : public PolledDeviceWork {
 public:
  NcclWork(std::shared_ptr<NcclShared> shared, NcclEvent event, Deadline deadline,
           ErrorContext ctx, double timeout)
      : PolledDeviceWork("nccl", std::move(ctx), timeout), shared_(std::move(shared)),
        event_(event), deadline_(deadline) {}

  ~NcclWork() override {
    if (event_ != nullptr) shared_->api->event_destroy(event_);
  }

 private:
  // One look at the collective (Note [nccl deadlines]).
  bool poll() noexcept override {
    const NcclApi& api = *shared_->api;
    if (std::exception_ptr cause = shared_->failure()) return finish(cause);
    const int q = api.event_query(event_);
    if (q == kCudaSuccess) return finish(nullptr);
    if (q != kCudaErrorNotReady) {
      return fail(to_error(api, NativeSource::kCuda, q, "cudaEventQuery", nullptr, ctx_));
    }
    bool in_progress = false;
    if (std::exception_ptr e = shared_->async_failure("nccl " + ctx_.op, ctx_, &in_progress)) {
      return fail(e);
    }
    if (Clock::now() > deadline_) {
      ErrorContext ctx = timeout_context();
      ctx.elapsed_seconds = timeout_ - common::seconds_left(deadline_);
      return fail(std::make_exception_ptr(TimeoutError(
          "nccl " + ctx_.op + " seq " + std::to_string(ctx_.seq) + " did not complete within " +
              seconds_text(timeout_) +
              ": a peer is dead, stalled or never called it; the NCCL communicator was aborted",
          ctx)));
    }
    return false;
  }

  bool fail(std::exception_ptr cause) noexcept {
    shared_->fail(cause);
    return finish(shared_->failure());
  }

  std::shared_ptr<NcclShared> shared_;
  NcclEvent event_;
  Deadline deadline_;
};

// ncclCommFinalize, polled until NCCL reports it done (every rank finalized) or `deadline`, then
// ncclCommDestroy; on failure ncclCommAbort instead. Caller holds s.mutex; the communicator is
// gone afterwards either way (s.destroyed or s.aborted set). Returns nullptr or the error (the
// TimeoutError or NCCL's). Never throws.
std::exception_ptr finalize_and_destroy(NcclShared& s, Deadline deadline, double limit,
                                        const ErrorContext& ctx) noexcept {
  const NcclApi& api = *s.api;
  s.destroyed = true;  // no one asks NCCL about this communicator from now on
  int r = api.comm_finalize(s.comm);
  std::exception_ptr error;
  if (r != kNcclSuccess && r != kNcclInProgress) {
    error = to_error(api, NativeSource::kNccl, r, "ncclCommFinalize", s.comm, ctx);
  } else {
    Backoff backoff;
    int async = kNcclInProgress;
    while (!error) {
      r = api.comm_get_async_error(s.comm, &async);
      if (r != kNcclSuccess) {
        error = to_error(api, NativeSource::kNccl, r, "ncclCommGetAsyncError (finalize)", s.comm, ctx);
      } else if (async == kNcclSuccess) {
        break;
      } else if (async != kNcclInProgress) {
        error = to_error(api, NativeSource::kNccl, async, "ncclCommFinalize", s.comm, ctx);
      } else if (Clock::now() > deadline) {
        ErrorContext t = ctx;
        t.timeout_seconds = limit;
        try {
          error = std::make_exception_ptr(TimeoutError(
              "ncclCommFinalize did not complete within " + seconds_text(limit) +
                  ": a rank has not finalized (every rank must call finalize) or is dead; the "
                  "NCCL communicator was aborted",
              t));
        } catch (...) {
          error = std::current_exception();  // std::bad_alloc
        }
      } else {
        backoff.pause();
      }
    }
    if (!error) {
      r = api.comm_destroy(s.comm);
      if (r == kNcclSuccess) return nullptr;
      error = to_error(api, NativeSource::kNccl, r, "ncclCommDestroy", s.comm, ctx);
    }
  }
  s.aborted = true;
  const int a = api.comm_abort(s.comm);
  if (a != kNcclSuccess) {
    MWMS_LOG_WARN(kColl, "ncclCommAbort returned " << a << " (" << or_empty(api.error_string(a)) << ")");
  }
  return error;
}


}  // namespace

const char* to_string(DeviceCollective kind) noexcept {
  switch (kind) {
    case DeviceCollective::kAllReduce: return "all_reduce";
    case DeviceCollective::kReduceScatter: return "reduce_scatter";
    case DeviceCollective::kAllGather: return "all_gather";
    case DeviceCollective::kBroadcast: return "broadcast";
  }
  return "?";
}

std::exception_ptr to_error(const NcclApi& api, NativeSource source, int code,
                            const std::string& call, NcclComm comm, ErrorContext ctx) noexcept {
  try {
    ctx.transport = "nccl";
    if (source == NativeSource::kCuda) {
      return cuda_error(code, api.cuda_error_string(code), call, ctx);
    }
    std::string text = call + " failed: NCCL error " + std::to_string(code) + " (" +
                       or_empty(api.error_string(code)) + ")";
    const char* last = comm != nullptr ? api.last_error(comm) : nullptr;
    if (last != nullptr && *last != '\0') text += ": " + std::string(last);
    if (code == kNcclRemoteError || code == kNcclSystemError) {
      return std::make_exception_ptr(
          PeerError(text + " (a peer or its connection failed; the NCCL communicator was aborted)",
                    ctx));
    }
    return std::make_exception_ptr(BackendError(text, code, ctx));
  } catch (...) {
    return std::current_exception();  // std::bad_alloc
  }
}

void NcclShared::fail(std::exception_ptr cause) noexcept {
  std::lock_guard<std::mutex> lock(mutex);
  if (!poison) poison = cause;
  if (!aborted && !destroyed && comm != nullptr) {
    aborted = true;
    const int r = api->comm_abort(comm);
    if (r != kNcclSuccess) {
      MWMS_LOG_WARN(kColl, "ncclCommAbort returned " << r << " (" << or_empty(api->error_string(r))
                                                     << ")");
    }
  }
}

std::exception_ptr NcclShared::failure() {
  std::lock_guard<std::mutex> lock(mutex);
  return poison;
}

std::exception_ptr NcclShared::async_failure(const std::string& what, const ErrorContext& ctx,
                                             bool* in_progress) noexcept {
  *in_progress = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (poison) return poison;
  if (aborted || destroyed || comm == nullptr) {
    try {
      return std::make_exception_ptr(InvalidUsage(
          what + ": the NCCL communicator was " + (aborted ? "aborted" : "destroyed") +
              " before the collective completed",
          ctx));
    } catch (...) {
      return std::current_exception();  // std::bad_alloc
    }
  }
  int async = kNcclSuccess;
  const int r = api->comm_get_async_error(comm, &async);
  if (r != kNcclSuccess) return to_error(*api, NativeSource::kNccl, r, "ncclCommGetAsyncError", comm, ctx);
  if (async != kNcclSuccess && async != kNcclInProgress) {
    return to_error(*api, NativeSource::kNccl, async, what, comm, ctx);
  }
  *in_progress = async == kNcclInProgress;
  return nullptr;
}

NcclBackend::NcclBackend(const NcclApi& api, const NcclUniqueId& id, NcclBackendOptions options)
    : shared_(std::make_shared<NcclShared>()) {
  shared_->api = &api;
  shared_->options = std::move(options);
  const NcclBackendOptions& o = shared_->options;
  const ErrorContext ctx = context("nccl init", -1);
  {
    const int r = api.set_device(o.local_rank, &device_);
    // The first CUDA call of the job: say plainly when this machine has no usable GPU
    // (cudaErrorInsufficientDriver 35: no NVIDIA driver; cudaErrorNoDevice 100: no GPU).
    check(NativeSource::kCuda, r,
          r == 35 || r == 100
              ? "no usable CUDA device on this machine (no NVIDIA driver or no GPU; "
                "DeviceCommunicator needs one, CPU buffers go through Communicator): "
                "cudaGetDeviceCount/cudaSetDevice"
              : "cudaGetDeviceCount/cudaSetDevice",
          ctx);
  }
  NcclComm comm = nullptr;
  const int r = api.comm_init_rank(&comm, o.world_size, &id, o.rank);
  shared_->comm = comm;
  if (r != kNcclSuccess && r != kNcclInProgress) {
    std::exception_ptr e = to_error(api, NativeSource::kNccl, r, "ncclCommInitRankConfig", comm, ctx);
    if (comm != nullptr) shared_->fail(e);
    std::rethrow_exception(e);
  }
  wait_not_in_progress("ncclCommInitRankConfig", common::deadline_after(o.init_timeout_seconds),
                       ctx);
  MWMS_LOG_INFO(kInit, "nccl communicator ready: rank " << o.rank << " of " << o.world_size
                                                        << ", device " << device_);
}

NcclBackend::~NcclBackend() {
  if (std::shared_ptr<Work> last = std::move(last_)) {
    try {
      last->wait();
    } catch (const std::exception& e) {
      MWMS_LOG_WARN(kColl, "nccl: the last collective failed at shutdown: " << e.what());
    }
  }
  {
    NcclShared& s = *shared_;
    std::lock_guard<std::mutex> lock(s.mutex);
    // ncclCommAbort freed the communicator, or finalize() destroyed it.
    if (!s.aborted && !s.destroyed && s.comm != nullptr) {
      const double limit = s.options.timeout_seconds;
      if (std::exception_ptr e =
              finalize_and_destroy(s, common::deadline_after(limit), limit,
                                   context("finalize", static_cast<std::int64_t>(seq_)))) {
        MWMS_LOG_WARN(kColl, "nccl: finalize at shutdown failed, the communicator was aborted: "
                                 << common::exception_text(e));
      }
    }
  }
  // Only now: cudaFree synchronizes the device, so it would wait for a kernel of a collective
  // nobody waited for; after the destroy or the abort none is left.
  free_scratch();
}

void NcclBackend::free_scratch() noexcept {
  if (scratch_ == nullptr) return;
  int device = -1;
  shared_->api->set_device(shared_->options.local_rank, &device);  // cudaFree on our device
  const int r = shared_->api->free_device(scratch_);
  if (r != kCudaSuccess) {
    MWMS_LOG_WARN(kColl, "nccl: cudaFree of the barrier buffer returned "
                             << r << " (" << or_empty(shared_->api->cuda_error_string(r)) << ")");
  }
  scratch_ = nullptr;
}

void NcclBackend::throw_if_unusable(const ErrorContext& ctx) const {
  std::exception_ptr cause;
  bool finalized = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    cause = shared_->poison;
    finalized = shared_->finalized;
  }
  if (finalized) {
    throw InvalidUsage("the NCCL communicator was finalized (DeviceCommunicator::finalize); no "
                       "collective can follow",
                       ctx);
  }
  if (cause) {
    throw InvalidUsage(
        "the NCCL communicator is poisoned by an earlier failure: " + common::exception_text(cause),
        ctx);
  }
}

void NcclBackend::barrier(void* stream) {
  const ErrorContext ctx = context("barrier", static_cast<std::int64_t>(seq_));
  throw_if_unusable(ctx);
  if (scratch_ == nullptr) {  // Note [nccl barrier]
    const NcclApi& api = *shared_->api;
    int device = -1;
    check(NativeSource::kCuda, api.set_device(shared_->options.local_rank, &device), "cudaSetDevice",
          ctx);
    const int r = api.malloc_device(&scratch_, sizeof(std::int32_t));
    if (r != kCudaSuccess) {
      scratch_ = nullptr;
      std::rethrow_exception(
          to_error(api, NativeSource::kCuda, r, "cudaMalloc (the barrier's 4 bytes)", nullptr, ctx));
    }
  }
  const DeviceCall call{DeviceCollective::kAllReduce, scratch_, scratch_, 1, DataType::kInt32,
                        ReduceOp::kMax, 0};
  launch_as("barrier", &call, 1, stream)->wait();
}

void NcclBackend::finalize() {
  const ErrorContext ctx = context("finalize", static_cast<std::int64_t>(seq_));
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->finalized) return;
  }
  throw_if_unusable(ctx);
  if (std::shared_ptr<Work> last = std::move(last_)) last->wait();  // its error poisoned us
  NcclShared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.poison) std::rethrow_exception(s.poison);  // another thread's failure meanwhile
  const double limit = s.options.timeout_seconds;
  std::exception_ptr e = finalize_and_destroy(s, common::deadline_after(limit), limit, ctx);
  if (e && !s.poison) s.poison = e;
  if (!e) s.finalized = true;
  lock.unlock();
  free_scratch();  // after the destroy or abort (see the destructor)
  if (e) std::rethrow_exception(e);
  MWMS_LOG_DEBUG(kColl, "nccl: communicator finalized after " << seq_ << " launch(es)");
}

ErrorContext NcclBackend::context(const char* op, std::int64_t seq) const {
  ErrorContext ctx = shared_->options.context;
  ctx.rank = shared_->options.rank;
  ctx.world_size = shared_->options.world_size;
  ctx.op = op;
  ctx.seq = seq;
  ctx.transport = "nccl";
  return ctx;
}

void NcclBackend::check(NativeSource source, int code, const char* call, const ErrorContext& ctx) {
  const bool ok = source == NativeSource::kCuda ? code == kCudaSuccess
                                                : (code == kNcclSuccess || code == kNcclInProgress);
  if (ok) return;
  std::exception_ptr e = to_error(*shared_->api, source, code, call, shared_->comm, ctx);
  // A bad argument broke nothing; anything else leaves the communicator in an unknown state.
  if (!(source == NativeSource::kNccl && code == kNcclInvalidArgument)) shared_->fail(e);
  std::rethrow_exception(e);
}

void NcclBackend::wait_not_in_progress(const char* what, Deadline deadline,
                                       const ErrorContext& ctx) {
  const double limit = common::seconds_left(deadline);
  Backoff backoff;
  for (;;) {
    bool in_progress = false;
    if (std::exception_ptr e = shared_->async_failure(what, ctx, &in_progress)) {
      shared_->fail(e);
      std::rethrow_exception(e);
    }
    if (!in_progress) return;
    if (Clock::now() > deadline) {
      ErrorContext t = ctx;
      t.timeout_seconds = limit;
      std::exception_ptr e = std::make_exception_ptr(TimeoutError(
          std::string(what) + " still in progress after " + seconds_text(limit) + " (world size " +
              std::to_string(shared_->options.world_size) +
              "): a rank never joined or is stalled; the NCCL communicator was aborted",
          t));
      shared_->fail(e);
      std::rethrow_exception(e);
    }
    backoff.pause();
  }
}

std::shared_ptr<Work> NcclBackend::launch(const DeviceCall* calls, std::size_t num_calls,
                                          void* stream) {
  return launch_as(num_calls == 1 ? to_string(calls[0].kind) : "group", calls, num_calls, stream);
}

std::shared_ptr<Work> NcclBackend::launch_as(const char* op, const DeviceCall* calls,
                                             std::size_t num_calls, void* stream) {
  const NcclApi& api = *shared_->api;
  const NcclBackendOptions& o = shared_->options;
  ErrorContext ctx = context(op, static_cast<std::int64_t>(seq_));
  throw_if_unusable(ctx);
  for (std::size_t i = 0; i < num_calls; ++i) {
    const DeviceCall& c = calls[i];
    if (c.count > 0 && (c.recv == nullptr || (c.kind != DeviceCollective::kBroadcast && c.send == nullptr))) {
      throw InvalidArgument(std::string("nccl ") + to_string(c.kind) + ": null device buffer with count " +
                                std::to_string(c.count), ctx);
    }
    if (c.kind == DeviceCollective::kBroadcast && (c.root < 0 || c.root >= o.world_size)) {
      throw InvalidArgument("nccl broadcast: root " + std::to_string(c.root) +
                                " out of range for world size " + std::to_string(o.world_size), ctx);
    }
  }
  const Deadline deadline = common::deadline_after(o.timeout_seconds);
  ++seq_;
  // The calling thread may not be the one that created the backend, and CUDA's current device is
  // per thread: the event below must be made on this rank's device (as `stream` is).
  int device = -1;
  check(NativeSource::kCuda, api.set_device(o.local_rank, &device), "cudaSetDevice", ctx);
  const bool group = num_calls > 1;
  if (group) check(NativeSource::kNccl, api.group_start(), "ncclGroupStart", ctx);
  int first_error = kNcclSuccess;
  const char* failed_call = nullptr;
  for (std::size_t i = 0; i < num_calls && first_error == kNcclSuccess; ++i) {
    const DeviceCall& c = calls[i];
    int r = kNcclSuccess;
    switch (c.kind) {
      case DeviceCollective::kAllReduce:
        r = api.all_reduce(c.send, c.recv, c.count, c.dtype, c.op, shared_->comm, stream);
        break;
      case DeviceCollective::kReduceScatter:
        r = api.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op, shared_->comm, stream);
        break;
      case DeviceCollective::kAllGather:
        r = api.all_gather(c.send, c.recv, c.count, c.dtype, shared_->comm, stream);
        break;
      case DeviceCollective::kBroadcast:
        r = api.broadcast(c.send, c.recv, c.count, c.dtype, c.root, shared_->comm, stream);
        break;
    }
    if (r != kNcclSuccess && r != kNcclInProgress) {
      first_error = r;
      failed_call = to_string(c.kind);
    }
  }
  // A group is always closed, even after a failed call inside it (NCCL requires it).
  const int end = group ? api.group_end() : kNcclSuccess;
  if (first_error != kNcclSuccess) {
    check(NativeSource::kNccl, first_error, (std::string("nccl ") + failed_call).c_str(), ctx);
  }
  check(NativeSource::kNccl, end, "ncclGroupEnd", ctx);
  wait_not_in_progress("nccl enqueue", deadline, ctx);  // non-blocking comm: enqueue finished
  for (std::size_t i = 0; i < num_calls; ++i) {
    const DeviceCall& c = calls[i];
    if (c.op == ReduceOp::kMean && (c.kind == DeviceCollective::kAllReduce ||
                                    c.kind == DeviceCollective::kReduceScatter)) {
      check(NativeSource::kCuda, api.scale_divide(c.recv, c.count, c.dtype, o.world_size, stream),
            "mean division kernel", ctx);
    }
  }
  NcclEvent event = nullptr;
  check(NativeSource::kCuda, api.event_create(&event), "cudaEventCreate", ctx);
  auto work = std::make_shared<NcclWork>(shared_, event, deadline, ctx, o.timeout_seconds);
  check(NativeSource::kCuda, api.event_record(event, stream), "cudaEventRecord", ctx);
  last_ = work;
  return work;
}

void NcclBackend::abort(const std::string& reason) noexcept {
  ErrorContext ctx = context("abort", static_cast<std::int64_t>(seq_));
  shared_->fail(std::make_exception_ptr(
      InvalidUsage("the NCCL communicator was aborted by this rank: " + reason, ctx)));
}

std::string NcclBackend::describe() const {
  return std::string(shared_->api->name) + " (device " + std::to_string(device_) + ", world size " +
         std::to_string(shared_->options.world_size) + ")";
}

}  // namespace mwms::collective
