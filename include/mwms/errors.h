/// @file errors.h
/// The one error model of libmwms: C++ exceptions rooted at mwms::Error, split by what the caller
/// must rebuild (UCX's blast-radius classes). docs/errors.md says what to do with each.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "mwms/api.h"

namespace mwms {

/// What the raising code knew of why the peer named in an ErrorContext failed. Set where the
/// error is raised (and carried by the abort relay, so every rank's error for that peer says the
/// same); kUnknown wherever the raiser could not tell, which is most errors. Read it, never the
/// message text, to tell a stalled peer from a dead one (libmwms itself does so to decide whether
/// MPI_Finalize may run at exit: Note [no finalize after a stall], src/bootstrap/mpi_runtime.cc).
enum class FailureCause : std::uint8_t {
  kUnknown = 0,  ///< not known, or no peer failed (the default)
  kDied = 1,     ///< the peer closed its connections without finalize(): it exited, died or aborted
  kStalled = 2,  ///< the peer is alive but silent: nothing, not even a heartbeat, came from it for
                 ///< the loss interval (stopped by SIGSTOP or a debugger, hung, host down, network
                 ///< cut; MWMS_HEARTBEAT_SECONDS)
};

/// Where an error happened. Fields that do not apply keep their "unset" value (-1 or empty) and are
/// left out of the rendered text.
struct MWMS_API ErrorContext {
  int rank = -1;                  ///< this process's rank (TF task id), -1 before bootstrap
  int world_size = -1;            ///< number of ranks in the ring
  std::string task;               ///< this process's task, e.g. "worker 1"
  int peer_rank = -1;             ///< the rank that failed or disagreed
  std::string peer_address;       ///< its address (host:port) when known
  std::string peer_task;          ///< its task, e.g. "chief 0"
  std::string op;                 ///< collective or phase: "all_reduce", "rendezvous", ...
  std::int64_t seq = -1;          ///< collective sequence number (0-based, per communicator)
  std::string transport;          ///< "tcp", ...
  std::int64_t bytes = -1;        ///< bytes involved in the failed transfer
  double elapsed_seconds = -1;    ///< time spent before failing
  double timeout_seconds = -1;    ///< the deadline that applied
  FailureCause cause = FailureCause::kUnknown;  ///< why the peer failed, when known; not rendered

  /// One-line rendering: "rank 1/3 (worker 0), peer rank 2 (worker 1, host:p), op all_reduce, ...".
  std::string to_string() const;
};

/// Root of every exception libmwms throws. what() = message + " [" + context + "]".
class MWMS_API Error : public std::runtime_error {
 public:
  /// Builds the exception from a message that names the task, address or value at fault and the
  /// structured `context`; what() is `message` followed by " [" + context.to_string() + "]" (just
  /// `message` when the context is empty). Every subclass inherits this constructor.
  /// May throw std::bad_alloc (copies the strings); nothing else.
  explicit Error(const std::string& message, ErrorContext context = {});
  /// The message without the rendered context.
  const std::string& message() const noexcept { return message_; }
  /// The structured context (rank, peer, op, seq, ...).
  const ErrorContext& context() const noexcept { return context_; }

 private:
  std::string message_;
  ErrorContext context_;
};

/// A caller bug (bad count, dtype, pointer, option, malformed configuration value); nothing was
/// changed and nothing is broken: fix the call.
class MWMS_API InvalidArgument : public Error { using Error::Error; };

/// A call made in a state that does not allow it (e.g. a collective on a poisoned communicator).
class MWMS_API InvalidUsage : public Error { using Error::Error; };

/// TF_CONFIG, cluster resolution, rendezvous or ring formation failed (bad spec, port in use,
/// peer never came up, differing cluster views). Fix the configuration and restart every task.
/// (Error is a virtual base of BootstrapError and TimeoutError, so BootstrapTimeoutError is both
/// with one Error inside: `catch (const Error&)` sees it once.)
class MWMS_API BootstrapError : public virtual Error { using Error::Error; };

/// An operation missed its deadline. The communicator is poisoned: rebuild it.
class MWMS_API TimeoutError : public virtual Error { using Error::Error; };

/// A bootstrap deadline expired (MWMS_CONNECT_TIMEOUT_SECONDS): a task never joined the
/// rendezvous, the leader never answered, a link was never connected. Both a BootstrapError
/// (its context: the task and address waited for) and a TimeoutError, so a caller that treats
/// every missed deadline alike (`catch (const TimeoutError&)`) sees it, and one that handles
/// start-up failures (`catch (const BootstrapError&)`) does too.
class MWMS_API BootstrapTimeoutError : public BootstrapError, public TimeoutError {
 public:
  /// As Error's constructor.
  explicit BootstrapTimeoutError(const std::string& message, ErrorContext context = {})
      : Error(message, context), BootstrapError(message, context), TimeoutError(message, context) {}
};

/// A link to a peer failed (closed, reset, short read, corrupt frame, remote abort). The
/// communicator is poisoned: rebuild it (usually: restart the job from a checkpoint).
class MWMS_API PeerError : public Error { using Error::Error; };

/// Ranks called collectives that do not match (op, dtype, count, reduce op, root or sequence).
/// This is a bug in the calling program; the communicator is poisoned.
class MWMS_API CollectiveMismatchError : public Error { using Error::Error; };

/// Another local replica of this worker failed (its function threw, or its collective failed)
/// while this one waited for it in a ReplicaContext collective; the message names that replica
/// and its error. MultiWorkerMirroredStrategy::run() rethrows the failed replica's own exception,
/// not this one. The strategy stays usable if its communicator is (the next run() starts afresh).
class MWMS_API ReplicaError : public Error { using Error::Error; };

/// An operating-system, MPI, CUDA or NCCL call failed; native_code() is the foreign code (errno,
/// an MPI error code, ...). After one inside a collective the communicator is poisoned
/// (docs/errors.md says what to do).
class MWMS_API BackendError : public Error {
 public:
  /// As Error's constructor, plus the foreign call's own code: `native_code` is an errno value
  /// for operating-system calls (e.g. from shm_open/mmap/ftruncate), an MPI error code for MPI
  /// calls. The message should name the call that failed and its argument.
  BackendError(const std::string& message, int native_code, ErrorContext context = {});
  /// The foreign error code given at construction (errno, MPI error code, ...); ENOMEM for
  /// shared memory that is too small for the rings.
  int native_code() const noexcept { return native_code_; }

 private:
  int native_code_;
};

/// A checkpoint file (a ps's shard file, a checkpoint manifest) that cannot be written or used:
/// not found, damaged (a checksum, a field out of range, a truncated or overlong file), written for
/// other variables or another job, or a system call on it failed. path() names the file. Nothing
/// else is broken: the session falls back to an older checkpoint, or the caller fixes the
/// directory (docs/parameter_server.md, "Checkpoints").
class MWMS_API CheckpointError : public Error {
 public:
  /// As Error's constructor, plus the file concerned.
  CheckpointError(const std::string& message, std::string path, ErrorContext context = {});
  /// The file concerned (may be a directory when none of its files is usable).
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

/// A libmwms invariant broke (a bug in libmwms). Please report it with the message.
class MWMS_API InternalError : public Error { using Error::Error; };

}  // namespace mwms
