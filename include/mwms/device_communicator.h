/// @file device_communicator.h
/// DeviceCommunicator: collectives on GPU buffers, enqueued on the caller's CUDA stream, with
/// libmwms's bootstrap (TF_CONFIG, mpirun, any launcher), deadlines and errors. Two backends
/// (CommunicatorOptions::implementation; see DeviceCommunicator::create):
/// - NCCL (`MWMS_HAVE_NCCL`): the collective is handed whole to NCCL on the stream; one process
///   per GPU (NCCL refuses two ranks on one device). The NCCL unique id travels in our rendezvous.
/// - host-staged (`MWMS_HAVE_CUDA`): device -> pinned host copy on the stream, the engine's
///   collective (our algorithms over shm/TCP/MPI, as Communicator) on the host copy, host ->
///   device copy on the stream. Any number of ranks per GPU; costs two PCIe copies plus the
///   engine's time (docs/gpu.md "Host-staged path").
/// No CUDA type appears here: a stream is passed as an opaque DeviceStream.
///
/// Contract (as NCCL's): every rank calls the same collectives in the same order with matching
/// count, dtype, op and root. As on Communicator, each collective has a blocking name
/// (all_reduce: returns once the result is in device memory) and an `_async` name
/// (all_reduce_async: returns a Work). NCCL: an `_async` call only enqueues work on the stream
/// and returns at once. Host-staged: it returns once the engine finished (it waits for the copy
/// to the host, so for the work before it on the stream), and the Work covers the copy back.
/// Either way the Work completes when the result is in device memory, and later work on the
/// stream is ordered after it. Its deadline (CommunicatorOptions::timeout_seconds) is enforced
/// while the call, Work::wait or Work::test runs: a dead or stalled peer then makes the call or
/// wait() throw TimeoutError or PeerError (NCCL: after this rank aborted its NCCL communicator,
/// so no kernel is left spinning); every later call throws InvalidUsage carrying the cause
/// (poisoned).
/// @code
///   auto comm = mwms::DeviceCommunicator::create(mwms::resolve_from_environment());
///   // grad: device memory of n floats; stream: a cudaStream_t
///   auto work = comm->all_reduce_async(grad, n, mwms::DataType::kFloat32,
///                                      mwms::ReduceOp::kMean, mwms::DeviceStream{stream});
///   work->wait();  // or order later work on `stream` after it and wait once per step
///   comm->all_reduce(grad, n, mwms::DataType::kFloat32, mwms::ReduceOp::kSum,
///                    mwms::DeviceStream{stream});  // blocking: the result is in device memory
///   comm->finalize();  // every rank, after its last collective
/// @endcode
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "mwms/api.h"
#include "mwms/cluster.h"
#include "mwms/communicator.h"
#include "mwms/options.h"
#include "mwms/types.h"

namespace mwms {

/// A CUDA stream, opaque: `handle` is a cudaStream_t cast to void*; nullptr is the legacy default
/// stream. The stream must belong to this rank's device (DeviceCommunicator::device()).
struct DeviceStream {
  void* handle = nullptr;  ///< cudaStream_t, or nullptr for the default stream
};

/// One tensor of a bucket: `count` elements of device memory at `data`.
struct DeviceTensor {
  void* data = nullptr;  ///< device pointer
  std::size_t count = 0; ///< elements
};

/// Collectives on device buffers over NCCL or host-staged; see the file comment for the contract. Thread safety:
/// one thread at a time calls collectives; Work handles may be tested and waited on from any
/// thread. Buffers must stay valid until their Work completed.
class MWMS_API DeviceCommunicator {
 public:
  /// Rendezvous with every task of `cluster` (as Communicator::create does), selects device
  /// local_rank % device count and builds the backend options.implementation names:
  /// - kNccl: NCCL (rank 0 makes the NCCL unique id, the rendezvous hands it to every rank; the
  ///   NCCL communicator is created non-blocking and waited for at most
  ///   options.connect_timeout_seconds). InvalidUsage in a build without NCCL.
  /// - kRing: host-staged over the engine (options.transport, algorithm, chunk_bytes apply to it
  ///   as to Communicator). InvalidUsage in a build without CUDA.
  /// - kAuto (default): NCCL when this build has it and every rank can use it (each rank sees a
  ///   device and no host runs more ranks than it has devices), else host-staged for every rank.
  ///   Decided collectively (ranks exchange what they see over the engine, so they always
  ///   agree); the choice and its reason are logged at info.
  /// describe() says which was chosen. Uses options.timeout_seconds as each collective's deadline
  /// (<= 0: MWMS_TIMEOUT_SECONDS). Blocking; collective (every rank calls it with the same
  /// implementation).
  /// @throws InvalidUsage (the build lacks the backend), BootstrapError (as Communicator::create),
  ///   TimeoutError (a rank never created its NCCL communicator), BackendError (CUDA or NCCL
  ///   failed, e.g. no device: native code and text), PeerError.
  static std::unique_ptr<DeviceCommunicator> create(const ResolvedCluster& cluster,
                                                    const CommunicatorOptions& options = {});

