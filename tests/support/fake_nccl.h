// A fake NcclApi (collective/backend/nccl_api.h) for CPU tests of the NCCL backend: ranks are
// threads of one process sharing a FakeNcclWorld; "device" buffers are host memory. An
// all-reduce completes (its event becomes ready, and the sum is written into every rank's
// buffer) when every rank of the world has enqueued it, so a rank that never calls leaves the
// others' events pending forever, as a dead peer leaves NCCL's kernels spinning. Knobs make init
// stay in progress, calls fail with a chosen ncclResult_t, and NCCL report an asynchronous error.
#pragma once

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/backend/nccl_api.h"
#include "kernels/reduce.h"

namespace mwms::testing {

struct FakeNcclComm {
  int rank = 0;
  int world_size = 1;
  collective::NcclUniqueId id;
  int init_polls_left = 0;   // comm_get_async_error answers kNcclInProgress this many times
  int async_error = collective::kNcclSuccess;
  bool aborted = false;
  bool destroyed = false;
  std::size_t enqueued = 0;   // collectives enqueued
  std::size_t completed = 0;  // collectives completed
  struct Op {
    const void* send;
    void* recv;
    std::size_t count;
    DataType dtype;
    ReduceOp op;
    int root = -1;  // broadcast: the rank whose send every rank receives; -1: a reduction
  };
  std::vector<Op> ops;
  // Mean divisions enqueued behind collective number `after` (stream order): run once it completed.
  struct Division {
    std::size_t after;
    void* buffer;
    std::size_t count;
    DataType dtype;
    int divisor;
  };
  std::vector<Division> divisions;
  void run_divisions() {
    std::vector<Division> pending;
    for (const Division& d : divisions) {
      if (completed >= d.after) {
        kernels::scale_divide(d.buffer, d.count, d.dtype, d.divisor);
      } else {
        pending.push_back(d);
      }
    }
    divisions.swap(pending);
  }
};

struct FakeNcclEvent {
  FakeNcclComm* comm = nullptr;
  std::size_t target = 0;  // ready once comm->completed >= target
};

/// Process-wide state of the fake (one world at a time); reset() between tests.
struct FakeNcclWorld {
  std::mutex mutex;
  std::vector<std::unique_ptr<FakeNcclComm>> comms;
  int init_polls = 2;             // in-progress answers before init completes
  bool init_never_completes = false;
  int collective_result = collective::kNcclSuccess;  // what all_reduce & co. return
  int event_create_result = collective::kCudaSuccess;
  std::string last_error = "fake: last error text";
  collective::NcclUniqueId made_id;  // what get_unique_id handed out last
  std::atomic<int> aborts{0}, destroys{0}, groups{0}, divisions{0}, unique_ids{0};

  static FakeNcclWorld& get() {
    static FakeNcclWorld world;
    return world;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mutex);
    comms.clear();
    init_polls = 2;
    init_never_completes = false;
    collective_result = collective::kNcclSuccess;
    event_create_result = collective::kCudaSuccess;
    aborts = destroys = groups = divisions = unique_ids = 0;
  }
  FakeNcclComm* comm_of_rank(int rank) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& c : comms) {
      if (c->rank == rank) return c.get();
    }
    return nullptr;
  }
  // Runs every collective all ranks have enqueued (caller holds mutex): sums for all-reduce.
  void progress() {
    if (comms.empty() || static_cast<int>(comms.size()) < comms.front()->world_size) return;
    for (;;) {
      std::size_t next = ~std::size_t{0};
      for (auto& c : comms) next = std::min(next, c->enqueued);
      bool ran = false;
      for (auto& c : comms) ran = ran || c->completed < next;
      if (!ran) return;
      const std::size_t k = comms.front()->completed;
      {
        const FakeNcclComm::Op& first = comms.front()->ops[k];
        const std::size_t bytes = first.count * dtype_size(first.dtype);
        const FakeNcclComm::Op* source = &first;
        for (auto& c : comms) {
          if (first.root >= 0 && c->rank == first.root) source = &c->ops[k];
        }
        std::vector<unsigned char> acc(static_cast<const unsigned char*>(source->send),
                                       static_cast<const unsigned char*>(source->send) + bytes);
        for (std::size_t r = 1; r < comms.size() && first.root < 0; ++r) {
          kernels::reduce(acc.data(), comms[r]->ops[k].send, first.count, first.dtype, first.op);
        }
        for (auto& c : comms) std::memcpy(c->ops[k].recv, acc.data(), bytes);
      }
      for (auto& c : comms) {
        c->completed = k + 1;
        c->run_divisions();
      }
    }
  }
};

