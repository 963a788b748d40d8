/// @file strategy.h
/// MultiWorkerMirroredStrategy: synchronous data-parallel training across workers, after
/// tf.distribute.MultiWorkerMirroredStrategy. Each worker holds a mirror of every variable (initial
/// values broadcast from the chief), runs a step on its shard of the global batch, and the
/// gradients are packed into buckets of `bytes_per_pack` and all-reduced after each step, so every
/// worker applies the same update.
///
/// On the CPU each worker has one local replica, so num_replicas_in_sync() == number of workers.
///
/// Equivalence contract (TF's): with per-replica gradients computed as sum(loss_i) /
/// global_batch_size over the replica's shard (tf.nn.compute_average_loss) and
/// all_reduce_gradients(gradients), which SUMS them as TF's MultiWorkerMirroredStrategy does,
/// N workers end with the same weights as one worker on the same global batch, up to float
/// rounding. ReduceOp::kMean is only for gradients of a per-shard mean loss (divided by the shard
/// size, not the global batch); combined with compute_average_loss it would divide by N twice.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "mwms/api.h"
#include "mwms/cluster.h"
#include "mwms/communicator.h"
#include "mwms/options.h"
#include "mwms/types.h"

namespace mwms {

/// A caller-owned tensor: `count` elements of `dtype` at `data` (not copied, not freed).
struct MWMS_API TensorRef {
  void* data = nullptr;                 ///< first element; may be null only when count is 0
  std::size_t count = 0;                ///< number of elements (not bytes), flattened
  DataType dtype = DataType::kFloat32;  ///< element type (dtype_size() bytes each)
};

/// What a replica function sees (tf.distribute.ReplicaContext).
struct MWMS_API ReplicaContext {
  int replica_id_in_sync_group = 0;  ///< global replica id, in [0, num_replicas_in_sync)
  int num_replicas_in_sync = 1;      ///< replicas across all workers (the strategy's)
};

/// Half-open range [begin, end) of rows of a global batch (or of a dataset) owned by this worker.
struct MWMS_API Shard {
  std::size_t begin = 0;  ///< first row owned (inclusive)
  std::size_t end = 0;    ///< one past the last row owned (exclusive); end >= begin
  /// Number of rows owned: end - begin (0 when there are fewer rows than workers).
  std::size_t size() const noexcept { return end - begin; }
};

/// Synchronous data-parallel training across workers (tf.distribute.MultiWorkerMirroredStrategy;
/// see the file comment for the equivalence contract). Owns one Communicator over the resolved
/// cluster. Collective methods (broadcast_variables, all_reduce_gradients, the gradient sync,
/// reduce, finalize) must be called by every worker in the same order with matching shapes.
/// Thread safety: one thread at a time per strategy; the const accessors never block.
class MWMS_API MultiWorkerMirroredStrategy {
 public:
  /// Resolves the cluster from the environment (TF_CONFIG, then mpirun, then a single process) and
  /// forms the ring. @throws BootstrapError as Communicator::create does.
  /// Blocks until every worker has arrived and connected, or the connect timeout
  /// (MWMS_CONNECT_TIMEOUT_SECONDS) passes.
  explicit MultiWorkerMirroredStrategy(const CommunicationOptions& options = {});
  /// Uses an already resolved cluster (e.g. from resolve_flags). Blocks as the constructor above.
  /// @throws BootstrapError, BackendError, InvalidArgument as Communicator::create does.
  MultiWorkerMirroredStrategy(const ResolvedCluster& cluster,
                              const CommunicationOptions& options = {});
  /// Destroys the communicator (closing its links without a notice when finalize() was not
  /// called). Never throws.
  ~MultiWorkerMirroredStrategy();
  /// Not copyable: it owns the communicator and its links.
  MultiWorkerMirroredStrategy(const MultiWorkerMirroredStrategy&) = delete;
  /// Not copyable: it owns the communicator and its links.
  MultiWorkerMirroredStrategy& operator=(const MultiWorkerMirroredStrategy&) = delete;

  /// Total replicas across all workers (workers x local replicas; 1 local replica on the CPU).
  int num_replicas_in_sync() const noexcept;
  /// Number of workers in the ring (TF: multi_worker_util.worker_count).
  int num_workers() const noexcept;
  /// This worker's rank / TF task id.
  int worker_index() const noexcept;
  /// True on the leader (chief, or worker 0 without a chief): checkpoints and logs.
  bool is_chief() const noexcept;
  /// The resolved cluster.
  const ResolvedCluster& cluster() const noexcept;
  /// Options in effect (bytes_per_pack and timeout_seconds resolved to their effective values).
  const CommunicationOptions& options() const noexcept;
  /// The communicator underneath (for custom collectives); owned by the strategy and valid for
  /// its lifetime. Its collectives share the strategy's order: every worker must interleave them
  /// with the strategy's own collectives identically.
  Communicator& communicator();

