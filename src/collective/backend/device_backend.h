// What DeviceCommunicator (device_communicator.cc) runs a collective on device buffers with: the
// NCCL backend (nccl_backend.h: the collective handed whole to NCCL on the caller's stream; the
// K = 1 case of the NCCL replica group, nccl_group.h) or
// the host-staged backend (staged_backend.h: device -> pinned host -> the engine -> device).
// DeviceCommunicator::create picks one (Note [device backend choice] in device_communicator.cc).
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/socket.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"
#include "mwms/types.h"

namespace mwms::collective {

/// Which collective a DeviceCall is.
enum class DeviceCollective { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

/// One collective on device buffers (NCCL semantics; counts in elements: all-reduce and broadcast
/// `count`, reduce-scatter the per-rank recv count, all-gather the per-rank send count).
struct DeviceCall {
  DeviceCollective kind = DeviceCollective::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
};

/// "all_reduce", "reduce_scatter", "all_gather", "broadcast".
const char* to_string(DeviceCollective kind) noexcept;

/// Polling cadence of every wait for the device (events, NCCL's asynchronous state): yield for the
/// first millisecond (a small collective or copy completes in tens of microseconds), then sleep
/// 50 us so that a long wait costs no core.
class PollBackoff {
 public:
  void pause() {
    if (std::chrono::steady_clock::now() - start_ < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// Polls `query(event)` (cudaEventQuery) with PollBackoff until it reports anything but
/// kCudaErrorNotReady or `deadline` passed; returns the last status (kCudaErrorNotReady: the
/// deadline passed first). The one blocking wait for an event of the device backends.
int poll_event(int (*query)(void* event), void* event, common::Deadline deadline);

/// "0.3 s", "300 s": three significant digits, so a limit measured a few microseconds after it
/// was set still prints as the value that was configured.
std::string seconds_text(double seconds);

/// The Work of every device backend (the NCCL replica group's, nccl_work.cc, which NcclBackend
/// uses too; host-staged): completion is found by polling (CUDA events, NCCL's asynchronous
/// error), so test() and wait() are the same loop everywhere and a subclass only says what one
/// look is (poll()). Thread safety: test() and
/// wait() may be called from any thread; poll() runs under the Work's mutex.
class PolledDeviceWork : public Work {
 public:
  /// Under the mutex: done, or one more look. Never throws.
  bool test() noexcept final;
  /// Polls with PollBackoff until poll() reports completion or failure, for at most
  /// `timeout_seconds` (unset: the collective's own timeout), then rethrows the failure if any.
  /// @throws the collective's error (BackendError, PeerError, TimeoutError: its own deadline
  ///   passed, so the backend aborted), TimeoutError (this wait's limit passed while the
  ///   collective still runs under its own deadline).
  void wait(std::optional<double> timeout_seconds) final;

 protected:
  /// `label` names the backend in messages ("nccl", "host-staged", ...); `ctx` the collective
  /// (op, seq); `timeout` its deadline's length in seconds, the default limit of wait().
  PolledDeviceWork(std::string label, ErrorContext ctx, double timeout)
      : label_(std::move(label)), ctx_(std::move(ctx)), timeout_(timeout) {}

  /// One look at the collective; returns true once it completed (finish(nullptr)) or failed
  /// (finish(error)), false while it runs. Called with the mutex held, never after finish().
  virtual bool poll() noexcept = 0;
  /// Marks the Work done with `error` (nullptr: success); returns true. Caller holds the mutex.
  bool finish(std::exception_ptr error) noexcept {
    done_ = true;
    error_ = std::move(error);
    return true;
  }
  /// The collective's ErrorContext with timeout_seconds set to its deadline's length.
  ErrorContext timeout_context() const {
    ErrorContext c = ctx_;
    c.timeout_seconds = timeout_;
    return c;
  }

  const std::string label_;
  const ErrorContext ctx_;
  const double timeout_;

 private:
  bool look() noexcept { return done_ || poll(); }

  std::mutex mutex_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// A backend for device buffers. One thread at a time calls launch(); Work handles may be used
/// from any thread.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// Runs `calls` (several: a bucket of all-reduces with one dtype and op) on `stream`
  /// (cudaStream_t as void*) and returns a Work that completes once every result is in device
  /// memory. @throws as DeviceCommunicator's collectives.
  virtual std::shared_ptr<Work> launch(const DeviceCall* calls, std::size_t num_calls,
                                       void* stream) = 0;
  /// Returns once every rank entered the barrier and the work enqueued on `stream` before it
  /// completed (DeviceCommunicator::barrier). Blocking, under the collective's deadline.
  /// @throws as launch().
  virtual void barrier(void* stream) = 0;
  /// Orderly collective shutdown (DeviceCommunicator::finalize); a second call does nothing.
  /// Blocking, bounded by the collective timeout. @throws as DeviceCommunicator::finalize.
  virtual void finalize() = 0;
  /// Stops the backend and poisons it with `reason`. Never throws.
  virtual void abort(const std::string& reason) noexcept = 0;
  /// The CUDA device this rank uses.
  virtual int device() const noexcept = 0;
  /// One line for logs: which backend, device, world size.
  virtual std::string describe() const = 0;
};

}  // namespace mwms::collective