namespace fake_nccl {

inline FakeNcclWorld& world() { return FakeNcclWorld::get(); }
inline FakeNcclComm* as_comm(collective::NcclComm c) { return static_cast<FakeNcclComm*>(c); }
inline thread_local FakeNcclComm* last_comm = nullptr;  // the stream's owner, for event_record

inline int get_unique_id(collective::NcclUniqueId* id) {
  const int n = ++world().unique_ids;
  for (std::size_t i = 0; i < id->bytes.size(); ++i) {
    id->bytes[i] = static_cast<unsigned char>((i * 37 + static_cast<std::size_t>(n) * 101) ^ 0x5a);
  }
  std::lock_guard<std::mutex> lock(world().mutex);
  world().made_id = *id;
  return collective::kNcclSuccess;
}

inline int comm_init_rank(collective::NcclComm* comm, int world_size,
                          const collective::NcclUniqueId* id, int rank) {
  auto c = std::make_unique<FakeNcclComm>();
  c->rank = rank;
  c->world_size = world_size;
  c->id = *id;
  std::lock_guard<std::mutex> lock(world().mutex);
  c->init_polls_left = world().init_never_completes ? 1 << 30 : world().init_polls;
  *comm = c.get();
  world().comms.push_back(std::move(c));
  return collective::kNcclInProgress;
}

inline int comm_get_async_error(collective::NcclComm comm, int* async_error) {
  std::lock_guard<std::mutex> lock(world().mutex);
  FakeNcclComm* c = as_comm(comm);
  if (c->init_polls_left > 0) {
    --c->init_polls_left;
    *async_error = collective::kNcclInProgress;
  } else {
    *async_error = c->async_error;
  }
  return collective::kNcclSuccess;
}

inline int comm_abort(collective::NcclComm comm) {
  std::lock_guard<std::mutex> lock(world().mutex);
  as_comm(comm)->aborted = true;
  ++world().aborts;
  return collective::kNcclSuccess;
}

inline int comm_finalize(collective::NcclComm) { return collective::kNcclSuccess; }

inline int comm_destroy(collective::NcclComm comm) {
  std::lock_guard<std::mutex> lock(world().mutex);
  as_comm(comm)->destroyed = true;
  ++world().destroys;
  return collective::kNcclSuccess;
}

inline int group_start() {
  ++world().groups;
  return collective::kNcclSuccess;
}
inline int group_end() { return collective::kNcclSuccess; }

inline int enqueue(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                   collective::NcclComm comm, int root = -1) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (world().collective_result != collective::kNcclSuccess) return world().collective_result;
  FakeNcclComm* c = as_comm(comm);
  c->ops.push_back({send, recv, count, dtype, op, root});
  ++c->enqueued;
  last_comm = c;
  world().progress();
  return collective::kNcclSuccess;
}

