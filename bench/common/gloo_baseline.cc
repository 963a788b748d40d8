#include <gloo/algorithm.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <stdlib.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/gloo_baseline.h"

namespace mwms::bench::gloo_baseline {

namespace {

struct State {
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  std::unique_ptr<::gloo::Algorithm> ring;
  std::unique_ptr<::gloo::Algorithm> halving_doubling;
};
State g_state;

// Gloo reports failures as exceptions of its own (gloo::Exception and subclasses, all
// std::exception); this is the one place they become the bench's error (STYLE item 18).
template <typename Fn>
void gloo_call(const std::string& what, Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw BackendError("gloo " + what + " failed: " + e.what(), 0);
  }
}

template <typename T>
const ::gloo::ReductionFunction<T>* reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return ::gloo::ReductionFunction<T>::sum;
    case ReduceOp::kProd: return ::gloo::ReductionFunction<T>::product;
    case ReduceOp::kMin: return ::gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax: return ::gloo::ReductionFunction<T>::max;
  }
  return nullptr;
}

template <typename T>
void build(void* buffer, int count, ReduceOp op) {
  std::vector<T*> ptrs{static_cast<T*>(buffer)};
  g_state.ring = std::make_unique<::gloo::AllreduceRingChunked<T>>(g_state.context, ptrs, count,
                                                                    reduction<T>(op));
  g_state.halving_doubling = std::make_unique<::gloo::AllreduceHalvingDoubling<T>>(
      g_state.context, ptrs, count, reduction<T>(op));
}

// The host part of "host:port" (IPv6 literals in brackets lose them).
std::string host_of(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace

bool built_with_gloo() { return true; }

std::string library_version() {
  return "gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) +
         "." + std::to_string(GLOO_VERSION_PATCH) + " (tcp transport)";
}

std::string unsupported_reason(DataType dtype, ReduceOp) {
  switch (dtype) {
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kInt32:
    case DataType::kInt64: return {};
    case DataType::kFloat16:
    case DataType::kBFloat16: break;
  }
  return "the bench times Gloo on float32, float64, int32 and int64 only (not " +
         std::string(to_string(dtype)) + ")";
}

void connect(Communicator& comm, const std::string& store_root) {
  // Rank 0 makes a fresh store directory and tells the others its name: a directory reused from
  // an earlier run would hold that run's (dead) addresses.
  char dir[256] = {0};
  if (comm.rank() == 0) {
    std::string pattern = store_root + "/mwms-gloo-XXXXXX";
    if (pattern.size() >= sizeof(dir)) {
      throw BackendError("--gloo-store " + store_root + " is too long a path", 0);
    }
    std::strcpy(dir, pattern.c_str());
    if (::mkdtemp(dir) == nullptr) {
      throw BackendError("cannot create a Gloo store directory " + pattern + ": " +
                             std::strerror(errno),
                         errno);
    }
  }
  comm.broadcast(dir, sizeof(dir) / 4, DataType::kInt32, 0);  // 256 bytes as 64 int32
  // A single process has no cluster addresses: Gloo then makes no pair, any local host will do.
  const auto& ring = comm.cluster().ring;
  const std::string address = static_cast<std::size_t>(comm.rank()) < ring.size()
                                  ? ring[static_cast<std::size_t>(comm.rank())]
                                  : "127.0.0.1:0";
  gloo_call("connect through the file store " + std::string(dir), [&] {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = host_of(address);
    g_state.device = ::gloo::transport::tcp::CreateDevice(attr);
    g_state.context =
        std::make_shared<::gloo::rendezvous::Context>(comm.rank(), comm.world_size());
    g_state.context->setTimeout(std::chrono::seconds(60));
    ::gloo::rendezvous::FileStore store(dir);
    ::gloo::rendezvous::PrefixStore prefix("mwms", store);
    g_state.context->connectFullMesh(prefix, g_state.device);
  });
  comm.barrier();  // every rank has read the store
  if (comm.rank() == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
}

void prepare(void* buffer, std::size_t count, DataType dtype, ReduceOp op) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw BackendError("gloo takes an int count; " + std::to_string(count) +
                           " elements is too many",
                       0);
  }
  g_state.ring.reset();
  g_state.halving_doubling.reset();
  const int n = static_cast<int>(count);
  gloo_call("algorithm setup", [&] {
    switch (dtype) {
      case DataType::kFloat32: build<float>(buffer, n, op); break;
      case DataType::kFloat64: build<double>(buffer, n, op); break;
      case DataType::kInt32: build<std::int32_t>(buffer, n, op); break;
      case DataType::kInt64: build<std::int64_t>(buffer, n, op); break;
      case DataType::kFloat16:
      case DataType::kBFloat16:
        throw BackendError(unsupported_reason(dtype, op), 0);
    }
  });
}

void run(Algorithm algorithm) {
  ::gloo::Algorithm* a = algorithm == Algorithm::kRingChunked ? g_state.ring.get()
                                                              : g_state.halving_doubling.get();
  if (a == nullptr) throw BackendError("gloo: run() before prepare()", 0);
  const char* name = algorithm == Algorithm::kRingChunked ? "AllreduceRingChunked"
                                                           : "AllreduceHalvingDoubling";
  gloo_call(name, [&] { a->run(); });
}

void disconnect() noexcept {
  g_state.ring.reset();
  g_state.halving_doubling.reset();
  g_state.context.reset();
  g_state.device.reset();
}

}  // namespace mwms::bench::gloo_baseline
