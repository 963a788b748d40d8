// MultiWorkerMirroredStrategy on the CPU: one replica per worker, gradients packed into buckets
// of bytes_per_pack and all-reduced through the Communicator. The strategy never touches sockets.
#include <chrono>
#include <cstring>
#include <exception>
#include <string>

#include "common/env.h"
#include "common/logging.h"
#include "kernels/reduce.h"
#include "mwms/errors.h"
#include "mwms/strategy.h"

namespace mwms {

// One bucket of an overlapped step (begin_gradient_sync): tensors [first, last) of the list.
struct SyncBucket {
  std::size_t first = 0;
  std::size_t last = 0;
  std::size_t bytes = 0;
  bool contiguous = true;    // reduced in place; otherwise through `pack`
  bool compressed = false;             // float32 sent as `wire` through `pack` (Note [compression])
  DataType wire = DataType::kFloat16;
  std::vector<char> pack;    // this bucket's own staging (buckets are in flight together)
  std::size_t waiting = 0;   // tensors not ready yet
  std::shared_ptr<Work> work;
};

struct MultiWorkerMirroredStrategy::Impl {
  CommunicationOptions options;
  std::unique_ptr<Communicator> comm;
  std::vector<char> pack;  // bucket staging, grown once to bytes_per_pack
  double allreduce_seconds = 0;
  double exposed_seconds = 0;
  std::size_t allreduce_bytes = 0;

  // Overlapped step (Note [overlapped buckets]).
  bool sync_active = false;
  ReduceOp sync_op = ReduceOp::kSum;
  std::vector<TensorRef> sync_tensors;
  std::vector<std::size_t> bucket_of;  // per tensor
  std::vector<bool> ready;             // per tensor
  std::vector<SyncBucket> buckets;
  std::size_t next_launch = 0;         // buckets [0, next_launch) have started
  std::chrono::steady_clock::time_point first_launch;
  bool launched_any = false;
};

namespace {

CommunicationOptions effective(const CommunicationOptions& in) {
  CommunicationOptions out = in;
  if (out.bytes_per_pack == 0) {
    out.bytes_per_pack = static_cast<std::size_t>(common::env_int("MWMS_BYTES_PER_PACK"));
  }
  if (out.timeout_seconds <= 0) out.timeout_seconds = common::env_double("MWMS_TIMEOUT_SECONDS");
  return out;
}

// Calls fn(first, last) for each run of tensors [first, last) that shares one dtype and fits in
// bytes_per_pack; a tensor larger than a pack forms a run of its own.
template <typename Fn>
void for_each_bucket(const std::vector<TensorRef>& tensors, std::size_t bytes_per_pack, Fn fn) {
  std::size_t first = 0;
  while (first < tensors.size()) {
    std::size_t last = first + 1;
    std::size_t bytes = tensors[first].count * dtype_size(tensors[first].dtype);
    while (last < tensors.size() && tensors[last].dtype == tensors[first].dtype) {
      std::size_t more = tensors[last].count * dtype_size(tensors[last].dtype);
      if (bytes + more > bytes_per_pack) break;
      bytes += more;
      ++last;
    }
    fn(first, last, bytes);
    first = last;
  }
}

void check_tensors(const std::vector<TensorRef>& tensors, const char* what) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].data == nullptr && tensors[i].count > 0) {
      throw InvalidArgument(std::string(what) + ": tensor " + std::to_string(i) +
                            " has null data and count " + std::to_string(tensors[i].count));
    }
  }
}

}  // namespace

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const CommunicationOptions& options)
    : MultiWorkerMirroredStrategy(resolve_from_environment(), options) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const ResolvedCluster& cluster,
                                                         const CommunicationOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = effective(options);
  CommunicatorOptions copts;
  copts.timeout_seconds = impl_->options.timeout_seconds;
  copts.implementation = impl_->options.implementation;
  impl_->comm = Communicator::create(cluster, copts);
  MWMS_LOG_INFO(kStrat, "MultiWorkerMirroredStrategy: num_replicas_in_sync "
                            << num_replicas_in_sync() << ", bytes_per_pack "
                            << impl_->options.bytes_per_pack);
}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() = default;

