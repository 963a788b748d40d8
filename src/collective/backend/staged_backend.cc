#include "collective/backend/staged_backend.h"

#include <algorithm>
#include <cstdio>

#include "common/exception_text.h"
#include "common/logging.h"

namespace mwms::collective {

namespace {

using common::Clock;
using common::Deadline;


}  // namespace

// The Work of one staged collective: an event recorded after its host->device copies.
class StagedWork final : public PolledDeviceWork {
 public:
  StagedWork(std::shared_ptr<StagedShared> shared, CudaEvent event, Deadline deadline,
             ErrorContext ctx, double timeout)
      : PolledDeviceWork("host-staged", std::move(ctx), timeout), shared_(std::move(shared)),
        event_(event), deadline_(deadline) {}

  ~StagedWork() override {
    if (event_ != nullptr) shared_->api->event_destroy(event_);
  }

 private:
  // One look at the event after the copies back.
  bool poll() noexcept override {
    const int q = shared_->api->event_query(event_);
    if (q == kCudaSuccess) return finish(nullptr);
    if (q != kCudaNotReady) {
      return fail(cuda_error(q, shared_->api->error_string(q), "cudaEventQuery (copy back)", ctx_));
    }
    if (Clock::now() > deadline_) {
      return fail(std::make_exception_ptr(TimeoutError(
          "host-staged " + ctx_.op + " seq " + std::to_string(ctx_.seq) +
              ": the copy back to the device did not complete within " + seconds_text(timeout_) +
              " (the stream is blocked by other work?)",
          timeout_context())));
    }
    return false;
  }

  bool fail(std::exception_ptr cause) noexcept {
    shared_->fail(cause);
    return finish(cause);
  }

