// A fake NcclApi (collective/backend/nccl_api.h) for CPU tests of the NCCL backend: ranks are
// threads of one process sharing a FakeNcclWorld; "device" buffers are host memory. An
// all-reduce completes (its event becomes ready, and the sum is written into every rank's
// buffer) when every rank of the world has enqueued it, so a rank that never calls leaves the
// others' events pending forever, as a dead peer leaves NCCL's kernels spinning. Knobs make init
// stay in progress, any entry of the table fail with a chosen ncclResult_t or cudaError_t
// (FakeNcclWorld::fail and clear, support/fake_faults.h as the fake CUDA runtime), and NCCL report
// an asynchronous error. A FakeNcclProcesses made in a single-threaded parent before it forks the
// ranks lets the world's ranks live in several processes (Note [fake nccl across processes]).
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective/backend/nccl_api.h"
#include "kernels/reduce.h"
#include "support/fake_faults.h"

namespace mwms::testing {

struct FakeNcclComm {
  int rank = 0;
  int world_size = 1;
  collective::NcclUniqueId id;
  int init_polls_left = 0;   // comm_get_async_error answers kNcclInProgress this many times
  int finalize_polls_left = 0;  // the same after comm_finalize
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

// Note [fake nccl across processes]: for multi-worker tests (W processes x K ranks each) the
// world's cross-rank state lives in one MAP_SHARED anonymous mapping that the parent makes before
// it forks the ranks (FakeNcclProcesses), so every child inherits it: fixed-size arrays only (no
// pointer means anything in another process), guarded by one process-shared robust mutex (a rank
// killed while holding it leaves it EOWNERDEAD, and the next locker makes it consistent). A rank's
// enqueue copies its send buffer into its ring slot of the mapping; whichever process sees that
// every rank of the world has enqueued collective k reduces the slots (in rank order, as the
// single-process world does) into result slot k; each process copies the result into its own
// ranks' recv buffers (and runs their mean divisions) when it next polls: enqueue, event_query or
// comm_get_async_error. No call ever waits: a rank that never enqueues leaves the others pending
// and the backend's deadline aborts them (TimeoutError), as in one process. Init stays in
// progress until every rank of the world has joined. A process of the world that has exited (no
// such pid, or a zombie) turns the asynchronous error of the others' communicators that have
// work pending into ncclRemoteError naming its ranks and pid, as NCCL's proxy reports a closed
// peer connection (PeerError in the backend). The world is keyed by its unique id: the first
// comm_init_rank with a new one (ids come from a counter in the mapping, so a launcher's rerun
// gets a fresh id) clears what an earlier world left there.
struct FakeNcclShared {
  static constexpr int kMaxRanks = 16;
  static constexpr std::size_t kRing = 32;              // collectives in flight per rank
  static constexpr std::size_t kSlotBytes = 32 * 1024;  // the largest payload of one collective
  struct OpHeader {
    std::size_t count;
    std::size_t bytes;
    DataType dtype;
    ReduceOp op;
    int root;
  };
  struct Rank {
    int joined;
    pid_t pid;
    std::uint64_t enqueued;  // collectives this rank enqueued
    std::uint64_t pulled;    // results its process copied back
    OpHeader ops[kRing];
    unsigned char data[kRing][kSlotBytes];
  };
  pthread_mutex_t mutex;
  std::uint64_t ids_made;
  unsigned char id[sizeof(collective::NcclUniqueId::bytes)];
  int world_size;
  int joined;
  std::uint64_t reduced;  // collectives whose result is in `result`
  std::size_t result_bytes[kRing];
  unsigned char result[kRing][kSlotBytes];
  Rank ranks[kMaxRanks];

