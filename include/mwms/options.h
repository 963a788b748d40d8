/// @file options.h
/// Options structs (never positional booleans). Strategy-level names follow
/// tf.distribute.experimental.CommunicationOptions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "mwms/api.h"

namespace mwms {

/// Which cross-worker all-reduce implementation to use (tf.distribute.experimental
/// .CommunicationImplementation).
/// - Communicator (host buffers): kAuto and kRing run our algorithms (the engine) over
///   shm/TCP/MPI; kNccl is refused (InvalidArgument: host buffers cannot go through NCCL, use a
///   DeviceCommunicator).
/// - DeviceCommunicator (GPU buffers): kNccl is NCCL (an error when the build or the machine
///   cannot); kRing is the host-staged path (device -> pinned host -> the engine -> device);
///   kAuto is NCCL when the build has it and every rank has a GPU of its own, else host-staged
///   for every rank (decided collectively, logged at info).
enum class Implementation { kAuto, kRing, kNccl };

/// Which transport carries the engine's data between two ranks (the bench's --backend).
/// kAuto: shared memory between ranks on one host, TCP between hosts. kTcp: TCP everywhere. kShm:
/// shared memory everywhere (every rank must be on one host). kMpi: MPI point-to-point messages
/// (MPI_Isend/MPI_Irecv) under `mpirun`, our algorithms on top. Every rank must choose alike.
enum class TransportChoice { kAuto, kTcp, kShm, kMpi, kFromEnvironment };

/// Gradient compression on the wire (Horovod's hvd.Compression.fp16): float32 gradients are
/// converted to a 16-bit type before their all-reduce, summed in it, and converted back, halving
/// the bytes moved at the cost of precision (float16: 11 significant bits, overflow above 65504;
/// bfloat16: 8 bits, float32's range). Tensors of other dtypes are sent as they are.
enum class Compression { kNone, kFloat16, kBFloat16 };

/// tf.distribute.experimental.CommunicationOptions.
struct MWMS_API CommunicationOptions {
  /// Implementation to use; kAuto by default.
  Implementation implementation = Implementation::kAuto;
  /// Gradients are packed into buckets of at most this many bytes, one all-reduce per bucket.
  /// 0 lets the library choose (MWMS_BYTES_PER_PACK, default 4 MiB); a tensor larger than a pack
  /// gets a bucket of its own.
  std::size_t bytes_per_pack = 0;
  /// Deadline for every collective, in seconds. <= 0 uses MWMS_TIMEOUT_SECONDS (default 300).
  double timeout_seconds = 0;
  /// Compression of float32 gradients in all_reduce_gradients and the overlapped gradient sync;
  /// off by default. Every worker must use the same.
  Compression compression = Compression::kNone;
};

/// Options of a Communicator (lower level than CommunicationOptions).
struct MWMS_API CommunicatorOptions {
  /// Deadline for every blocking wait of a collective, in seconds; <= 0 uses MWMS_TIMEOUT_SECONDS.
  double timeout_seconds = 0;
  /// How long bootstrap keeps retrying to reach peers, in seconds; <= 0 uses
  /// MWMS_CONNECT_TIMEOUT_SECONDS (default 60).
  double connect_timeout_seconds = 0;
  /// Pipeline chunk of the ring algorithms, in bytes; 0 uses MWMS_CHUNK_BYTES (default 256 KiB).
  std::size_t chunk_bytes = 0;
  /// All-reduces of at most this many bytes use the latency-optimal algorithm (recursive
  /// doubling: log2(n) steps); larger ones use Rabenseifner's algorithm or the ring (see
  /// docs/algorithms.md). -1 reads MWMS_SMALL_MESSAGE_BYTES (default 65536); 0 keeps everything
  /// but empty buffers on the bandwidth algorithms. Every rank must use the same value (a
  /// disagreement raises CollectiveMismatchError).
  long long small_message_bytes = -1;
  /// Forces one algorithm for every collective that has an algorithm of that name: "ring",
  /// "gather", "rd" (recursive doubling) or "rhd" (Rabenseifner); "auto" lets the selector choose.
  /// Empty (the default) reads MWMS_ALGO. An unknown name, or an algorithm that does not apply to
  /// a call, raises InvalidArgument. Every rank must use the same value (a disagreement raises
  /// CollectiveMismatchError).
  std::string algorithm;
  /// Implementation (see Implementation): for Communicator kAuto and kRing both select the engine;
  /// for DeviceCommunicator it picks NCCL or the host-staged path.
  Implementation implementation = Implementation::kAuto;
  /// Transport of the engine's links; kFromEnvironment reads MWMS_TRANSPORT (default auto).
  TransportChoice transport = TransportChoice::kFromEnvironment;
};

/// What check_environment_variables() found in this process's MWMS_* variables (docs/env.md).
struct MWMS_API EnvironmentCheck {
  /// One message per registered variable set to a value libmwms would refuse when it reads it,
  /// e.g. "MWMS_TIMEOUT_SECONDS=abc is not a number (allowed: > 0)", in docs/env.md's order.
  std::vector<std::string> errors;
  /// MWMS_* names set in the environment that libmwms does not know (typos; ignored).
  std::vector<std::string> unknown;
};

/// Checks every MWMS_* variable of the environment now, without reading any into libmwms's
/// once-per-process cache: what a tool (mwms-doctor) reports before a job would fail on it.
/// Thread safety: as getenv. Never throws except std::bad_alloc.
MWMS_API EnvironmentCheck check_environment_variables();

}  // namespace mwms