  std::shared_ptr<StagedShared> shared_;
  CudaEvent event_;
  Deadline deadline_;
};

void StagedShared::fail(std::exception_ptr cause) noexcept {
  std::lock_guard<std::mutex> lock(mutex);
  if (!poison) poison = cause;
}

std::exception_ptr StagedShared::failure() {
  std::lock_guard<std::mutex> lock(mutex);
  return poison;
}

StagedBackend::StagedBackend(const CudaApi& api, std::unique_ptr<Communicator> engine,
                             StagedBackendOptions options)
    : shared_(std::make_shared<StagedShared>()), engine_(std::move(engine)),
      options_(std::move(options)) {
  shared_->api = &api;
  const ErrorContext ctx = context("host-staged init");
  int count = 0;
  const int r = api.get_device_count(&count);
  if (r != kCudaSuccess || count <= 0) {
    // cudaErrorInsufficientDriver: no NVIDIA driver; cudaErrorNoDevice: no GPU.
    const int code = r != kCudaSuccess ? r : kCudaErrorNoDevice;
    std::rethrow_exception(cuda_error(
        code, api.error_string(code),
        "no usable CUDA device on this machine (no NVIDIA driver or no GPU; DeviceCommunicator "
        "needs one, CPU buffers go through Communicator): cudaGetDeviceCount",
        ctx));
  }
  device_ = options_.local_rank % count;
  check(api.set_device(device_), "cudaSetDevice", ctx);
  MWMS_LOG_INFO(kInit, "host-staged device backend ready: rank " << engine_->rank() << " of "
                                                                 << engine_->world_size()
                                                                 << ", device " << device_);
}

StagedBackend::~StagedBackend() {
  if (last_) {
    try {
      last_->wait(std::nullopt);
    } catch (const std::exception& e) {
      MWMS_LOG_WARN(kColl, "host-staged: the last collective failed at shutdown: " << e.what());
    }
    last_.reset();
  }
  const CudaApi& api = *shared_->api;
  bool drained = true;
  if (drain_ != nullptr) {  // a failed collective's copies (launch)
    const int q =
        poll_event(api.event_query, drain_, common::deadline_after(options_.timeout_seconds));
    drained = q == kCudaSuccess;
    api.event_destroy(drain_);
  }
  for (CudaEvent e : piece_events_) api.event_destroy(e);
  if (stage_ != nullptr && !drained) {
    MWMS_LOG_WARN(kColl, "host-staged: copies of a failed collective still pending after "
                             << seconds_text(options_.timeout_seconds)
                             << "; the staging buffer is not freed");
  } else if (stage_ != nullptr) {
    const int r = api.free_host(stage_);
    if (r != 0) MWMS_LOG_WARN(kColl, "cudaFreeHost returned " << r << " (" << api.error_string(r) << ")");
  }
}

ErrorContext StagedBackend::context(const char* op) const {
  ErrorContext ctx = options_.context;
  if (engine_) {
    ctx.rank = engine_->rank();
    ctx.world_size = engine_->world_size();
    ctx.seq = static_cast<std::int64_t>(engine_->seq());
  }
  ctx.op = op;
  ctx.transport = "host-staged";
  return ctx;
}

void StagedBackend::check(int code, const char* call, const ErrorContext& ctx) {
  if (code == 0) return;
  std::exception_ptr e = cuda_error(code, shared_->api->error_string(code), call, ctx);
  shared_->fail(e);  // a failed copy leaves the device buffers in an unknown state
  std::rethrow_exception(e);
}

void StagedBackend::validate(const DeviceCall* calls, std::size_t num_calls,
                             const ErrorContext& ctx) {
  const int n = engine_->world_size();
  for (std::size_t i = 0; i < num_calls; ++i) {
    const DeviceCall& c = calls[i];
    const std::string what = std::string("host-staged ") + to_string(c.kind);
    if (num_calls > 1 && (c.kind != DeviceCollective::kAllReduce || c.dtype != calls[0].dtype ||
                          c.op != calls[0].op)) {
      throw InvalidArgument(what + ": a bucket is all-reduces of one dtype and op (tensor " +
                                std::to_string(i) + " differs)", ctx);
    }
    if (c.kind == DeviceCollective::kBroadcast && (c.root < 0 || c.root >= n)) {
      throw InvalidArgument(what + ": root " + std::to_string(c.root) +
                                " out of range for world size " + std::to_string(n), ctx);
    }
    if (c.count == 0) continue;
    const bool needs_send = c.kind == DeviceCollective::kReduceScatter ||
                            c.kind == DeviceCollective::kAllGather;
    const void* buffers[2] = {c.recv, c.send};
    for (int k = 0; k < (needs_send ? 2 : 1); ++k) {
      const void* p = buffers[k];
      if (p == nullptr) {
        throw InvalidArgument(what + ": null device buffer with count " +
                                  std::to_string(c.count), ctx);
      }
      int is_device = 0;
      const int r = shared_->api->pointer_is_device(p, &is_device);
      if (r != 0 || is_device == 0) {
        char addr[32];
        std::snprintf(addr, sizeof addr, "%p", p);
        throw InvalidArgument(what + ": buffer " + addr + " is not device memory (" +
                                  (r != 0 ? "cudaPointerGetAttributes failed" : "host memory") +
                                  "); host buffers go through Communicator", ctx);
      }
    }
  }
}

unsigned char* StagedBackend::stage(std::size_t bytes, const ErrorContext& ctx) {
  if (bytes <= stage_bytes_) return stage_;
  // Grow geometrically, in whole MiB, so that a slowly growing message size costs a handful of
  // cudaMallocHost calls in all (pinning is slow: milliseconds per hundred MiB).
  std::size_t want = std::max(bytes, stage_bytes_ * 2);
  want = (want + (std::size_t{1} << 20) - 1) & ~((std::size_t{1} << 20) - 1);
  if (stage_ != nullptr) {
    check(shared_->api->free_host(stage_), "cudaFreeHost", ctx);
    stage_ = nullptr;
    stage_bytes_ = 0;
  }
  void* p = nullptr;
  ErrorContext c = ctx;
  c.bytes = static_cast<std::int64_t>(want);
  check(shared_->api->malloc_host(&p, want), "cudaMallocHost (staging buffer)", c);
  stage_ = static_cast<unsigned char*>(p);
  stage_bytes_ = want;
  MWMS_LOG_DEBUG(kAlloc, "host-staged: pinned staging buffer grown to " << want << " bytes");
  return stage_;
}

void StagedBackend::copy(void* dst, const void* src, std::size_t bytes, CudaCopy kind,
                         void* stream, const ErrorContext& ctx) {
  if (bytes == 0) return;
  check(shared_->api->memcpy_async(dst, src, bytes, kind, stream),
        kind == CudaCopy::kDeviceToHost ? "cudaMemcpyAsync (device to host)"
                                        : "cudaMemcpyAsync (host to device)",
        ctx);
}

void StagedBackend::wait_event(CudaEvent event, const char* what, Deadline deadline,
                               const ErrorContext& ctx) {
  const int q = poll_event(shared_->api->event_query, event, deadline);
  if (q == kCudaSuccess) return;
  if (q != kCudaNotReady) check(q, what, ctx);
  ErrorContext t = ctx;
  t.timeout_seconds = options_.timeout_seconds;
  std::exception_ptr e = std::make_exception_ptr(
      TimeoutError(std::string("host-staged ") + ctx.op + ": " + what +
                       " did not complete within " + seconds_text(options_.timeout_seconds) +
                       " (a kernel before it on the stream is still running?)",
                   t));
  shared_->fail(e);
  std::rethrow_exception(e);
}

CudaEvent StagedBackend::piece_event(std::size_t i, const ErrorContext& ctx) {
  while (piece_events_.size() <= i) {
    CudaEvent e = nullptr;
    check(shared_->api->event_create(&e), "cudaEventCreate", ctx);
    piece_events_.push_back(e);
  }
  return piece_events_[i];
}

void StagedBackend::pipelined(const DeviceCall& call, const std::vector<Segment>& segments,
                              std::size_t total_bytes, void* stream, Deadline deadline,
                              const ErrorContext& ctx) {
  const std::size_t elem = dtype_size(call.dtype);
  const bool broadcast = call.kind == DeviceCollective::kBroadcast;
  const bool send = !broadcast || call.root == engine_->rank();  // copies its data out
  const bool receive = !broadcast || call.root != engine_->rank();  // copies a result back
  std::size_t piece = options_.pipeline_bytes / elem * elem;
  if (piece == 0 || piece >= total_bytes) piece = std::max<std::size_t>(total_bytes, elem);
  const std::size_t pieces = total_bytes == 0 ? 1 : (total_bytes + piece - 1) / piece;
  unsigned char* base = stage(total_bytes, ctx);
  // Runs `f(device, stage, bytes)` on the parts of the segments inside [lo, hi) of the stage.
  auto for_parts = [&](std::size_t lo, std::size_t hi, auto&& f) {
    for (const Segment& s : segments) {
      const std::size_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.bytes);
      if (a < b) f(static_cast<unsigned char*>(s.device) + (a - s.offset), base + a, b - a);
    }
  };
  if (send) {
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t lo = p * piece, hi = std::min(total_bytes, lo + piece);
      for_parts(lo, hi, [&](unsigned char* dev, unsigned char* host, std::size_t bytes) {
        copy(host, dev, bytes, CudaCopy::kDeviceToHost, stream, ctx);
      });
      check(shared_->api->event_record(piece_event(p, ctx), stream), "cudaEventRecord", ctx);
    }
  }
  for (std::size_t p = 0; p < pieces; ++p) {
    const std::size_t lo = p * piece, hi = std::min(total_bytes, lo + piece);
    if (send) wait_event(piece_event(p, ctx), "the copy to the host", deadline, ctx);
    void* data = total_bytes == 0 ? nullptr : base + lo;
    if (broadcast) {
      engine_->broadcast(data, (hi - lo) / elem, call.dtype, call.root);
    } else {
      engine_->all_reduce(data, (hi - lo) / elem, call.dtype, call.op);
    }
    if (receive) {
      for_parts(lo, hi, [&](unsigned char* dev, unsigned char* host, std::size_t bytes) {
        copy(dev, host, bytes, CudaCopy::kHostToDevice, stream, ctx);
      });
    }
  }
}

