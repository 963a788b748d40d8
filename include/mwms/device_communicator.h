/// @file device_communicator.h
/// DeviceCommunicator: collectives on GPU buffers through NCCL, enqueued on the caller's CUDA
/// stream, with libmwms's bootstrap (TF_CONFIG, mpirun, any launcher: the NCCL unique id travels
/// in our rendezvous), deadlines and errors. Needs a build with NCCL (`MWMS_HAVE_NCCL` in
/// mwms/config.h); no CUDA type appears here: a stream is passed as an opaque DeviceStream.
///
/// Contract (as NCCL's): every rank calls the same collectives in the same order with matching
/// count, dtype, op and root; one process per GPU (NCCL refuses two ranks on one device). Each
/// call only enqueues work on the stream and returns a Work at once; the Work completes when the
/// collective completed on the device. Its deadline (CommunicatorOptions::timeout_seconds) is
/// enforced while Work::wait or Work::test runs: a dead or stalled peer then makes wait() throw
/// TimeoutError (or PeerError when NCCL reports the failure), after this rank aborted its NCCL
/// communicator, so no kernel is left spinning; every later call throws InvalidUsage carrying the
/// cause (poisoned).
/// @code
///   auto comm = mwms::DeviceCommunicator::create(mwms::resolve_from_environment());
///   // grad: device memory of n floats; stream: a cudaStream_t
///   auto work = comm->all_reduce(grad, n, mwms::DataType::kFloat32, mwms::ReduceOp::kMean,
///                                mwms::DeviceStream{stream});
///   work->wait();  // or order later work on `stream` after it and wait once per step
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

/// Collectives on device buffers over NCCL; see the file comment for the contract. Thread safety:
/// one thread at a time calls collectives; Work handles may be tested and waited on from any
/// thread. Buffers must stay valid until their Work completed.
class MWMS_API DeviceCommunicator {
 public:
  /// Rendezvous with every task of `cluster` (as Communicator::create does; rank 0 makes the NCCL
  /// unique id and the rendezvous hands it to every rank), selects device local_rank % device
  /// count and creates the NCCL communicator (non-blocking), waiting for it for at most
  /// options.connect_timeout_seconds. Uses options.timeout_seconds as each collective's deadline
  /// (<= 0: MWMS_TIMEOUT_SECONDS). Blocking.
  /// @throws InvalidUsage (this build has no NCCL), BootstrapError (as Communicator::create),
  ///   TimeoutError (a rank never created its NCCL communicator), BackendError (CUDA or NCCL
  ///   failed, e.g. no device: native code and text), PeerError.
  static std::unique_ptr<DeviceCommunicator> create(const ResolvedCluster& cluster,
                                                    const CommunicatorOptions& options = {});

  /// Waits for the last collective (bounded by its deadline), then finalizes and destroys the
  /// NCCL communicator (aborted if that does not complete in time). Never throws.
  virtual ~DeviceCommunicator();

  /// This process's rank, in [0, world_size()).
  virtual int rank() const noexcept = 0;
  /// Number of ranks.
  virtual int world_size() const noexcept = 0;
  /// The CUDA device this rank uses (local rank modulo the number of devices).
  virtual int device() const noexcept = 0;

  /// In-place all-reduce of `count` elements of device memory at `buffer`, enqueued on `stream`.
  /// kMean divides the sum by world_size() with the CPU path's rounding. NaN handling of kMin and
  /// kMax is NCCL's (unspecified), unlike the engine's. @throws InvalidArgument (null buffer with
  /// count > 0), InvalidUsage (poisoned), BackendError, PeerError, TimeoutError (NCCL still
  /// enqueueing at the deadline); later failures come out of Work::wait().
  virtual std::shared_ptr<Work> all_reduce(void* buffer, std::size_t count, DataType dtype,
                                           ReduceOp op, DeviceStream stream = {}) = 0;

  /// In-place all-reduce of every tensor of a bucket as one NCCL group (one launch, one Work).
  /// Throws as all_reduce().
  virtual std::shared_ptr<Work> all_reduce_bucket(const DeviceTensor* tensors,
                                                  std::size_t num_tensors, DataType dtype,
                                                  ReduceOp op, DeviceStream stream = {}) = 0;

  /// Reduce-scatter (NCCL semantics): `send` holds world_size() * recv_count elements, rank r
  /// receives the reduction of block r. Throws as all_reduce().
  virtual std::shared_ptr<Work> reduce_scatter(const void* send, void* recv,
                                               std::size_t recv_count, DataType dtype,
                                               ReduceOp op, DeviceStream stream = {}) = 0;

  /// All-gather (NCCL semantics): `recv` receives world_size() * send_count elements, rank r's at
  /// offset r * send_count. Throws as all_reduce().
  virtual std::shared_ptr<Work> all_gather(const void* send, void* recv, std::size_t send_count,
                                           DataType dtype, DeviceStream stream = {}) = 0;

  /// Broadcast of `count` elements from rank `root` into `buffer` on every rank.
  /// @throws InvalidArgument (root out of range) and as all_reduce().
  virtual std::shared_ptr<Work> broadcast(void* buffer, std::size_t count, DataType dtype,
                                          int root, DeviceStream stream = {}) = 0;

  /// One line: "nccl (device D, world size N)".
  virtual std::string describe() const = 0;

  /// Aborts the NCCL communicator (its kernels stop) and poisons this object. Never throws.
  virtual void abort(const std::string& reason) noexcept = 0;

 protected:
  /// Only create() makes device communicators.
  DeviceCommunicator() = default;
};

}  // namespace mwms
