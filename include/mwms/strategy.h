/// @file strategy.h
/// MultiWorkerMirroredStrategy: synchronous data-parallel training across workers, after
/// tf.distribute.MultiWorkerMirroredStrategy. Each worker holds a mirror of every variable (initial
/// values broadcast from the chief), runs a step on its shard of the global batch, and the
/// gradients are packed into buckets of `bytes_per_pack` and all-reduced after each step, so every
/// worker applies the same update.
///
/// Local replicas (TF's MirroredStrategy inside each worker): a worker may drive K local replicas
/// (ReplicaOptions::local_replicas), one thread each on the CPU, so num_replicas_in_sync() ==
/// workers x K. run(fn) calls fn on every local replica at once with its ReplicaContext; replica
/// r of worker w has replica_id_in_sync_group w * K + r and its own rows of the global batch
/// (ReplicaContext::batch_shard). Each replica holds its OWN copy of the variables and its own
/// gradients, as TF keeps one copy per device: ReplicaContext::broadcast_variables makes every
/// copy the chief's replica 0 value, and ReplicaContext::all_reduce, called by every local
/// replica with its own tensors, reduces across all workers x K replicas (locally through the
/// reduction kernels into replica 0's tensors, once across workers, then copied back), so every
/// replica applies the same update to its copy. K = 1 (the default) runs fn on the calling thread
/// and reduces in place: no thread and no copy. The overlapped step (ReplicaContext::
/// begin_gradient_sync / gradient_ready / finish_gradient_sync) works with K > 1 too: each bucket
/// is reduced across the local replicas as soon as all K produced it, then all-reduced across
/// workers while backprop continues. With ReplicaOptions::device = kGpu each replica drives a GPU
/// and is an NCCL rank of its own; its device buffers go through the ReplicaContext collectives
/// that take a DeviceStream (Note [gpu replicas]).
///
/// Equivalence contract (TF's): with per-replica gradients computed as sum(loss_i) /
/// global_batch_size over the replica's shard (tf.nn.compute_average_loss) and
/// all_reduce_gradients(gradients) (or ReplicaContext::all_reduce(kSum, ...)), which SUMS them as
/// TF's MultiWorkerMirroredStrategy does, N workers x K local replicas end with the same weights
/// as one replica on the same global batch, up to float rounding. ReduceOp::kMean is only for
/// gradients of a per-shard mean loss (divided by the shard size, not the global batch); combined
/// with compute_average_loss it would divide by num_replicas_in_sync twice.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "mwms/api.h"
#include "mwms/cluster.h"
#include "mwms/communicator.h"
#include "mwms/device_communicator.h"
#include "mwms/options.h"
#include "mwms/types.h"

namespace mwms {

/// A caller-owned tensor: `count` elements of `dtype` at `data` (not copied, not freed).
struct MWMS_API TensorRef {
  void* data = nullptr;                 ///< first element; may be null only when count is 0
  std::size_t count = 0;                ///< number of elements (not bytes), flattened
  DataType dtype = DataType::kFloat32;  ///< element type (dtype_size() bytes each)
};

/// Half-open range [begin, end) of rows of a global batch (or of a dataset) owned by this worker.
struct MWMS_API Shard {
  std::size_t begin = 0;  ///< first row owned (inclusive)
  std::size_t end = 0;    ///< one past the last row owned (exclusive); end >= begin
  /// Number of rows owned: end - begin (0 when there are fewer rows than workers).
  std::size_t size() const noexcept { return end - begin; }
};

class MultiWorkerMirroredStrategy;

/// Where local replicas keep their variables and gradients.
enum class ReplicaDevice {
  kCpu,  ///< host memory; replica collectives through the reduction kernels and the Communicator
  kGpu,  ///< one CUDA device per replica; device collectives through NCCL (Note [gpu replicas])
};

/// How many local replicas each worker drives (TF: the worker's local devices), and where. Every
/// worker must use the same values (the strategy checks at construction).
struct MWMS_API ReplicaOptions {
  /// K, local replicas per worker: K threads, each with its own copy of the variables and its own
  /// gradients. In [1, 64]; 1 (the default) is one replica on the calling thread.
  int local_replicas = 1;
  /// kCpu (the default): host tensors. kGpu (TF's MirroredStrategy on GPUs, one process driving
  /// K GPUs): local replica r of worker w uses CUDA device local_rank x K + r
  /// (ReplicaContext::device; local_rank from the launcher, 0 for one process per host) and is
  /// NCCL rank w x K + r of workers x K; the strategy creates the K NCCL communicators at
  /// construction (one unique id from worker 0 through the strategy's communicator), and the
  /// ReplicaContext collectives that take a DeviceStream reduce device buffers across every
  /// replica of every worker in one NCCL group. Host-tensor collectives keep working. Needs a
  /// build with NCCL and K usable devices per process (NCCL refuses two ranks on one GPU).
  ReplicaDevice device = ReplicaDevice::kCpu;
};

/// What a replica function sees (tf.distribute.ReplicaContext), passed by
/// MultiWorkerMirroredStrategy::run() to fn on each local replica. Valid only during that call
/// and only on the replica's own thread. Its collectives (all_reduce, broadcast_variables) are
/// collectives across every replica of every worker: each local replica calls them in the same
/// order with the same shapes, each with its OWN tensors, as every worker calls the strategy's
/// collectives. Correct / incorrect (K > 1):
/// @code
///   strategy.run([&](const mwms::ReplicaContext& ctx) {
///     compute(grads[ctx.local_replica_id]);
///     ctx.all_reduce(mwms::ReduceOp::kSum, {{grads[ctx.local_replica_id].data(), n}});  // OK
///   });
///   strategy.run([&](const mwms::ReplicaContext& ctx) {
///     if (ctx.local_replica_id == 0) ctx.all_reduce(mwms::ReduceOp::kSum, {...});  // WRONG: the
///   });  // other replicas never join; replica 0 fails with InvalidUsage naming them
/// @endcode
struct MWMS_API ReplicaContext {
  int replica_id_in_sync_group = 0;  ///< global replica id: worker_index * K + local_replica_id
  int num_replicas_in_sync = 1;      ///< replicas across all workers (workers x K)
  int local_replica_id = 0;          ///< this replica on its worker, in [0, K)
  int num_local_replicas = 1;        ///< K
  int device = -1;                   ///< ReplicaDevice::kGpu: this replica's CUDA device; else -1