  bool is(const collective::NcclUniqueId& other) const {
    return std::memcmp(id, other.bytes.data(), sizeof(id)) == 0;
  }
};

// Holds FakeNcclShared::mutex for a scope (robust: recovers it from a rank that died holding it).
class FakeNcclSharedLock {
 public:
  explicit FakeNcclSharedLock(FakeNcclShared& shared) : shared_(shared) {
    const int e = pthread_mutex_lock(&shared_.mutex);
    if (e == EOWNERDEAD) {
      pthread_mutex_consistent(&shared_.mutex);
    } else if (e != 0) {
      throw std::runtime_error("fake nccl: locking the shared world failed: " +
                               std::string(std::strerror(e)));
    }
  }
  ~FakeNcclSharedLock() { pthread_mutex_unlock(&shared_.mutex); }
  FakeNcclSharedLock(const FakeNcclSharedLock&) = delete;
  FakeNcclSharedLock& operator=(const FakeNcclSharedLock&) = delete;

 private:
  FakeNcclShared& shared_;
};

// Whether process `pid` still runs (false: no such process, or a zombie not reaped yet).
inline bool fake_nccl_process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  return stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

struct FakeNcclEvent {
  FakeNcclComm* comm = nullptr;
  std::size_t target = 0;  // ready once comm->completed >= target
};

/// Process-wide state of the fake (one world at a time); reset() between tests.
struct FakeNcclWorld {
  std::mutex mutex;
  std::vector<std::unique_ptr<FakeNcclComm>> comms;
  int init_polls = 2;             // in-progress answers before init completes
  int finalize_polls = 2;         // and before a finalize completes (1 << 30: never)
  bool init_never_completes = false;
  int device_count = 0;  // > 0: set_device wraps local ranks modulo it, as the real one does
  FakeFaults faults;  // fail(): one entry of the table fails, as in the fake CUDA runtime
  std::string last_error = "fake: last error text";
  collective::NcclUniqueId made_id;  // what get_unique_id handed out last
  std::atomic<int> aborts{0}, destroys{0}, groups{0}, divisions{0}, unique_ids{0};
  std::atomic<int> device_allocations{0};  // malloc_device minus free_device
  std::atomic<int> finalizes{0};
  // Set by FakeNcclProcesses: the ranks of the world span processes through this mapping (Note
  // [fake nccl across processes]); null: every rank is a thread of this process.
  FakeNcclShared* shared = nullptr;

  static FakeNcclWorld& get() {
    static FakeNcclWorld world;
    return world;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mutex);
    comms.clear();
    init_polls = 2;
    finalize_polls = 2;
    init_never_completes = false;
    device_count = 0;
    faults.clear();
    aborts = destroys = groups = divisions = unique_ids = 0;
    device_allocations = finalizes = 0;
  }
  /// Makes the table's entry `entry` ("comm_init_rank", "all_reduce", "event_query", ...) return
  /// `code` after `skip` more successful calls, then always.
  void fail(const std::string& entry, int code, int skip = 0) {
    std::lock_guard<std::mutex> lock(mutex);
    faults.fail(entry, code, skip);
  }
  /// Makes `entry` succeed again if fail() made it fail (another entry's failure stays).
  void clear(const std::string& entry) {
    std::lock_guard<std::mutex> lock(mutex);
    faults.clear(entry);
  }
  // What entry `name` must return (caller holds mutex): the injected failure, or 0 (go on).
  int injected(const char* name) { return faults.injected(name); }
  FakeNcclComm* comm_of_rank(int rank) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& c : comms) {
      if (c->rank == rank) return c.get();
    }
    return nullptr;
  }
  // Runs every collective all ranks have enqueued (caller holds mutex): sums for all-reduce.
  void progress() {
    if (shared != nullptr) {
      progress_shared();
      return;
    }
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
  // progress() across processes (caller holds mutex): reduces in the mapping what every rank has
  // enqueued, then copies the results into this process's ranks (Note [fake nccl across
  // processes]).
  void progress_shared() {
    FakeNcclShared& s = *shared;
    FakeNcclSharedLock lock(s);
    constexpr std::size_t ring = FakeNcclShared::kRing;
    while (s.world_size > 0 && s.joined >= s.world_size) {
      const std::uint64_t k = s.reduced;
      bool all = true;
      std::uint64_t min_pulled = ~std::uint64_t{0};
      for (int r = 0; r < s.world_size; ++r) {
        all = all && s.ranks[r].enqueued > k;
        min_pulled = std::min(min_pulled, s.ranks[r].pulled);
      }
      if (!all || k - min_pulled >= ring) break;  // not enqueued by all, or a result not taken
      const std::size_t slot = k % ring;
      const FakeNcclShared::OpHeader& first = s.ranks[0].ops[slot];
      const int source = first.root >= 0 ? first.root : 0;
      std::memcpy(s.result[slot], s.ranks[source].data[slot], first.bytes);
      for (int r = 1; r < s.world_size && first.root < 0; ++r) {
        kernels::reduce(s.result[slot], s.ranks[r].data[slot], first.count, first.dtype, first.op);
      }
      s.result_bytes[slot] = first.bytes;
      s.reduced = k + 1;
    }
    for (auto& c : comms) {
      if (c->aborted || c->destroyed || !s.is(c->id)) continue;
      while (c->completed < s.reduced && c->completed < c->ops.size()) {
        const std::size_t slot = c->completed % ring;
        std::memcpy(c->ops[c->completed].recv, s.result[slot], s.result_bytes[slot]);
        s.ranks[c->rank].pulled = ++c->completed;
        c->run_divisions();
      }
    }
  }
};

