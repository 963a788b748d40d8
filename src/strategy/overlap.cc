// The overlapped step with K = 1 (MultiWorkerMirroredStrategy::begin_gradient_sync /
// gradient_ready / finish_gradient_sync): the bucket plan of the step, buckets started in list
// order as their tensors become ready, and the wait at the end. The K > 1 step
// (replica_overlap.cc) shares plan_sync and launch_ready_buckets.
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "mwms/errors.h"
#include "mwms/strategy.h"
#include "strategy/buckets.h"
#include "strategy/strategy_impl.h"

namespace mwms {

using strategy::check_tensors;
using strategy::contiguous_tensors;
using strategy::for_each_bucket;
using strategy::pack_tensors;
using strategy::solo_bytes;
using strategy::unpack_tensors;
using strategy::wire_type;

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

void MultiWorkerMirroredStrategy::Impl::plan_sync(const std::vector<TensorRef>& gradients,
                                                  ReduceOp op, int replicas_per_bucket) {
  Impl& m = *this;
  if (!same_tensors(gradients, m.sync_tensors) || m.buckets.empty() != gradients.empty()) {
    m.sync_tensors = gradients;
    m.buckets.clear();
    m.bucket_of.assign(gradients.size(), 0);
    for_each_bucket(gradients, *m.options.bytes_per_pack, solo_bytes(m.options),
                    [&](std::size_t first, std::size_t last, std::size_t bytes) {
      SyncBucket b;
      b.first = first;
      b.last = last;
      b.bytes = bytes;
      const DataType dtype = gradients[first].dtype;
      b.wire = wire_type(m.options.compression, dtype);
      b.in_place = b.wire == dtype && contiguous_tensors(gradients, first, last);
      if (!b.in_place) b.pack.resize(bytes / dtype_size(dtype) * dtype_size(b.wire));
      for (std::size_t i = first; i < last; ++i) m.bucket_of[i] = m.buckets.size();
      m.buckets.push_back(std::move(b));
    });
  }
  for (SyncBucket& b : m.buckets) {
    b.waiting = b.last - b.first;
    b.replicas_left = replicas_per_bucket;
    b.reduced = false;
    b.work.reset();
  }
  m.ready.assign(gradients.size(), false);
  m.sync_op = op;
  m.next_launch = 0;
  m.launched_any = false;
}

// Starts, in list order, every bucket that is ready and whose predecessors have started (Note
// [overlapped buckets]). K > 1: called under replica_mu, by whichever replica thread reduced a
// bucket, so the communicator sees one thread at a time.
void MultiWorkerMirroredStrategy::Impl::launch_ready_buckets() {
  Impl& m = *this;
  while (m.next_launch < m.buckets.size() && m.buckets[m.next_launch].reduced) {
    SyncBucket& b = m.buckets[m.next_launch++];
    const std::size_t elems = b.bytes / dtype_size(m.sync_tensors[b.first].dtype);
    void* data = m.sync_tensors[b.first].data;
    if (!b.in_place) {
      pack_tensors(m.sync_tensors, b.first, b.last, b.wire, b.pack.data());
      data = b.pack.data();
    }
    if (!m.launched_any) {
      m.first_launch = std::chrono::steady_clock::now();
      m.launched_any = true;
    }
    b.work = m.comm->all_reduce_async(data, elems, b.wire, m.sync_op);
  }
}

void MultiWorkerMirroredStrategy::Impl::wait_started_buckets(std::exception_ptr& error) {
  for (SyncBucket& b : buckets) {
    std::shared_ptr<Work> work;
    {
      std::lock_guard<std::mutex> lock(replica_mu);
      work = b.work;
    }
    if (!work) continue;
    try {
      work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
      continue;
    }
    if (!b.in_place && !error) unpack_tensors(sync_tensors, b.first, b.last, b.wire, b.pack.data());
  }
}

void MultiWorkerMirroredStrategy::begin_gradient_sync(const std::vector<TensorRef>& gradients,
                                                      ReduceOp op) {
  Impl& m = *impl_;
  if (m.sync_active) {
    throw InvalidUsage("begin_gradient_sync called again before finish_gradient_sync");
  }
  check_tensors(gradients, "begin_gradient_sync");
  {
    std::lock_guard<std::mutex> lock(m.replica_mu);
    if (m.replica_sync) {
      throw InvalidUsage("begin_gradient_sync called during a ReplicaContext overlapped step");
    }
  }
  m.plan_sync(gradients, op, 1);
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
  SyncBucket& b = m.buckets[m.bucket_of[index]];
  if (--b.waiting == 0) b.reduced = true;
  m.launch_ready_buckets();
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
  m.wait_started_buckets(error);
  const auto end = std::chrono::steady_clock::now();
  m.exposed_seconds += std::chrono::duration<double>(end - wait_start).count();
  if (m.launched_any) {
    m.all_reduce_seconds += std::chrono::duration<double>(end - m.first_launch).count();
  }
  for (const TensorRef& g : m.sync_tensors) m.all_reduce_bytes += g.count * dtype_size(g.dtype);
  for (SyncBucket& b : m.buckets) b.work.reset();
  m.sync_active = false;
  if (error) std::rethrow_exception(error);
}

}  // namespace mwms