  /// Reduces `tensors` in place across all num_replicas_in_sync replicas (ReplicaContext
  /// .all_reduce): afterwards every replica's tensors hold op over every replica's values (kMean:
  /// the sum divided by num_replicas_in_sync). With K > 1 the local replicas' values are combined
  /// in local-replica order into replica 0's tensors (each thread one slice, through the
  /// reduction kernels), replica 0 all-reduces them across workers as all_reduce_gradients does
  /// (buckets of bytes_per_pack, compression), and the others copy the result back. Blocks until
  /// every local replica has arrived and the result is in place, each wait under timeout_seconds.
  /// Every replica must pass the same count and dtype per tensor, and must not touch another
  /// replica's tensors meanwhile.
  /// @throws InvalidArgument (null data, shapes differing between replicas, naming the replica
  ///   and tensor), InvalidUsage (a context not from run(); a replica returned from fn without
  ///   making this call), TimeoutError (a local replica did not arrive in time, naming it),
  ///   ReplicaError (another local replica failed; run() rethrows that replica's own error), and
  ///   as Communicator::all_reduce.
  void all_reduce(ReduceOp op, const std::vector<TensorRef>& tensors) const;

  /// ReplicaDevice::kGpu: reduces `tensors` in place across all num_replicas_in_sync replicas,
  /// where each tensor's data is device memory on this replica's device (`device`) and `stream`
  /// (a cudaStream_t of that device; null: the legacy default stream) orders the work: what the
  /// stream has enqueued before the call is reduced. Collective across every replica (each with
  /// its own tensors, the same shapes and op); local replica 0 issues every local replica's NCCL
  /// calls in one NCCL group (Note [gpu replicas]), and the call returns once the result is in
  /// every replica's buffers (waited for under timeout_seconds; later work on `stream` may use
  /// it). kMean divides once by num_replicas_in_sync on the device. Thread safety and
  /// exceptions as the host all_reduce, plus InvalidUsage (the strategy has kCpu replicas),
  /// BackendError (NCCL or CUDA failed, with its code), PeerError, TimeoutError (NCCL did not
  /// complete in time: every local NCCL communicator is aborted, later device calls throw
  /// InvalidUsage).
  void all_reduce(ReduceOp op, const std::vector<TensorRef>& tensors, DeviceStream stream) const;

  /// ReplicaDevice::kGpu: overwrites `variables` (device memory of this replica, ordered by
  /// `stream`) with the chief's local replica 0 value (one NCCL broadcast from NCCL rank 0, every
  /// replica's in one group). Collective, blocking and throwing as the device all_reduce.
  void broadcast_variables(const std::vector<TensorRef>& variables, DeviceStream stream) const;

  /// Mirrors variables to every replica: overwrites `variables` (this replica's own copy) with
  /// the chief's local replica 0 value (broadcast across workers, then copied to each local
  /// replica). Collective across every replica as all_reduce is; same blocking, deadlines and
  /// exceptions (as Communicator::broadcast across workers).
  void broadcast_variables(const std::vector<TensorRef>& variables) const;