/// Makes the fake NCCL's world span the processes forked while it lives (Note [fake nccl across
/// processes]): construct it in the parent, single-threaded, before run_ranks; every child then
/// creates its ranks (comm_init_rank) as usual and they meet the other processes' ranks.
/// @throws std::runtime_error when the mapping or its mutex cannot be made.
class FakeNcclProcesses {
 public:
  FakeNcclProcesses() {
    void* p = ::mmap(nullptr, sizeof(FakeNcclShared), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw std::runtime_error("fake nccl: mmap of the shared world (" +
                               std::to_string(sizeof(FakeNcclShared)) +
                               " bytes) failed: " + std::strerror(errno));
    }
    shared_ = static_cast<FakeNcclShared*>(p);  // zero-filled: no world, no ids made yet
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    const int e = pthread_mutex_init(&shared_->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    if (e != 0) {
      ::munmap(shared_, sizeof(FakeNcclShared));
      throw std::runtime_error("fake nccl: process-shared mutex: " + std::string(std::strerror(e)));
    }
    FakeNcclWorld::get().reset();
    FakeNcclWorld::get().shared = shared_;
  }
  ~FakeNcclProcesses() {
    FakeNcclWorld::get().shared = nullptr;
    FakeNcclWorld::get().reset();
    pthread_mutex_destroy(&shared_->mutex);
    ::munmap(shared_, sizeof(FakeNcclShared));
  }
  FakeNcclProcesses(const FakeNcclProcesses&) = delete;
  FakeNcclProcesses& operator=(const FakeNcclProcesses&) = delete;

 private:
  FakeNcclShared* shared_ = nullptr;
};

namespace fake_nccl {

inline FakeNcclWorld& world() { return FakeNcclWorld::get(); }
inline FakeNcclComm* as_comm(collective::NcclComm c) { return static_cast<FakeNcclComm*>(c); }
inline thread_local FakeNcclComm* last_comm = nullptr;  // the stream's owner, for event_record

inline int get_unique_id(collective::NcclUniqueId* id) {
  {
    std::lock_guard<std::mutex> lock(world().mutex);
    if (int e = world().injected("get_unique_id")) return e;
  }
  int n = ++world().unique_ids;
  if (FakeNcclShared* s = world().shared) {
    FakeNcclSharedLock lock(*s);  // every id of the mapping differs (Note [fake nccl across ...])
    n = static_cast<int>(++s->ids_made);
  }
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
  if (int e = world().injected("comm_init_rank")) return e;
  if (FakeNcclShared* s = world().shared) {
    if (world_size > FakeNcclShared::kMaxRanks || rank < 0 || rank >= world_size) {
      world().last_error = "fake: rank " + std::to_string(rank) + " of a world of " +
                           std::to_string(world_size) + " across processes (at most " +
                           std::to_string(FakeNcclShared::kMaxRanks) + " ranks)";
      return collective::kNcclInvalidArgument;
    }
    FakeNcclSharedLock shared_lock(*s);
    if (!s->is(*id)) {  // a new world: forget the last one's ranks
      std::memcpy(s->id, id->bytes.data(), sizeof(s->id));
      s->world_size = world_size;
      s->joined = 0;
      s->reduced = 0;
      for (FakeNcclShared::Rank& r : s->ranks) {
        r.joined = 0;
        r.pid = 0;
        r.enqueued = r.pulled = 0;
      }
    }
    FakeNcclShared::Rank& me = s->ranks[rank];
    if (me.joined == 0) ++s->joined;
    me.joined = 1;
    me.pid = ::getpid();
  }
  c->init_polls_left = world().init_never_completes ? 1 << 30 : world().init_polls;
  *comm = c.get();
  world().comms.push_back(std::move(c));
  return collective::kNcclInProgress;
}

// Across processes (Note [fake nccl across processes]): the first rank of c's world whose process
// exited, or -1; sets c's asynchronous error to ncclRemoteError and the last error text naming
// that process's ranks.
// Caller holds the world's mutex.
inline int dead_peer(FakeNcclComm* c) {
  FakeNcclShared* s = world().shared;
  if (s == nullptr) return -1;
  FakeNcclSharedLock lock(*s);
  if (!s->is(c->id)) return -1;
  for (int r = 0; r < s->world_size; ++r) {
    const FakeNcclShared::Rank& peer = s->ranks[r];
    if (peer.joined == 0 || peer.pid == ::getpid() || fake_nccl_process_alive(peer.pid)) continue;
    std::string ranks;  // every rank of that process
    for (int q = r; q < s->world_size; ++q) {
      if (s->ranks[q].joined != 0 && s->ranks[q].pid == peer.pid) {
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
      }
    }
    c->async_error = collective::kNcclRemoteError;
    world().last_error = "fake: NCCL rank(s) " + ranks + " (process " + std::to_string(peer.pid) +
                         ") exited: its connection closed";
    return r;
  }
  return -1;
}

inline int comm_get_async_error(collective::NcclComm comm, int* async_error) {
  std::lock_guard<std::mutex> lock(world().mutex);
  FakeNcclComm* c = as_comm(comm);
  bool init_pending = c->init_polls_left > 0;
  if (init_pending) --c->init_polls_left;
  if (c->finalize_polls_left > 0) {
    --c->finalize_polls_left;
    *async_error = collective::kNcclInProgress;
    return collective::kNcclSuccess;
  }
  if (FakeNcclShared* s = world().shared) {
    world().progress();
    FakeNcclSharedLock shared_lock(*s);
    init_pending = init_pending || (s->is(c->id) && s->joined < s->world_size);
  }
  *async_error = init_pending ? collective::kNcclInProgress : c->async_error;
  if (c->async_error == collective::kNcclSuccess && !c->aborted &&
      (init_pending || c->completed < c->enqueued) && dead_peer(c) >= 0) {
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

inline int comm_finalize(collective::NcclComm comm) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("comm_finalize")) return e;
  as_comm(comm)->finalize_polls_left = world().finalize_polls;
  ++world().finalizes;
  return collective::kNcclInProgress;  // non-blocking: done once comm_get_async_error says so
}

inline int comm_destroy(collective::NcclComm comm) {
  std::lock_guard<std::mutex> lock(world().mutex);
  as_comm(comm)->destroyed = true;
  ++world().destroys;
  return collective::kNcclSuccess;
}

inline int group_start() {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("group_start")) return e;
  ++world().groups;
  return collective::kNcclSuccess;
}
inline int group_end() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().injected("group_end");
}

