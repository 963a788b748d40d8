/// @file communicator.h
/// Communicator: a ring of ranks and the collectives that run on it (all-reduce, reduce-scatter,
/// all-gather, broadcast, barrier).
///
/// Contract (as in NCCL and MPI): every rank calls the same collectives in the same order with
/// matching count, dtype, op and root. A mismatch is detected (each collective carries a sequence
/// number and a description that both ends of every link check) and raised as
/// CollectiveMismatchError rather than corrupting memory. A rank refuses a call at the first
/// envelope it receives, before any payload byte of it touches the caller's buffers, so a rank
/// whose first receive is from a disagreeing peer (at two ranks: every rank) leaves its buffers
/// bit for bit as they were (all-gather's own block is placed last). When only some ranks
/// disagree, a rank that had already reduced or received an agreeing peer's data before the
/// disagreement reached it (relayed as PeerError) may hold partial results: its buffers' content
/// is then unspecified, as after any failed collective (MPI's and NCCL's rule). A broadcast's
/// root only sends and may complete; its next collective fails with the relayed error.
///
/// @code
///   // correct: both ranks all-reduce 1024 floats, then broadcast
///   comm->all_reduce(grad, 1024, DataType::kFloat32, ReduceOp::kSum);
///   comm->broadcast(weights, n, DataType::kFloat32, /*root=*/0);
///   // incorrect: rank 0 calls all_reduce while rank 1 calls broadcast -> CollectiveMismatchError
/// @endcode
///
/// Thread safety: one thread at a time per communicator. Blocking: every call returns when this
/// rank's part is complete, or throws within the deadline (CommunicatorOptions::timeout_seconds).
/// Each collective also has an asynchronous form (`*_async`) that returns a Work handle at once;
/// collectives run in the order they were called, blocking and asynchronous alike, on a progress
/// thread of the communicator while asynchronous ones are outstanding. The buffers of an
/// asynchronous collective must stay valid and untouched until its Work completed.
/// After a TimeoutError or PeerError the communicator is poisoned: later calls throw InvalidUsage
/// carrying the original cause. No call allocates once the scratch buffers have grown to the
/// largest message seen.
///
/// Shutdown: every rank calls finalize() once it has issued its last collective, so that peers
/// tell an orderly exit from a death (see finalize()).
/// @code
///   for (int step = 0; step < steps; ++step) comm->all_reduce(grad, n, kFloat32, kSum);
///   comm->finalize();  // every rank: a barrier, then "finalized" to every peer, links closed
///   // incorrect: rank 0 calls finalize() while rank 1 still calls all_reduce -> rank 1 gets
///   // CollectiveMismatchError "rank 0 finalized after N collective(s) and will not join ..."
/// @endcode
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "mwms/api.h"
#include "mwms/cluster.h"
#include "mwms/options.h"
#include "mwms/types.h"

namespace mwms {

/// Handle of an asynchronous collective (c10d's Work). Thread safety: test() and wait() may be
/// called from any thread. Destroying a handle does not cancel the collective.
class MWMS_API Work {
 public:
  /// Releases the handle only: the collective runs to completion (or fails) regardless, and its
  /// error, if any, is then lost. Never blocks, never throws.
  virtual ~Work();
  /// True once the collective has completed on this rank, successfully or not. Never blocks,
  /// never throws.
  virtual bool test() noexcept = 0;
  /// Blocks until the collective completed, for at most `timeout_seconds` (> 0; unset: the
  /// communicator's timeout; a value <= 0 still means unset for one release, deprecated: Note
  /// [option sentinels], mwms/options.h). Rethrows the collective's error (TimeoutError,
  /// PeerError, CollectiveMismatchError, InvalidUsage, ...). @throws TimeoutError when it has not
  /// completed in time (the collective itself keeps running under its own deadline).
  virtual void wait(std::optional<double> timeout_seconds = std::nullopt) = 0;

 protected:
  /// Only the communicator's implementation creates handles (the *_async calls).
  Work() = default;
};

/// A ring of ranks and its collectives; see the file comment for the calling contract, thread
/// safety, blocking and the poisoned state. Created by create(), owned through std::unique_ptr.
/// Buffers are caller-owned host memory of `count` elements of `dtype` (counts are elements, not
/// bytes); a collective never keeps a pointer past its completion.
class MWMS_API Communicator {
 public:
  /// Rendezvous with every task of `cluster`, exchanges peer info and connects a link to every
  /// peer (shared memory on one host, TCP between hosts, or MPI: CommunicatorOptions::transport)
  /// plus a TCP control link. Blocks until all ranks have arrived and connected, or the connect
  /// timeout passes. World size 1 connects nothing.
  /// @throws BootstrapError (peer never came up, naming task, address and time waited; listen port
  ///   in use; cluster views that differ, naming the task whose view differs; evaluator or ps;
  ///   ranks that chose different transports, naming both), BackendError (shared memory too
  ///   small, MPI failures), InvalidArgument (a bad option, or an unknown MWMS_ALGO).
  static std::unique_ptr<Communicator> create(const ResolvedCluster& cluster,
                                              const CommunicatorOptions& options = {});

  /// Waits for every asynchronous collective still outstanding (each bounded by its own
  /// deadline), then closes the links; peers of a communicator that was not finalize()d see its
  /// closed links as a PeerError if they wait for it in a collective. Never throws.
  virtual ~Communicator();

  /// This process's rank, in [0, world_size()).
  virtual int rank() const noexcept = 0;
  /// Number of ranks in the ring.
  virtual int world_size() const noexcept = 0;
  /// Number of collectives started so far (the next one's sequence number).
  virtual std::uint64_t seq() const noexcept = 0;
  /// The cluster this communicator was built from (ring filled in).
  virtual const ResolvedCluster& cluster() const noexcept = 0;