  /// Overlapped gradient sync of this replica's step (the replica form of the strategy's
  /// begin_gradient_sync; Note [overlapped replica buckets]): declares this replica's gradient
  /// tensors in the order backprop makes them final. Collective across the local replicas: each
  /// calls it with its OWN tensors, the same shapes, dtypes and `op` in the same order; blocks
  /// until all K have (under timeout_seconds). Then gradient_ready() marks tensors final and
  /// finish_gradient_sync() ends the step; all three inside the same run() call. A bucket (packed
  /// as in all_reduce_gradients) is reduced across the K replicas, in local-replica order (the
  /// same bits whatever the thread timing), by the replica that made it complete on the last of
  /// them, into local replica 0's tensors, then all-reduced across workers asynchronously as soon
  /// as every earlier bucket has started. Between begin and finish a replica must not touch a
  /// tensor it marked ready (replica 0's receive the sums). K = 1: the strategy's own
  /// begin_gradient_sync on the calling thread.
  /// @throws InvalidUsage (begin twice; another ReplicaContext collective during the step),
  ///   InvalidArgument (null data, shapes or op differing from replica 0's), TimeoutError,
  ///   ReplicaError (another local replica failed).
  void begin_gradient_sync(const std::vector<TensorRef>& gradients,
                           ReduceOp op = ReduceOp::kSum) const;
  /// Tensor `index` of this replica's list is final (idempotent): may reduce its bucket across
  /// the local replicas on this thread (when this replica completed it last) and start the
  /// all-reduce of every bucket that can start, without waiting for it. Not collective.
  /// @throws InvalidUsage (no step begun, index out of range), and as
  ///   Communicator::all_reduce_async (on the replica that starts a bucket).
  void gradient_ready(std::size_t index) const;
  /// Marks this replica's remaining tensors ready, waits until every local replica has arrived
  /// and every bucket's all-reduce has completed (each wait under its deadline), then every
  /// replica's tensors hold op over all num_replicas_in_sync replicas' values (kMean divides
  /// once, after the sum). Collective across the local replicas. @throws InvalidUsage without
  /// begin; TimeoutError, ReplicaError as begin; a bucket's error (PeerError, TimeoutError, ...)
  /// on local replica 0, and ReplicaError naming it on the others.
  void finish_gradient_sync() const;

  /// This replica's rows of a global batch of `global_batch_size` rows: the
  /// replica_id_in_sync_group-th of num_replicas_in_sync contiguous parts whose sizes differ by
  /// at most one (the first global_batch_size % num_replicas_in_sync replicas get one more). Does
  /// not block.
  Shard batch_shard(std::size_t global_batch_size) const noexcept;

 private:
  friend class MultiWorkerMirroredStrategy;
  MultiWorkerMirroredStrategy* strategy_ = nullptr;  // null: not from run()
};

/// Synchronous data-parallel training across workers (tf.distribute.MultiWorkerMirroredStrategy;
/// see the file comment for the equivalence contract). Owns one Communicator over the resolved
/// cluster. Collective methods (broadcast_variables, all_reduce_gradients, the gradient sync,
/// reduce, finalize) must be called by every worker in the same order with matching shapes.
/// Thread safety: one thread at a time per strategy (the thread that calls run()); the const
/// accessors never block. Inside run() with K > 1 local replicas, replica threads use only their
/// ReplicaContext's collectives; the strategy's own collective methods (which are per worker:
/// they reduce one tensor list per worker) are for the calling thread outside run().
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
  /// As above, with `replicas.local_replicas` local replicas per worker (K threads, started here
  /// and joined by the destructor; none for K = 1). When there are several workers, they check
  /// that every one has the same K (one all_gather at construction). @throws InvalidArgument
  /// (K outside [1, 64], or workers with different K, naming them), and as the constructor above.
  MultiWorkerMirroredStrategy(const ResolvedCluster& cluster, const CommunicationOptions& options,
                              const ReplicaOptions& replicas);
  /// Destroys the communicator (closing its links without a notice when finalize() was not
  /// called). Never throws.
  ~MultiWorkerMirroredStrategy();
  /// Not copyable: it owns the communicator and its links.
  MultiWorkerMirroredStrategy(const MultiWorkerMirroredStrategy&) = delete;
  /// Not copyable: it owns the communicator and its links.
  MultiWorkerMirroredStrategy& operator=(const MultiWorkerMirroredStrategy&) = delete;

  /// Total replicas across all workers: num_workers() x num_local_replicas().
  int num_replicas_in_sync() const noexcept;
  /// K, this worker's local replicas (ReplicaOptions::local_replicas; the same on every worker).
  int num_local_replicas() const noexcept;
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
  /// shapes. With K > 1 local replicas this mirrors ONE copy per worker; use
  /// ReplicaContext::broadcast_variables inside run() for each replica's own copy.
  /// @throws as Communicator::broadcast.
  void broadcast_variables(const std::vector<TensorRef>& variables);