  /// Waits for the last collective (bounded by its deadline), then finalizes and destroys the
  /// NCCL communicator (aborted if that does not complete in time), or frees the staging buffer
  /// and closes the engine's links (host-staged); after finalize() only frees what is left.
  /// Never throws.
  virtual ~DeviceCommunicator();

  /// This process's rank, in [0, world_size()).
  virtual int rank() const noexcept = 0;
  /// Number of ranks.
  virtual int world_size() const noexcept = 0;
  /// The CUDA device this rank uses (local rank modulo the number of devices).
  virtual int device() const noexcept = 0;

  /// @name Asynchronous collectives
  /// Each enqueues its collective on `stream` (which must belong to device()) and returns a Work
  /// without waiting for the device: the Work completes when the result is in device memory, and
  /// work enqueued on `stream` afterwards is ordered after it. NCCL returns at once;
  /// host-staged returns once the engine finished (see the file comment). Every rank calls the
  /// same collectives in the same order with matching count, dtype, op and root. The buffers
  /// must stay valid and untouched until the Work completed. Thread safety: one calling thread at
  /// a time (as every collective); the Work may be tested and waited on from any thread. Errors
  /// found while enqueueing are thrown by the call; later ones (NCCL's kernels, the copy back, a
  /// deadline passing) come out of Work::wait() or Work::test().
  ///@{

  /// In-place all-reduce of `count` elements of device memory at `buffer`, enqueued on `stream`.
  /// kMean divides the sum by world_size() with the CPU path's rounding. NaN handling of kMin and
  /// kMax is NCCL's (unspecified) on NCCL, the engine's on the host-staged path.
  /// @throws InvalidArgument (null buffer with count > 0; host-staged: a buffer that is not
  /// device memory), InvalidUsage (poisoned or finalized), BackendError, PeerError, TimeoutError
  /// (NCCL still enqueueing at the deadline; host-staged: the engine's errors, and a copy to the
  /// host not done by the deadline).
  virtual std::shared_ptr<Work> all_reduce_async(void* buffer, std::size_t count, DataType dtype,
                                                 ReduceOp op, DeviceStream stream = {}) = 0;

  /// In-place all-reduce of the `num_tensors` tensors at `tensors` (device memory, all of
  /// `dtype`) as one NCCL group (one launch, one Work); on the host-staged path the tensors are
  /// packed into the staging buffer and all-reduced by one engine call. `tensors` itself need
  /// only live during the call. Throws as all_reduce_async().
  virtual std::shared_ptr<Work> all_reduce_bucket_async(const DeviceTensor* tensors,
                                                        std::size_t num_tensors, DataType dtype,
                                                        ReduceOp op, DeviceStream stream = {}) = 0;

  /// Reduce-scatter (NCCL semantics): `send` holds world_size() * recv_count elements, rank r
  /// receives the reduction of block r into `recv` (recv_count elements). Throws as
  /// all_reduce_async().
  virtual std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv,
                                                     std::size_t recv_count, DataType dtype,
                                                     ReduceOp op, DeviceStream stream = {}) = 0;

  /// All-gather (NCCL semantics): `recv` receives world_size() * send_count elements, rank r's
  /// `send_count` elements at offset r * send_count. Throws as all_reduce_async().
  virtual std::shared_ptr<Work> all_gather_async(const void* send, void* recv,
                                                 std::size_t send_count, DataType dtype,
                                                 DeviceStream stream = {}) = 0;