inline int enqueue(const char* entry, const void* send, void* recv, std::size_t count,
                   DataType dtype, ReduceOp op, collective::NcclComm comm, int root = -1) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected(entry)) return e;
  FakeNcclComm* c = as_comm(comm);
  if (FakeNcclShared* s = world().shared) {
    // The send buffer goes into this rank's ring slot (Note [fake nccl across processes]).
    FakeNcclSharedLock shared_lock(*s);
    FakeNcclShared::Rank& me = s->ranks[c->rank];
    const std::size_t bytes = count * dtype_size(dtype);
    if (bytes > FakeNcclShared::kSlotBytes || me.enqueued >= s->reduced + FakeNcclShared::kRing) {
      world().last_error = "fake: a collective of " + std::to_string(bytes) + " bytes with " +
                           std::to_string(me.enqueued - s->reduced) +
                           " in flight exceeds the shared world's slots";
      return collective::kNcclInternalError;
    }
    const std::size_t slot = me.enqueued % FakeNcclShared::kRing;
    me.ops[slot] = {count, bytes, dtype, op, root};
    if (bytes > 0) std::memcpy(me.data[slot], send, bytes);
    ++me.enqueued;
  }
  c->ops.push_back({send, recv, count, dtype, op, root});
  ++c->enqueued;
  last_comm = c;
  world().progress();
  return collective::kNcclSuccess;
}