int MultiWorkerMirroredStrategy::num_replicas_in_sync() const noexcept {
  return impl_->comm->world_size();
}
int MultiWorkerMirroredStrategy::num_workers() const noexcept { return impl_->comm->world_size(); }
int MultiWorkerMirroredStrategy::worker_index() const noexcept { return impl_->comm->rank(); }
bool MultiWorkerMirroredStrategy::is_chief() const noexcept {
  return impl_->comm->cluster().is_chief;
}
const ResolvedCluster& MultiWorkerMirroredStrategy::cluster() const noexcept {
  return impl_->comm->cluster();
}
const CommunicationOptions& MultiWorkerMirroredStrategy::options() const noexcept {
  return impl_->options;
}
Communicator& MultiWorkerMirroredStrategy::communicator() { return *impl_->comm; }

void MultiWorkerMirroredStrategy::broadcast_variables(const std::vector<TensorRef>& variables) {
  check_tensors(variables, "broadcast_variables");
  // The chief holds the leader's values (rank 0 is always the chief / worker 0).
  for (const TensorRef& v : variables) impl_->comm->broadcast(v.data, v.count, v.dtype, 0);
}

void MultiWorkerMirroredStrategy::run(const std::function<void(const ReplicaContext&)>& fn) {
  ReplicaContext ctx;
  ctx.replica_id_in_sync_group = worker_index();
  ctx.num_replicas_in_sync = num_replicas_in_sync();
  fn(ctx);
}

void MultiWorkerMirroredStrategy::all_reduce_gradients(const std::vector<TensorRef>& gradients,
                                                       ReduceOp op) {
  check_tensors(gradients, "all_reduce_gradients");
  auto start = std::chrono::steady_clock::now();
  Communicator& comm = *impl_->comm;
  for_each_bucket(gradients, impl_->options.bytes_per_pack,
                  [&](std::size_t first, std::size_t last, std::size_t bytes) {
    DataType dtype = gradients[first].dtype;
    std::size_t elems = bytes / dtype_size(dtype);
    // One tensor, or tensors that lie back to back in memory (a flat gradient buffer): reduce
    // in place, without copying through the pack buffer.
    bool contiguous = true;
    for (std::size_t i = first + 1; i < last && contiguous; ++i) {
      const char* end = static_cast<const char*>(gradients[i - 1].data) +
                        gradients[i - 1].count * dtype_size(dtype);
      contiguous = end == gradients[i].data;
    }
    const Compression c = impl_->options.compression;
    if (c != Compression::kNone && dtype == DataType::kFloat32) {
      // Note [compression]: pack as 16-bit values, sum in them, unpack.
      const DataType wire = c == Compression::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
      if (impl_->pack.size() < elems * 2) {
        impl_->pack.resize(std::max(elems * 2, impl_->options.bytes_per_pack));
      }
      auto* p16 = reinterpret_cast<std::uint16_t*>(impl_->pack.data());
      std::size_t at = 0;
      for (std::size_t i = first; i < last; ++i) {
        kernels::float32_to_16(p16 + at, static_cast<const float*>(gradients[i].data),
                               gradients[i].count, wire);
        at += gradients[i].count;
      }
      comm.all_reduce(p16, elems, wire, op);
      at = 0;
      for (std::size_t i = first; i < last; ++i) {
        kernels::float16_to_32(static_cast<float*>(gradients[i].data), p16 + at,
                               gradients[i].count, wire);
        at += gradients[i].count;
      }
      return;
    }
    if (contiguous) {
      comm.all_reduce(gradients[first].data, elems, dtype, op);
      return;
    }
    if (impl_->pack.size() < bytes) impl_->pack.resize(std::max(bytes, impl_->options.bytes_per_pack));
    char* p = impl_->pack.data();
    for (std::size_t i = first; i < last; ++i) {
      std::size_t b = gradients[i].count * dtype_size(dtype);
      if (b > 0) std::memcpy(p, gradients[i].data, b);
      p += b;
    }
    comm.all_reduce(impl_->pack.data(), elems, dtype, op);
    p = impl_->pack.data();
    for (std::size_t i = first; i < last; ++i) {
      std::size_t b = gradients[i].count * dtype_size(dtype);
      if (b > 0) std::memcpy(gradients[i].data, p, b);
      p += b;
    }
  });
  for (const TensorRef& g : gradients) impl_->allreduce_bytes += g.count * dtype_size(g.dtype);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  impl_->allreduce_seconds += took;
  impl_->exposed_seconds += took;  // blocking: nothing hides it
}