void StagedBackend::run(const DeviceCall* calls, std::size_t num_calls, void* stream,
                        Deadline deadline, const ErrorContext& ctx) {
  const DeviceCall& c = calls[0];
  const std::size_t elem = dtype_size(c.dtype);
  const int n = engine_->world_size();
  const int r = engine_->rank();
  switch (c.kind) {
    case DeviceCollective::kAllReduce:
    case DeviceCollective::kBroadcast: {
      // A bucket is packed one tensor after the other: one engine call covers all of them.
      segments_.clear();
      std::size_t total = 0;
      for (std::size_t i = 0; i < num_calls; ++i) {
        segments_.push_back({calls[i].recv, total, calls[i].count * elem});
        total += calls[i].count * elem;
      }
      pipelined(c, segments_, total, stream, deadline, ctx);
      return;
    }
    case DeviceCollective::kReduceScatter: {
      // recv is block r of the staged send (the engine allows the alias).
      const std::size_t block = c.count * elem;
      unsigned char* s = stage(block * static_cast<std::size_t>(n), ctx);
      copy(s, c.send, block * static_cast<std::size_t>(n), CudaCopy::kDeviceToHost, stream, ctx);
      check(shared_->api->event_record(piece_event(0, ctx), stream), "cudaEventRecord", ctx);
      wait_event(piece_event(0, ctx), "the copy to the host", deadline, ctx);
      unsigned char* mine = block == 0 ? nullptr : s + block * static_cast<std::size_t>(r);
      engine_->reduce_scatter(block == 0 ? nullptr : s, mine, c.count, c.dtype, c.op);
      copy(c.recv, mine, block, CudaCopy::kHostToDevice, stream, ctx);
      return;
    }
    case DeviceCollective::kAllGather: {
      // send is staged at block r of the result (the engine allows the alias).
      const std::size_t block = c.count * elem;
      unsigned char* s = stage(block * static_cast<std::size_t>(n), ctx);
      unsigned char* mine = block == 0 ? nullptr : s + block * static_cast<std::size_t>(r);
      copy(mine, c.send, block, CudaCopy::kDeviceToHost, stream, ctx);
      check(shared_->api->event_record(piece_event(0, ctx), stream), "cudaEventRecord", ctx);
      wait_event(piece_event(0, ctx), "the copy to the host", deadline, ctx);
      engine_->all_gather(mine, block == 0 ? nullptr : s, c.count, c.dtype);
      copy(c.recv, s, block * static_cast<std::size_t>(n), CudaCopy::kHostToDevice, stream, ctx);
      return;
    }
  }
}

