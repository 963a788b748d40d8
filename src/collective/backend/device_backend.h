// What DeviceCommunicator (device_communicator.cc) runs a collective on device buffers with: the
// NCCL backend (nccl_backend.h: the collective handed whole to NCCL on the caller's stream) or
// the host-staged backend (staged_backend.h: device -> pinned host -> the engine -> device).
// DeviceCommunicator::create picks one (Note [device backend choice] in device_communicator.cc).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "mwms/communicator.h"
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
  /// Stops the backend and poisons it with `reason`. Never throws.
  virtual void abort(const std::string& reason) noexcept = 0;
  /// The CUDA device this rank uses.
  virtual int device() const noexcept = 0;
  /// One line for logs: which backend, device, world size.
  virtual std::string describe() const = 0;
};

}  // namespace mwms::collective
