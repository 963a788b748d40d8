/// @file options.h
/// Options structs (never positional booleans). Strategy-level names follow
/// tf.distribute.experimental.CommunicationOptions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "mwms/api.h"

namespace mwms {

/// Note [option sentinels]: every option that may be left to the environment (or to the
/// library's default) is a std::optional, and std::nullopt, the default, is the only way to say
/// "not set": the MWMS_* variable of docs/env.md (or the documented default) applies. The
/// sentinels of 0.x (a timeout or size of 0, small_message_bytes -1, an empty algorithm,
/// TransportChoice::kFromEnvironment) still mean "not set" for one release, deprecated: each is
/// logged once per process at warn, naming the field.

/// Which cross-worker all-reduce implementation to use (tf.distribute.experimental
/// .CommunicationImplementation, with TF's three names). kRing is TF's RING, "not NCCL": the
/// library's own engine (its algorithms, which the selector picks per size and topology, ring or
/// not, over shm/TCP/MPI links); device buffers reach it through host staging.
/// - Communicator (host buffers): kAuto and kRing are the engine; kNccl is refused
///   (InvalidArgument: host buffers cannot go through NCCL, use a DeviceCommunicator).
/// - DeviceCommunicator (GPU buffers): kNccl is NCCL (an error when the build or the machine
///   cannot); kRing is the engine, host-staged (device -> pinned host -> the engine -> device);
///   kAuto is NCCL when the build has it and every rank has a GPU of its own, else host-staged
///   for every rank (decided collectively, logged at info).
enum class Implementation { kAuto, kRing, kNccl };

/// Which transport carries the engine's data between two ranks (the bench's --backend).
/// kAuto: shared memory between ranks on one host, TCP between hosts. kTcp: TCP everywhere. kShm:
/// shared memory everywhere (every rank must be on one host). kMpi: MPI point-to-point messages
/// (MPI_Isend/MPI_Irecv) under `mpirun`, our algorithms on top. Every rank must choose alike.
/// An options struct's transport left unset (std::nullopt) reads MWMS_TRANSPORT (default auto).
enum class TransportChoice {
  kAuto,
  kTcp,
  kShm,
  kMpi,
  /// Deprecated (Note [option sentinels]): leave the transport unset (std::nullopt) instead.
  kFromEnvironment [[deprecated("leave the transport unset (std::nullopt) to read MWMS_TRANSPORT")]]
};

/// Gradient compression on the wire (Horovod's hvd.Compression.fp16): float32 gradients are
/// converted to a 16-bit type before their all-reduce, summed in it, and converted back, halving
/// the bytes moved at the cost of precision (float16: 11 significant bits, overflow above 65504;
/// bfloat16: 8 bits, float32's range). Tensors of other dtypes are sent as they are.
enum class Compression { kNone, kFloat16, kBFloat16 };

/// tf.distribute.experimental.CommunicationOptions: the strategy-level options. The strategy
/// forwards `implementation` and `timeout_seconds` to its Communicator, where the same names
/// mean the same thing (CommunicatorOptions). Unset fields: Note [option sentinels].
struct MWMS_API CommunicationOptions {
  /// Implementation to use; kAuto by default.
  Implementation implementation = Implementation::kAuto;
  /// Gradients are packed into buckets of at most this many bytes, one all-reduce per bucket.
  /// Unset: MWMS_BYTES_PER_PACK (default 4 MiB); a tensor larger than a pack gets a bucket of its
  /// own. Must be > 0 when set (0 still means unset, deprecated).
  std::optional<std::size_t> bytes_per_pack;
  /// Deadline for every collective, in seconds, > 0. Unset: MWMS_TIMEOUT_SECONDS (default 300);
  /// a value <= 0 still means unset (deprecated).
  std::optional<double> timeout_seconds;
  /// Compression of float32 gradients in all_reduce_gradients and the overlapped gradient sync;
  /// off by default. Every worker must use the same.
  Compression compression = Compression::kNone;
};

/// Options of a Communicator (lower level than CommunicationOptions, whose `implementation` and
/// `timeout_seconds` it shares). Unset fields: Note [option sentinels].
struct MWMS_API CommunicatorOptions {
  /// Deadline for every blocking wait of a collective, in seconds, > 0. Unset:
  /// MWMS_TIMEOUT_SECONDS (default 300); <= 0 still means unset (deprecated).
  std::optional<double> timeout_seconds;
  /// How long bootstrap keeps retrying to reach peers, in seconds, > 0. Unset:
  /// MWMS_CONNECT_TIMEOUT_SECONDS (default 60); <= 0 still means unset (deprecated).
  std::optional<double> connect_timeout_seconds;
  /// Pipeline chunk of the ring algorithms, in bytes, at least 4096. Unset: MWMS_CHUNK_BYTES
  /// (default 256 KiB); 0 still means unset (deprecated).
  std::optional<std::size_t> chunk_bytes;
  /// All-reduces of at most this many bytes use the latency-optimal algorithm (recursive
  /// doubling: log2(n) steps); larger ones use Rabenseifner's algorithm or the ring (see
  /// docs/algorithms.md). Unset: MWMS_SMALL_MESSAGE_BYTES (default 65536); 0 keeps everything
  /// but empty buffers on the bandwidth algorithms; a negative value still means unset
  /// (deprecated). Every rank must use the same value (a disagreement raises
  /// CollectiveMismatchError).
  std::optional<long long> small_message_bytes;
  /// Forces one algorithm for every collective that has an algorithm of that name: "ring",
  /// "gather", "rd" (recursive doubling) or "rhd" (Rabenseifner); "auto" lets the selector choose.
  /// Unset: MWMS_ALGO (an empty string still means unset, deprecated). An unknown name, or an
  /// algorithm that does not apply to a call, raises InvalidArgument. Every rank must use the
  /// same value (a disagreement raises CollectiveMismatchError).
  std::optional<std::string> algorithm;
  /// Implementation (see Implementation): for Communicator kAuto and kRing both select the engine;
  /// for DeviceCommunicator it picks NCCL or the host-staged engine.
  Implementation implementation = Implementation::kAuto;
  /// Transport of the engine's links. Unset: MWMS_TRANSPORT (default auto).
  std::optional<TransportChoice> transport;
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
