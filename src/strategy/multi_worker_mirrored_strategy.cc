// MultiWorkerMirroredStrategy on the CPU: one replica per worker, gradients packed into buckets
// of bytes_per_pack and all-reduced through the Communicator. The strategy never touches sockets.
#include <chrono>
#include <cstring>

#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"
#include "mwms/strategy.h"

namespace mwms {

struct MultiWorkerMirroredStrategy::Impl {
  CommunicationOptions options;
  std::unique_ptr<Communicator> comm;
  std::vector<char> pack;  // bucket staging, grown once to bytes_per_pack
  double allreduce_seconds = 0;
  std::size_t allreduce_bytes = 0;
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
  impl_->allreduce_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

void MultiWorkerMirroredStrategy::finalize() { impl_->comm->finalize(); }

double MultiWorkerMirroredStrategy::allreduce_seconds() const noexcept {
  return impl_->allreduce_seconds;
}
std::size_t MultiWorkerMirroredStrategy::allreduce_bytes() const noexcept {
  return impl_->allreduce_bytes;
}

}  // namespace mwms