  /// Calls `fn` once per local replica with its ReplicaContext (tf.distribute.Strategy.run) and
  /// returns when every call has returned. K = 1: one call, on the calling thread. K > 1: all K
  /// calls at once, replica 0 on the calling thread and the others on the strategy's replica
  /// threads, so `fn` must be safe to call concurrently (each replica touching its own model).
  /// Not collective by itself; the strategy's own waits inside (ReplicaContext's collectives)
  /// have deadlines, fn's own work has none. Errors: when a replica's fn throws, replicas waiting
  /// for it in a ReplicaContext collective fail at once with ReplicaError naming it (none hangs),
  /// and run() rethrows the first replica's own exception (not a ReplicaError), after every call
  /// has returned. @throws InvalidUsage when called from inside run().
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
  /// must pass the same list (shapes and dtypes) and `op`. Per worker: with K > 1 local replicas,
  /// each replica uses ReplicaContext::begin_gradient_sync instead. Not thread-safe: one step at a
  /// time, from one thread. Repeating the same list reuses the bucket plan (nothing allocated once
  /// the pack buffers have grown). @throws InvalidUsage (begin twice, ready/finish without begin,
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
  double exposed_all_reduce_seconds() const noexcept;
  /// Deprecated spelling of exposed_all_reduce_seconds() (kept for one release).
  [[deprecated("use exposed_all_reduce_seconds()")]] double exposed_allreduce_seconds()
      const noexcept {
    return exposed_all_reduce_seconds();
  }

  /// Reduces one value across workers (tf.distribute.Strategy.reduce on a per-replica scalar):
  /// a float64 all-reduce of one element, so every worker returns the same value. Collective and
  /// blocking. @throws as Communicator::all_reduce.
  double reduce(ReduceOp op, double value);

  /// This worker's rows of a global batch of `global_batch_size` rows: contiguous, sizes differ by
  /// at most one (the first global_batch_size % workers workers get one more). With K > 1 local
  /// replicas: the union of this worker's replicas' rows (ReplicaContext::batch_shard), still
  /// contiguous; K = 1 gives exactly the per-worker split.
  Shard batch_shard(std::size_t global_batch_size) const noexcept;

  /// Orderly shutdown of the strategy's communicator (Communicator::finalize): collective, every
  /// worker calls it once after its last step; waits for outstanding asynchronous collectives,
  /// runs a barrier under timeout_seconds, tells every peer it finalized and closes the links, so
  /// a worker that exits next is not mistaken for a dead one. Later collective calls throw
  /// InvalidUsage ("communicator finalized"); a second finalize() does nothing; destroying a
  /// strategy that was not finalized behaves as before. With GPU replicas (device gpu) their
  /// NCCL communicators are finalized first (ncclCommFinalize on each, polled until every worker
  /// finalized, at most timeout_seconds; a worker that never finalizes makes the others throw
  /// TimeoutError), then the communicator. @throws InvalidUsage between begin_gradient_sync()
  /// and finish_gradient_sync(); otherwise as Communicator::finalize, plus NCCL's errors
  /// (BackendError, PeerError) for GPU replicas.
  void finalize();

  /// Seconds of gradient all-reduce so far (wall clock): the time inside all_reduce_gradients,
  /// plus, per overlapped step, the time from its first bucket's start until
  /// finish_gradient_sync() returned (an upper bound of the communication time).
  double all_reduce_seconds() const noexcept;
  /// Bytes all-reduced by all_reduce_gradients so far.
  std::size_t all_reduce_bytes() const noexcept;
  /// Deprecated spelling of all_reduce_seconds() (kept for one release; same value).
  [[deprecated("use all_reduce_seconds()")]] double allreduce_seconds() const noexcept {
    return all_reduce_seconds();
  }
  /// Deprecated spelling of all_reduce_bytes() (kept for one release; same value).
  [[deprecated("use all_reduce_bytes()")]] std::size_t allreduce_bytes() const noexcept {
    return all_reduce_bytes();
  }

 private:
  friend struct ReplicaContext;
  void replica_all_reduce(const ReplicaContext& ctx, ReduceOp op,
                          const std::vector<TensorRef>& tensors);
  void replica_broadcast(const ReplicaContext& ctx, const std::vector<TensorRef>& variables);
  void replica_begin_sync(const ReplicaContext& ctx, const std::vector<TensorRef>& gradients,
                          ReduceOp op);
  void replica_gradient_ready(const ReplicaContext& ctx, std::size_t index);
  void replica_finish_sync(const ReplicaContext& ctx);
  void drain_replica_sync() noexcept;
  void check_no_replica_sync(const char* op);
  void replica_device_collective(const ReplicaContext& ctx, ReduceOp op,
                                 const std::vector<TensorRef>& tensors, DeviceStream stream,
                                 bool broadcast);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mwms
