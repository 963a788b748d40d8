// A fake CUDA runtime (collective/backend/cuda_api.h) for CPU tests of the host-staged backend,
// one per process (the multiproc tests fork real ranks, each with its own). "Device memory" is
// host memory the fake hands out (device_malloc) and remembers, so pointer_is_device tells it
// from host memory and a copy in the wrong direction, or from/to memory that is not pinned, fails
// as CUDA would (cudaErrorInvalidValue). Streams are FIFO queues: copies and event records are
// queued and run only when an event recorded after them is queried (after `not_ready_polls`
// answers of "not ready") or the stream is synchronised, so a caller that reads a result before
// its event completed reads stale data, as on a GPU. fail() makes one entry return a chosen
// cudaError_t.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "collective/backend/cuda_api.h"
#include "support/fake_faults.h"

namespace mwms::testing {

struct FakeCudaEvent {
  std::uint64_t generation = 0;  // bumped by every record
  std::uint64_t done = 0;        // the generation that completed
  void* stream = nullptr;
  int polls_left = 0;
};

/// Process-wide state of the fake; reset() at the start of each rank's body.
struct FakeCudaRuntime {
  struct Op {
    void* dst = nullptr;  // a copy when event == nullptr
    const void* src = nullptr;
    std::size_t bytes = 0;
    FakeCudaEvent* event = nullptr;
    std::uint64_t generation = 0;
    bool dropped = false;  // the record of an event destroyed since
  };
  std::recursive_mutex mutex;
  std::map<const unsigned char*, std::size_t> device;  // allocations: start -> bytes
  std::map<const unsigned char*, std::size_t> pinned;
  std::map<void*, std::deque<Op>> streams;
  int device_count = 1;
  int not_ready_polls = 1;  // "not ready" answers before an event's stream work runs
  FakeFaults faults;        // the entry that fails ("memcpy_async", "event_query", ...)
  long malloc_host_calls = 0, copies_to_host = 0, copies_to_device = 0, set_device_calls = 0;
  int current_device = -1;