std::shared_ptr<Work> StagedBackend::launch(const DeviceCall* calls, std::size_t num_calls,
                                            void* stream) {
  const char* op = num_calls == 1 ? to_string(calls[0].kind) : "bucket";
  ErrorContext ctx = context(op);
  throw_if_unusable(ctx);
  if (num_calls == 0) {
    throw InvalidArgument("host-staged bucket: no tensors", ctx);
  }
  validate(calls, num_calls, ctx);
  // CUDA's current device is per thread: make ours current for this thread.
  check(shared_->api->set_device(device_), "cudaSetDevice", ctx);
  // The previous call's copies back read the staging buffer, maybe on another stream.
  if (last_) {
    std::shared_ptr<StagedWork> previous = std::move(last_);
    previous->wait(std::nullopt);
  }
  const Deadline deadline = common::deadline_after(options_.timeout_seconds);
  try {
    run(calls, num_calls, stream, deadline, ctx);
  } catch (const InvalidArgument&) {
    throw;  // nothing ran
  } catch (const Error&) {
    shared_->fail(std::current_exception());  // the engine poisoned itself too
    // Copies may still be in flight on `stream`, to and from the staging buffer: the destructor
    // waits for this event (bounded) before it frees the buffer.
    if (drain_ == nullptr && shared_->api->event_create(&drain_) != 0) drain_ = nullptr;
    if (drain_ != nullptr && shared_->api->event_record(drain_, stream) != 0) {
      shared_->api->event_destroy(drain_);
      drain_ = nullptr;
    }
    throw;
  }
  CudaEvent event = nullptr;
  check(shared_->api->event_create(&event), "cudaEventCreate", ctx);
  auto work = std::make_shared<StagedWork>(shared_, event, deadline, ctx, options_.timeout_seconds);
  check(shared_->api->event_record(event, stream), "cudaEventRecord", ctx);
  last_ = work;
  return work;
}

void StagedBackend::throw_if_unusable(const ErrorContext& ctx) {
  if (finalized_) {
    throw InvalidUsage("the host-staged device communicator was finalized "
                       "(DeviceCommunicator::finalize); no collective can follow",
                       ctx);
  }
  if (std::exception_ptr cause = shared_->failure()) {
    throw InvalidUsage("the host-staged device communicator is poisoned by an earlier failure: " +
                           common::exception_text(cause), ctx);
  }
}

void StagedBackend::barrier(void* stream) {
  const ErrorContext ctx = context("barrier");
  throw_if_unusable(ctx);
  check(shared_->api->set_device(device_), "cudaSetDevice", ctx);
  const Deadline deadline = common::deadline_after(options_.timeout_seconds);
  try {
    CudaEvent before = piece_event(0, ctx);
    check(shared_->api->event_record(before, stream), "cudaEventRecord", ctx);
    wait_event(before, "the work enqueued on the stream before the barrier", deadline, ctx);
    engine_->barrier();
  } catch (const Error&) {
    shared_->fail(std::current_exception());
    throw;
  }
}

void StagedBackend::finalize() {
  if (finalized_) return;
  const ErrorContext ctx = context("finalize");
  throw_if_unusable(ctx);
  if (last_) {
    std::shared_ptr<StagedWork> previous = std::move(last_);
    previous->wait(std::nullopt);  // a failure poisoned us and is thrown
  }
  try {
    engine_->finalize();
  } catch (const Error&) {
    shared_->fail(std::current_exception());
    throw;
  }
  finalized_ = true;
}

void StagedBackend::abort(const std::string& reason) noexcept {
  ErrorContext ctx = context("abort");
  try {
    shared_->fail(std::make_exception_ptr(
        InvalidUsage("the host-staged device communicator was aborted by this rank: " + reason,
                     ctx)));
  } catch (...) {
  }
  engine_->abort(reason);
}

std::string StagedBackend::describe() const {
  return "host-staged (device " + std::to_string(device_) + ", world size " +
         std::to_string(engine_->world_size()) + "): " + engine_->describe();
}

}  // namespace mwms::collective