  /// Mirrors variables: overwrites each tensor on every worker with the chief's value (one
  /// broadcast per bucket of bytes_per_pack). Collective: every worker calls it with the same
  /// shapes. @throws as Communicator::broadcast.
  void broadcast_variables(const std::vector<TensorRef>& variables);

  /// Calls `fn` once per local replica with its ReplicaContext (tf.distribute.Strategy.run), on
  /// the calling thread; on the CPU that is one call. Not collective, does not block by itself.
  /// Exceptions from `fn` propagate.
  void run(const std::function<void(const ReplicaContext&)>& fn);

  /// All-reduces gradients in place: tensors are packed, in order, into buckets of at most
  /// bytes_per_pack bytes (a larger tensor is reduced on its own, in place), one all-reduce per
  /// bucket. Every worker must pass the same list of shapes and dtypes. @throws InvalidArgument
  /// (null data) and as Communicator::all_reduce. `op` defaults to kSum, as TF's MWMS sums the
  /// replicas' gradients (scale the loss by the global batch: see the equivalence contract above).
  void all_reduce_gradients(const std::vector<TensorRef>& gradients, ReduceOp op = ReduceOp::kSum);

  /// Gradient all-reduce overlapped with backprop (PyTorch DDP's Reducer, Horovod's
  /// allreduce_async): begin_gradient_sync() declares this step's gradient tensors **in the order
  /// backprop makes them final** (last layer first, as TF reverses its gradient list and DDP fills
  /// its buckets); gradient_ready(i) says tensor i is final; a bucket (packed as in
  /// all_reduce_gradients, in list order) is all-reduced asynchronously, on the communicator's
  /// progress thread, as soon as all its tensors are ready and every earlier bucket has started,
  /// so every worker starts the same buckets in the same order; finish_gradient_sync() marks what
  /// is left ready and waits for every bucket, then the tensors hold the reduced values.
  /// Between begin and finish the tensors of a started bucket must not be touched. Every worker
  /// must pass the same list (shapes and dtypes) and `op`. Not thread-safe: one step at a time,
  /// from one thread. Repeating the same list reuses the bucket plan (nothing allocated once the
  /// pack buffers have grown). @throws InvalidUsage (begin twice, ready/finish without begin,
  /// index out of range), InvalidArgument (null data); finish rethrows a bucket's error
  /// (PeerError, TimeoutError, ...) after waiting for every bucket.
  void begin_gradient_sync(const std::vector<TensorRef>& gradients, ReduceOp op = ReduceOp::kSum);
  /// Tensor `index` of the list given to begin_gradient_sync() is final (idempotent); may start
  /// the all-reduce of its bucket (without waiting for it). @throws InvalidUsage (no step begun,
  /// index out of range).
  void gradient_ready(std::size_t index);
  /// Waits for every bucket of the step, each under the communicator's deadline (see
  /// begin_gradient_sync()). @throws InvalidUsage without begin; rethrows a bucket's error.
  void finish_gradient_sync();

  /// Seconds this worker was blocked waiting for gradient all-reduces: all of
  /// all_reduce_gradients, and the waits inside finish_gradient_sync() (the communication that
  /// compute did not hide).
  double exposed_allreduce_seconds() const noexcept;

  /// Reduces one value across workers (tf.distribute.Strategy.reduce on a per-replica scalar):
  /// a float64 all-reduce of one element, so every worker returns the same value. Collective and
  /// blocking. @throws as Communicator::all_reduce.
  double reduce(ReduceOp op, double value);

  /// This worker's rows of a global batch of `global_batch_size` rows: contiguous, sizes differ by
  /// at most one (the first global_batch_size % workers workers get one more).
  Shard batch_shard(std::size_t global_batch_size) const noexcept;

  /// Orderly shutdown of the strategy's communicator (Communicator::finalize): collective, every
  /// worker calls it once after its last step; waits for outstanding asynchronous collectives,
  /// runs a barrier under timeout_seconds, tells every peer it finalized and closes the links, so
  /// a worker that exits next is not mistaken for a dead one. Later collective calls throw
  /// InvalidUsage ("communicator finalized"); a second finalize() does nothing; destroying a
  /// strategy that was not finalized behaves as before. @throws InvalidUsage between
  /// begin_gradient_sync() and finish_gradient_sync(); otherwise as Communicator::finalize.
  void finalize();

  /// Seconds of gradient all-reduce so far (wall clock): the time inside all_reduce_gradients,
  /// plus, per overlapped step, the time from its first bucket's start until
  /// finish_gradient_sync() returned (an upper bound of the communication time).
  double allreduce_seconds() const noexcept;
  /// Bytes all-reduced by all_reduce_gradients so far.
  std::size_t allreduce_bytes() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mwms