inline int all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                      collective::NcclComm comm, void*) {
  return enqueue(send, recv, count, dtype, op, comm);
}
// Reduce-scatter and all-gather only move through the same completion machinery (no data);
// broadcast copies the root's buffer to every rank.
inline int reduce_scatter(const void* send, void* recv, std::size_t, DataType dtype, ReduceOp op,
                          collective::NcclComm comm, void*) {
  return enqueue(send, recv, 0, dtype, op, comm);
}
inline int all_gather(const void* send, void* recv, std::size_t, DataType dtype,
                      collective::NcclComm comm, void*) {
  return enqueue(send, recv, 0, dtype, ReduceOp::kSum, comm);
}
inline int broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root,
                     collective::NcclComm comm, void*) {
  return enqueue(send != nullptr ? send : recv, recv, count, dtype, ReduceOp::kSum, comm, root);
}

inline const char* error_string(int result) {
  switch (result) {
    case collective::kNcclInvalidArgument: return "fake invalid argument";
    case collective::kNcclRemoteError: return "fake remote process exited or there was a network error";
    case collective::kNcclUnhandledCudaError: return "fake unhandled cuda error";
    default: return "fake error";
  }
}
inline const char* last_error(collective::NcclComm) { return world().last_error.c_str(); }

inline int set_device(int local_rank, int* device) {
  *device = local_rank;
  return collective::kCudaSuccess;
}
inline int event_create(collective::NcclEvent* event) {
  if (world().event_create_result != collective::kCudaSuccess) return world().event_create_result;
  *event = new FakeNcclEvent;
  return collective::kCudaSuccess;
}
inline int event_record(collective::NcclEvent event, void*) {
  std::lock_guard<std::mutex> lock(world().mutex);
  auto* e = static_cast<FakeNcclEvent*>(event);
  e->comm = last_comm;
  e->target = last_comm ? last_comm->enqueued : 0;
  return collective::kCudaSuccess;
}
inline int event_query(collective::NcclEvent event) {
  std::lock_guard<std::mutex> lock(world().mutex);
  auto* e = static_cast<FakeNcclEvent*>(event);
  return e->comm == nullptr || e->comm->completed >= e->target ? collective::kCudaSuccess
                                                               : collective::kCudaErrorNotReady;
}
inline int event_destroy(collective::NcclEvent event) {
  delete static_cast<FakeNcclEvent*>(event);
  return collective::kCudaSuccess;
}
inline int scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor, void*) {
  std::lock_guard<std::mutex> lock(world().mutex);
  ++world().divisions;
  last_comm->divisions.push_back({last_comm->enqueued, buffer, count, dtype, divisor});
  last_comm->run_divisions();
  return collective::kCudaSuccess;
}
inline const char* cuda_error_string(int code) {
  return code == 2 ? "fake cudaErrorMemoryAllocation: out of memory" : "fake cuda error";
}

}  // namespace fake_nccl

/// The fake table.
inline const collective::NcclApi& fake_nccl_api() {
  static const collective::NcclApi api = [] {
    collective::NcclApi a;
    a.name = "fake-nccl";
    a.get_unique_id = fake_nccl::get_unique_id;
    a.comm_init_rank = fake_nccl::comm_init_rank;
    a.comm_get_async_error = fake_nccl::comm_get_async_error;
    a.comm_abort = fake_nccl::comm_abort;
    a.comm_finalize = fake_nccl::comm_finalize;
    a.comm_destroy = fake_nccl::comm_destroy;
    a.group_start = fake_nccl::group_start;
    a.group_end = fake_nccl::group_end;
    a.all_reduce = fake_nccl::all_reduce;
    a.reduce_scatter = fake_nccl::reduce_scatter;
    a.all_gather = fake_nccl::all_gather;
    a.broadcast = fake_nccl::broadcast;
    a.error_string = fake_nccl::error_string;
    a.last_error = fake_nccl::last_error;
    a.set_device = fake_nccl::set_device;
    a.event_create = fake_nccl::event_create;
    a.event_record = fake_nccl::event_record;
    a.event_query = fake_nccl::event_query;
    a.event_destroy = fake_nccl::event_destroy;
    a.scale_divide = fake_nccl::scale_divide;
    a.cuda_error_string = fake_nccl::cuda_error_string;
    return a;
  }();
  return api;
}

}  // namespace mwms::testing
