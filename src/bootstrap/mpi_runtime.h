// The one owner of MPI's lifetime in libmwms (DESIGN "The transport seam", Bootstrap). Every part
// of the library that needs MPI (the endpoint exchange of mpirun jobs, the MPI transport) goes
// through MpiRuntime::acquire() and never calls MPI_Init or MPI_Finalize itself.
//
// Note [mpi ownership]: if the program initialised MPI before libmwms needed it, the program owns
// MPI and must finalise it (after destroying every communicator). Otherwise acquire() initialises
// it with MPI_Init_thread (MPI_THREAD_MULTIPLE requested) and finalises it exactly once, at
// process exit (std::atexit), if it is not already finalised — never in the middle of the job, so
// that MPI can carry data for as long as the process lives.
//
// Note [mpi threading]: libmwms calls MPI from one thread at a time per communicator (the caller's
// thread or the communicator's progress thread), so MPI_THREAD_SERIALIZED would suffice for one
// communicator. Several communicators may run on different threads, so when MPI provides less than
// MPI_THREAD_MULTIPLE every libmwms MPI call is made under one process-wide mutex (serialise()).
// A program that initialised MPI with MPI_THREAD_SINGLE or FUNNELED gets a warning: libmwms may
// call MPI from another thread than main, which most implementations tolerate but the standard
// does not promise.
//
// This header is compiled with and without MPI (mpi_runtime_stub.cc answers without it) and names
// no MPI type.
#pragma once

#include <mutex>
#include <string>

#include "mwms/errors.h"

namespace mwms::bootstrap {

/// True when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK
/// set). Never initialises anything.
bool launched_by_mpi() noexcept;

/// Converts an MPI return code (STYLE item 18: the one place): returns when `rc` is MPI_SUCCESS,
/// otherwise throws BackendError carrying `rc` and MPI_Error_string's text after `what`.
/// @throws BackendError
void throw_if_mpi(int rc, const std::string& what, ErrorContext context = {});

/// MPI's text for an error code (or "MPI error <rc>" when MPI has none).
std::string mpi_error_text(int rc);

/// Process-wide owner of MPI (Note [mpi ownership]). Thread-safe.
class MpiRuntime {
 public:
  /// Initialises MPI when nobody has (and arranges its finalisation at exit), then returns the
  /// runtime. Later calls return the same object. @throws BootstrapError when this build has no
  /// MPI or MPI was already finalised; BackendError when MPI_Init_thread fails.
  static MpiRuntime& acquire();

  /// True when MPI has been finalised (by us at exit or by the program): teardown paths check it
  /// before freeing MPI objects. False when built without MPI.
  static bool finalised() noexcept;

  /// Records that a collective of this process failed because a peer stalled (a TimeoutError,
  /// or a peer lost for want of heartbeats: stopped, hung or cut off) rather than died: libmwms
  /// then does not call MPI_Finalize at exit, which would wait for that peer (Note [no finalize
  /// after a stall]). Thread-safe, never throws, callable without MPI.
  static void note_peer_stalled() noexcept;

  /// This process's rank and size in MPI_COMM_WORLD.
  int world_rank() const noexcept { return world_rank_; }
  int world_size() const noexcept { return world_size_; }
  /// The thread level MPI provided (MPI_THREAD_* value), and whether libmwms initialised MPI.
  int thread_level() const noexcept { return thread_level_; }
  bool initialised_here() const noexcept { return initialised_here_; }
  /// True when MPI provides MPI_THREAD_MULTIPLE (no serialisation needed).
  bool thread_multiple() const noexcept { return thread_multiple_; }

  /// A lock to hold around libmwms's MPI calls (Note [mpi threading]): the process-wide mutex
  /// when MPI is not MPI_THREAD_MULTIPLE, an empty lock otherwise.
  std::unique_lock<std::mutex> serialise();

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  MpiRuntime() = default;
  int world_rank_ = 0;
  int world_size_ = 1;
  int thread_level_ = 0;
  bool initialised_here_ = false;
  bool thread_multiple_ = false;
  std::mutex call_mutex_;
};

}  // namespace mwms::bootstrap