// Note [compression]: with CommunicationOptions::compression, a float32 bucket is converted
// into 16-bit values in a pack buffer, all-reduced in that type (the kernels sum float16 and
// bfloat16 in float32 and round once per step, so every rank gets the same bits) and converted
// back: half the bytes on the wire, two conversions per element on each worker (Horovod's
// Compression.fp16 does the same).
// Note [overlapped buckets]: buckets start strictly in list order, each once all its tensors
// are ready, so every worker issues the same all-reduces in the same order (the communicator
// runs them in call order on its progress thread) even when backprop marks tensors ready in
// another order; a bucket whose tensors are ready waits for the earlier buckets. Each bucket has
// its own pack buffer, since several are in flight at once.
namespace {

bool same_tensors(const std::vector<TensorRef>& a, const std::vector<TensorRef>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].data != b[i].data || a[i].count != b[i].count || a[i].dtype != b[i].dtype) {
      return false;
    }
  }
  return true;
}

}  // namespace

void MultiWorkerMirroredStrategy::begin_gradient_sync(const std::vector<TensorRef>& gradients,
                                                      ReduceOp op) {
  Impl& m = *impl_;
  if (m.sync_active) {
    throw InvalidUsage("begin_gradient_sync called again before finish_gradient_sync");
  }
  check_tensors(gradients, "begin_gradient_sync");
  if (!same_tensors(gradients, m.sync_tensors) || m.buckets.empty() != gradients.empty()) {
    m.sync_tensors = gradients;
    m.buckets.clear();
    m.bucket_of.assign(gradients.size(), 0);
    for_each_bucket(gradients, m.options.bytes_per_pack,
                    [&](std::size_t first, std::size_t last, std::size_t bytes) {
      SyncBucket b;
      b.first = first;
      b.last = last;
      b.bytes = bytes;
      const std::size_t esize = dtype_size(gradients[first].dtype);
      for (std::size_t i = first + 1; i < last && b.contiguous; ++i) {
        b.contiguous = static_cast<const char*>(gradients[i - 1].data) +
                           gradients[i - 1].count * esize ==
                       gradients[i].data;
      }
      const Compression c = m.options.compression;
      if (c != Compression::kNone && gradients[first].dtype == DataType::kFloat32) {
        b.compressed = true;
        b.wire = c == Compression::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
        b.pack.resize(bytes / 2);
      } else if (!b.contiguous) {
        b.pack.resize(bytes);
      }
      for (std::size_t i = first; i < last; ++i) m.bucket_of[i] = m.buckets.size();
      m.buckets.push_back(std::move(b));
    });
  }
  for (SyncBucket& b : m.buckets) {
    b.waiting = b.last - b.first;
    b.work.reset();
  }
  m.ready.assign(gradients.size(), false);
  m.sync_op = op;
  m.next_launch = 0;
  m.launched_any = false;
  m.sync_active = true;
}

void MultiWorkerMirroredStrategy::gradient_ready(std::size_t index) {
  Impl& m = *impl_;
  if (!m.sync_active) throw InvalidUsage("gradient_ready called without begin_gradient_sync");
  if (index >= m.sync_tensors.size()) {
    throw InvalidUsage("gradient_ready(" + std::to_string(index) + "): the step has " +
                       std::to_string(m.sync_tensors.size()) + " gradient tensors");
  }
  if (m.ready[index]) return;
  m.ready[index] = true;
  --m.buckets[m.bucket_of[index]].waiting;
  // Start every bucket that is complete and whose predecessors have started.
  while (m.next_launch < m.buckets.size() && m.buckets[m.next_launch].waiting == 0) {
    SyncBucket& b = m.buckets[m.next_launch++];
    const DataType dtype = m.sync_tensors[b.first].dtype;
    const std::size_t esize = dtype_size(dtype);
    void* data = m.sync_tensors[b.first].data;
    if (b.compressed) {
      auto* p16 = reinterpret_cast<std::uint16_t*>(b.pack.data());
      std::size_t at = 0;
      for (std::size_t i = b.first; i < b.last; ++i) {
        kernels::float32_to_16(p16 + at, static_cast<const float*>(m.sync_tensors[i].data),
                               m.sync_tensors[i].count, b.wire);
        at += m.sync_tensors[i].count;
      }
      if (!m.launched_any) {
        m.first_launch = std::chrono::steady_clock::now();
        m.launched_any = true;
      }
      b.work = m.comm->all_reduce_async(p16, at, b.wire, m.sync_op);
      continue;
    }
    if (!b.contiguous) {
      char* p = b.pack.data();
      for (std::size_t i = b.first; i < b.last; ++i) {
        const std::size_t n = m.sync_tensors[i].count * esize;
        if (n > 0) std::memcpy(p, m.sync_tensors[i].data, n);
        p += n;
      }
      data = b.pack.data();
    }
    if (!m.launched_any) {
      m.first_launch = std::chrono::steady_clock::now();
      m.launched_any = true;
    }
    b.work = m.comm->all_reduce_async(data, b.bytes / esize, dtype, m.sync_op);
  }
}