inline int all_reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                      collective::NcclComm comm, void*) {
  return enqueue("all_reduce", send, recv, count, dtype, op, comm);
}
// Reduce-scatter and all-gather only move through the same completion machinery (no data);
// broadcast copies the root's buffer to every rank.
inline int reduce_scatter(const void* send, void* recv, std::size_t, DataType dtype, ReduceOp op,
                          collective::NcclComm comm, void*) {
  return enqueue("reduce_scatter", send, recv, 0, dtype, op, comm);
}
inline int all_gather(const void* send, void* recv, std::size_t, DataType dtype,
                      collective::NcclComm comm, void*) {
  return enqueue("all_gather", send, recv, 0, dtype, ReduceOp::kSum, comm);
}
inline int broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root,
                     collective::NcclComm comm, void*) {
  return enqueue("broadcast", send != nullptr ? send : recv, recv, count, dtype, ReduceOp::kSum,
                 comm, root);
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
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("set_device")) return e;
  *device = world().device_count > 0 ? local_rank % world().device_count : local_rank;
  return collective::kCudaSuccess;
}
inline int event_create(collective::NcclEvent* event) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("event_create")) return e;
  *event = new FakeNcclEvent;
  return collective::kCudaSuccess;
}
inline int event_record(collective::NcclEvent event, void*) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("event_record")) return e;
  auto* e = static_cast<FakeNcclEvent*>(event);
  e->comm = last_comm;
  e->target = last_comm ? last_comm->enqueued : 0;
  return collective::kCudaSuccess;
}
inline int event_query(collective::NcclEvent event) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("event_query")) return e;
  if (world().shared != nullptr) world().progress();  // other processes' enqueues
  auto* e = static_cast<FakeNcclEvent*>(event);
  return e->comm == nullptr || e->comm->completed >= e->target ? collective::kCudaSuccess
                                                               : collective::kCudaErrorNotReady;
}
inline int event_destroy(collective::NcclEvent event) {
  delete static_cast<FakeNcclEvent*>(event);
  return collective::kCudaSuccess;
}
// "Device memory" is zeroed host memory.
inline int malloc_device(void** ptr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("malloc_device")) return e;
  *ptr = std::calloc(bytes == 0 ? 1 : bytes, 1);
  ++world().device_allocations;
  return *ptr != nullptr ? collective::kCudaSuccess : 2;  // cudaErrorMemoryAllocation
}
inline int free_device(void* ptr) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (ptr != nullptr) --world().device_allocations;
  std::free(ptr);
  return collective::kCudaSuccess;
}
inline int scale_divide(void* buffer, std::size_t count, DataType dtype, int divisor, void*) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (int e = world().injected("scale_divide")) return e;
  ++world().divisions;
  last_comm->divisions.push_back({last_comm->enqueued, buffer, count, dtype, divisor});
  last_comm->run_divisions();
  return collective::kCudaSuccess;
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
    a.malloc_device = fake_nccl::malloc_device;
    a.free_device = fake_nccl::free_device;
    a.scale_divide = fake_nccl::scale_divide;
    a.cuda_error_string = fake_cuda_error_string;
    return a;
  }();
  return api;
}

}  // namespace mwms::testing