  static FakeCudaRuntime& get() {
    static FakeCudaRuntime runtime;
    return runtime;
  }
  void reset() {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    for (auto& [p, n] : device) delete[] p;
    device.clear();
    streams.clear();
    device_count = 1;
    not_ready_polls = 1;
    faults.clear();
    malloc_host_calls = copies_to_host = copies_to_device = set_device_calls = 0;
    current_device = -1;
  }
  /// `bytes` of fake device memory (never freed before reset()).
  void* device_malloc(std::size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    auto* p = new unsigned char[bytes == 0 ? 1 : bytes]();
    device[p] = bytes == 0 ? 1 : bytes;
    return p;
  }
  /// Makes `entry` return `code` after `skip` more successful calls.
  void fail(const std::string& entry, int code, int skip = 0) {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    faults.fail(entry, code, skip);
  }
  // The injected failure of `entry`, or 0.
  int injected(const char* entry) { return faults.injected(entry); }
  static bool inside(const std::map<const unsigned char*, std::size_t>& m, const void* ptr,
                     std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(ptr);
    auto it = m.upper_bound(p);
    if (it == m.begin()) return false;
    --it;
    return p >= it->first && p + bytes <= it->first + it->second;
  }
  // Runs `stream`'s queue up to and including the record of `event` (all of it: nullptr).
  void drain(void* stream, FakeCudaEvent* event) {
    std::deque<Op>& q = streams[stream];
    while (!q.empty()) {
      Op op = q.front();
      q.pop_front();
      if (op.dropped) continue;
      if (op.event == nullptr) {
        std::memmove(op.dst, op.src, op.bytes);
        continue;
      }
      op.event->done = std::max(op.event->done, op.generation);
      if (op.event == event && op.generation == event->generation) return;
    }
  }
};

namespace fake_cuda {

inline FakeCudaRuntime& rt() { return FakeCudaRuntime::get(); }
constexpr int kInvalidValue = 1;  // cudaErrorInvalidValue

inline int get_device_count(int* count) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("get_device_count")) return e;
  *count = rt().device_count;
  return 0;
}
inline int set_device(int device) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("set_device")) return e;
  if (device < 0 || device >= rt().device_count) return 101;  // cudaErrorInvalidDevice
  rt().current_device = device;
  ++rt().set_device_calls;
  return 0;
}
inline int malloc_host(void** ptr, std::size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("malloc_host")) return e;
  auto* p = new unsigned char[bytes]();
  rt().pinned[p] = bytes;
  ++rt().malloc_host_calls;
  *ptr = p;
  return 0;
}
inline int free_host(void* ptr) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  auto it = rt().pinned.find(static_cast<unsigned char*>(ptr));
  if (it == rt().pinned.end()) return kInvalidValue;
  delete[] it->first;
  rt().pinned.erase(it);
  return 0;
}
inline int memcpy_async(void* dst, const void* src, std::size_t bytes, collective::CudaCopy kind,
                        void* stream) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("memcpy_async")) return e;
  const bool to_host = kind == collective::CudaCopy::kDeviceToHost;
  const auto& from = to_host ? rt().device : rt().pinned;
  const auto& to = to_host ? rt().pinned : rt().device;
  if (!FakeCudaRuntime::inside(from, src, bytes) || !FakeCudaRuntime::inside(to, dst, bytes)) {
    return kInvalidValue;  // wrong direction, or not device / pinned memory
  }
  ++(to_host ? rt().copies_to_host : rt().copies_to_device);
  FakeCudaRuntime::Op op;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  rt().streams[stream].push_back(op);
  return 0;
}
inline int stream_synchronize(void* stream) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("stream_synchronize")) return e;
  rt().drain(stream, nullptr);
  return 0;
}
inline int event_create(collective::CudaEvent* event) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("event_create")) return e;
  *event = new FakeCudaEvent;
  return 0;
}
inline int event_record(collective::CudaEvent event, void* stream) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("event_record")) return e;
  auto* ev = static_cast<FakeCudaEvent*>(event);
  ev->stream = stream;
  ev->polls_left = rt().not_ready_polls;
  FakeCudaRuntime::Op op;
  op.event = ev;
  op.generation = ++ev->generation;
  rt().streams[stream].push_back(op);
  return 0;
}
inline int event_query(collective::CudaEvent event) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("event_query")) return e;
  auto* ev = static_cast<FakeCudaEvent*>(event);
  if (ev->done == ev->generation) return 0;  // also: never recorded
  if (ev->polls_left > 0) {
    --ev->polls_left;
    return collective::kCudaNotReady;
  }
  rt().drain(ev->stream, ev);
  return 0;
}
inline int event_destroy(collective::CudaEvent event) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  auto* ev = static_cast<FakeCudaEvent*>(event);
  // A queued record of a destroyed event must not touch it: drop it from every queue.
  for (auto& [s, q] : rt().streams) {
    for (auto& op : q) {
      if (op.event == ev) op.dropped = true;
    }
  }
  delete ev;
  return 0;
}
inline int pointer_is_device(const void* ptr, int* is_device) {
  std::lock_guard<std::recursive_mutex> lock(rt().mutex);
  if (int e = rt().injected("pointer_is_device")) return e;
  *is_device = FakeCudaRuntime::inside(rt().device, ptr, 1) ? 1 : 0;
  return 0;
}
}  // namespace fake_cuda

/// The fake table.
inline const collective::CudaApi& fake_cuda_api() {
  static const collective::CudaApi api = [] {
    collective::CudaApi a;
    a.name = "fake-cuda";
    a.get_device_count = fake_cuda::get_device_count;
    a.set_device = fake_cuda::set_device;
    a.malloc_host = fake_cuda::malloc_host;
    a.free_host = fake_cuda::free_host;
    a.memcpy_async = fake_cuda::memcpy_async;
    a.stream_synchronize = fake_cuda::stream_synchronize;
    a.event_create = fake_cuda::event_create;
    a.event_record = fake_cuda::event_record;
    a.event_query = fake_cuda::event_query;
    a.event_destroy = fake_cuda::event_destroy;
    a.pointer_is_device = fake_cuda::pointer_is_device;
    a.error_string = fake_cuda_error_string;
    return a;
  }();
  return api;
}

}  // namespace mwms::testing