  /// Broadcast of `count` elements from rank `root` into `buffer` on every rank.
  /// @throws InvalidArgument (root out of range, at once) and as all_reduce_async().
  virtual std::shared_ptr<Work> broadcast_async(void* buffer, std::size_t count, DataType dtype,
                                                int root, DeviceStream stream = {}) = 0;
  ///@}

  /// @name Blocking collectives
  /// Each runs the `_async` call of the same name (same arguments, checks and contract) and waits
  /// for its Work under the collective's deadline (CommunicatorOptions::timeout_seconds), so the
  /// result is in device memory when it returns and the caller may read or free the buffers.
  /// Each returns a completed Work for source compatibility (`comm->all_reduce(...)->wait()`
  /// still compiles and returns at once); it returns void from the next release. Thread safety:
  /// one calling thread at a time, as every collective.
  /// @throws what the `_async` call throws, and what its Work::wait() throws (TimeoutError,
  ///   PeerError, BackendError, InvalidUsage).
  ///@{

  /// all_reduce_async(), then waits. Returns a completed Work (source compatibility).
  std::shared_ptr<Work> all_reduce(void* buffer, std::size_t count, DataType dtype, ReduceOp op,
                                   DeviceStream stream = {});
  /// all_reduce_bucket_async(), then waits. Returns a completed Work (source compatibility).
  std::shared_ptr<Work> all_reduce_bucket(const DeviceTensor* tensors, std::size_t num_tensors,
                                          DataType dtype, ReduceOp op, DeviceStream stream = {});
  /// reduce_scatter_async(), then waits. Returns a completed Work (source compatibility).
  std::shared_ptr<Work> reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                       DataType dtype, ReduceOp op, DeviceStream stream = {});
  /// all_gather_async(), then waits. Returns a completed Work (source compatibility).
  std::shared_ptr<Work> all_gather(const void* send, void* recv, std::size_t send_count,
                                   DataType dtype, DeviceStream stream = {});
  /// broadcast_async(), then waits. Returns a completed Work (source compatibility).
  std::shared_ptr<Work> broadcast(void* buffer, std::size_t count, DataType dtype, int root,
                                  DeviceStream stream = {});
  ///@}

  /// Returns once every rank has called barrier() and the work enqueued on `stream` before it
  /// has completed on the device (as torch.distributed's barrier on NCCL: NCCL has none, so the
  /// NCCL backend all-reduces one element of a 4-byte device scratch buffer, allocated on first
  /// use, and waits for it; host-staged: waits for the stream, then the engine's barrier).
  /// Blocking, under the collective deadline (CommunicatorOptions::timeout_seconds); collective.
  /// @throws TimeoutError (a rank never arrived: NCCL's communicator is then aborted),
  ///   PeerError, InvalidUsage (poisoned or finalized), BackendError (CUDA/NCCL failed).
  virtual void barrier(DeviceStream stream = {}) = 0;

  /// Orderly shutdown; collective: every rank calls it after its last collective. Waits for the
  /// last collective (its error is thrown), then NCCL: ncclCommFinalize, polled until NCCL
  /// reports every rank finalized, and ncclCommDestroy; host-staged: Communicator::finalize of
  /// the engine (a barrier, then peers learn this rank finalized). Bounded by the collective
  /// timeout: a rank that never finalizes makes the others' finalize throw TimeoutError (NCCL:
  /// after aborting its communicator). Afterwards every collective throws InvalidUsage
  /// ("finalized"); a second call does nothing; the destructor then frees what is left without
  /// waiting for peers. Unlike Communicator, a peer that calls a collective after an NCCL rank
  /// finalized is not told so: NCCL has no such notice, and the peer's collective times out.
  /// Blocking; one thread at a time, like every collective.
  /// @throws InvalidUsage (poisoned), TimeoutError, PeerError, BackendError.
  virtual void finalize() = 0;

  /// One line naming the backend chosen: "nccl (device D, world size N)" or
  /// "host-staged (device D, world size N): <the engine's transports and algorithms>".
  virtual std::string describe() const = 0;

  /// Aborts the NCCL communicator (its kernels stop) or the engine (peers blocked in a collective
  /// fail with PeerError naming this rank) and poisons this object. Never throws.
  virtual void abort(const std::string& reason) noexcept = 0;

 protected:
  /// Only create() makes device communicators.
  DeviceCommunicator() = default;
};

}  // namespace mwms