void MultiWorkerMirroredStrategy::finish_gradient_sync() {
  Impl& m = *impl_;
  if (!m.sync_active) throw InvalidUsage("finish_gradient_sync called without begin_gradient_sync");
  std::exception_ptr error;
  try {
    for (std::size_t i = 0; i < m.sync_tensors.size(); ++i) gradient_ready(i);
  } catch (...) {
    error = std::current_exception();
  }
  const auto wait_start = std::chrono::steady_clock::now();
  for (SyncBucket& b : m.buckets) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
      continue;
    }
    if (b.compressed) {
      if (error) continue;
      const auto* p16 = reinterpret_cast<const std::uint16_t*>(b.pack.data());
      std::size_t at = 0;
      for (std::size_t i = b.first; i < b.last; ++i) {
        kernels::float16_to_32(static_cast<float*>(m.sync_tensors[i].data), p16 + at,
                               m.sync_tensors[i].count, b.wire);
        at += m.sync_tensors[i].count;
      }
      continue;
    }
    if (!b.contiguous && !error) {
      const std::size_t esize = dtype_size(m.sync_tensors[b.first].dtype);
      const char* p = b.pack.data();
      for (std::size_t i = b.first; i < b.last; ++i) {
        const std::size_t n = m.sync_tensors[i].count * esize;
        if (n > 0) std::memcpy(m.sync_tensors[i].data, p, n);
        p += n;
      }
    }
  }
  const auto end = std::chrono::steady_clock::now();
  m.exposed_seconds += std::chrono::duration<double>(end - wait_start).count();
  if (m.launched_any) {
    m.allreduce_seconds += std::chrono::duration<double>(end - m.first_launch).count();
  }
  for (const TensorRef& g : m.sync_tensors) m.allreduce_bytes += g.count * dtype_size(g.dtype);
  for (SyncBucket& b : m.buckets) b.work.reset();
  m.sync_active = false;
  if (error) std::rethrow_exception(error);
}

double MultiWorkerMirroredStrategy::exposed_allreduce_seconds() const noexcept {
  return impl_->exposed_seconds;
}

double MultiWorkerMirroredStrategy::reduce(ReduceOp op, double value) {
  impl_->comm->all_reduce(&value, 1, DataType::kFloat64, op);
  return value;
}

Shard MultiWorkerMirroredStrategy::batch_shard(std::size_t global_batch_size) const noexcept {
  std::size_t n = static_cast<std::size_t>(num_workers());
  std::size_t i = static_cast<std::size_t>(worker_index());
  std::size_t base = global_batch_size / n;
  std::size_t rem = global_batch_size % n;
  Shard s;
  s.begin = i * base + std::min(i, rem);
  s.end = s.begin + base + (i < rem ? 1 : 0);
  return s;
}

void MultiWorkerMirroredStrategy::finalize() {
  if (impl_->sync_active) {
    throw InvalidUsage("finalize called between begin_gradient_sync and finish_gradient_sync; "
                       "finish the step first");
  }
  impl_->comm->finalize();
}

double MultiWorkerMirroredStrategy::allreduce_seconds() const noexcept {
  return impl_->allreduce_seconds;
}
std::size_t MultiWorkerMirroredStrategy::allreduce_bytes() const noexcept {
  return impl_->allreduce_bytes;
}

}  // namespace mwms