  /// In-place all-reduce of `count` elements at `buffer` (ring: reduce-scatter then all-gather,
  /// chunked and pipelined). Any count, including 0 and counts not divisible by world_size().
  /// float16/bfloat16 are reduced pairwise in float32 and rounded once per step (as NCCL does).
  /// @throws InvalidArgument (null buffer with count > 0), TimeoutError, PeerError,
  ///   CollectiveMismatchError (also when a peer finalized before this call), InvalidUsage
  ///   (poisoned, or finalized).
  virtual void all_reduce(void* buffer, std::size_t count, DataType dtype, ReduceOp op) = 0;

  /// Reduce-scatter (NCCL semantics): `send` holds world_size() * recv_count elements; rank r
  /// receives the reduction of block r (elements [r*recv_count, (r+1)*recv_count)) into `recv`.
  /// `recv` may alias block r of `send`. Throws as all_reduce.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                              ReduceOp op) = 0;

  /// All-gather (NCCL semantics): every rank contributes `send_count` elements; `recv` receives
  /// world_size() * send_count elements, rank r's block at offset r * send_count. `send` may alias
  /// block rank() of `recv`. Throws as all_reduce.
  virtual void all_gather(const void* send, void* recv, std::size_t send_count,
                          DataType dtype) = 0;

  /// Broadcast of `count` elements from rank `root` into `buffer` on every rank (pipelined ring).
  /// @throws InvalidArgument (root out of range) and as all_reduce.
  virtual void broadcast(void* buffer, std::size_t count, DataType dtype, int root) = 0;

  /// Returns once every rank has entered the barrier. Throws as all_reduce.
  virtual void barrier() = 0;

  /// @name Asynchronous collectives
  /// Same arguments, semantics, checks and errors as the blocking call of the same name, which
  /// each one's own line names. The call validates its arguments, takes the next sequence number,
  /// queues the collective for the communicator's progress thread (started on first use) and
  /// returns a Work handle without blocking. Collectives run in call order, blocking and
  /// asynchronous alike. Argument errors (InvalidArgument: a null buffer with count > 0, an
  /// unknown dtype or reduce op) and InvalidUsage after finalize() are thrown at once; everything
  /// else (TimeoutError, PeerError, CollectiveMismatchError, ...) comes out of Work::wait(). The
  /// buffers must stay valid and untouched until the Work has completed. Thread safety: as every
  /// collective, one calling thread at a time per communicator.
  ///@{

  /// all_reduce() without waiting.
  virtual std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DataType dtype,
                                                 ReduceOp op) = 0;
  /// reduce_scatter() without waiting.
  virtual std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv,
                                                     std::size_t recv_count, DataType dtype,
                                                     ReduceOp op) = 0;
  /// all_gather() without waiting.
  virtual std::shared_ptr<Work> all_gather_async(const void* send, void* recv,
                                                 std::size_t send_count, DataType dtype) = 0;
  /// broadcast() without waiting (a root out of range is thrown at once).
  virtual std::shared_ptr<Work> broadcast_async(void* buffer, std::size_t count, DataType dtype,
                                                int root) = 0;
  /// barrier() without waiting: the Work completes once every rank has entered the barrier.
  virtual std::shared_ptr<Work> barrier_async() = 0;
  ///@}

  /// One line describing the backend and the transports of its links (for logs and tools).
  virtual std::string describe() const = 0;

  /// Orderly shutdown; collective: every rank calls it, after its last collective. Waits first
  /// for every asynchronous collective still outstanding (their Work completes or fails as it
  /// would have; a failure among them poisons the communicator and finalize() throws
  /// InvalidUsage carrying it). Then runs a barrier under the communicator's timeout
  /// (CommunicatorOptions::timeout_seconds; it consumes one sequence number and, on the wire, is
  /// a barrier), tells every peer over the control plane that this rank finalized after seq()
  /// collectives (bounded: at most ~1 s, a peer that already closed is skipped) and closes every
  /// link. What peers then see: this rank's closed connections are an orderly shutdown, not an
  /// error, for every rank; a peer that calls another collective fails at once with
  /// CollectiveMismatchError naming this rank as finalized (not a death, not a timeout). A rank
  /// that exits or destroys its communicator WITHOUT finalize() while a peer waits for it in a
  /// collective is still reported to that peer as a PeerError ("shut down before seq N
  /// completed, or died") within milliseconds.
  /// After it returns, every collective throws InvalidUsage ("communicator finalized"); calling
  /// finalize() again does nothing. The destructor of a communicator that was never finalized
  /// behaves as before (closes the links without a notice). World size 1: only marks it finalized.
  /// Blocking; one thread at a time, like every collective.
  /// @throws the barrier's errors as barrier() does (TimeoutError, PeerError,
  ///   CollectiveMismatchError, InvalidUsage when poisoned); the communicator is then poisoned
  ///   and not finalized.
  virtual void finalize() = 0;

  /// Sends an abort to every peer (best effort, never throws) and poisons this communicator;
  /// peers blocked in a collective fail with PeerError naming this rank and `reason`. May be
  /// called from another thread while a collective of this communicator blocks (a watchdog, a
  /// signal watcher): that collective then throws InvalidUsage ("communicator aborted by this
  /// process ...: `reason`") within its wait slice (about 10 ms on shared memory, 100 ms on
  /// TCP), however long its peers or deadline would have kept it.
  virtual void abort(const std::string& reason) noexcept = 0;

 protected:
  /// Only create() makes communicators.
  Communicator() = default;
};

}  // namespace mwms
