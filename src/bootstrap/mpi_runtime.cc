// MPI's one owner (Note [mpi ownership], Note [mpi threading] in mpi_runtime.h). Compiled only
// with MWMS_WITH_MPI; mpi_runtime_stub.cc otherwise.
#include "bootstrap/mpi_runtime.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/logging.h"

namespace mwms::bootstrap {

namespace {

std::mutex g_acquire_mutex;
MpiRuntime* g_runtime = nullptr;  // never destroyed: MPI objects may outlive static destructors

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown MPI thread level";
  }
}

std::atomic<bool> g_peer_stalled{false};

// Note [no finalize after a stall]: Open MPI's MPI_Finalize waits for every process of the job (a
// PMIx fence). After a peer died, that is fine: the runtime knows it is gone, and the survivors
// finalise and exit about a second after their PeerError. After a peer *stalled* (SIGSTOP, a
// debugger, a hung host: the survivors' TimeoutError, or a PeerError whose ErrorContext::cause is
// FailureCause::kStalled, set where a peer lost without heartbeats is noticed and carried by the
// abort relay to the ranks that hear of it from another) the fence would wait for as long as
// that peer stays stopped, and mpirun never returns. So after a stall a survivor exits without MPI_Finalize; mpirun then sees a process
// that exited without finalising and ends the rest of the job, killing any survivor that has
// not exited yet. A survivor therefore first waits 1 s, so that the others (which hear of the
// failure within milliseconds through the abort relay) report their own error before mpirun
// ends them. The process keeps its own exit status (MPI_Abort would replace it).
// Registered with std::atexit only when libmwms initialised MPI.
void finalise_at_exit() {
  if (g_peer_stalled.load(std::memory_order_acquire)) {
    MWMS_LOG_INFO(kInit, "exiting without MPI_Finalize: a peer stalled (Note [no finalize after "
                         "a stall])");
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool launched_by_mpi() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS || length <= 0) {
    return "MPI error " + std::to_string(rc);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

void throw_if_mpi(int rc, const std::string& what, ErrorContext context) {
  if (rc == MPI_SUCCESS) return;
  throw BackendError(what + " failed: " + mpi_error_text(rc) + " (MPI error " +
                         std::to_string(rc) + ")",
                     rc, std::move(context));
}

MpiRuntime& MpiRuntime::acquire() {
  std::lock_guard<std::mutex> lock(g_acquire_mutex);
  if (g_runtime != nullptr) {
    if (finalised()) throw BootstrapError("MPI was finalised; libmwms cannot use it any more");
    return *g_runtime;
  }
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw BootstrapError("MPI was already finalised by the program; libmwms cannot use it (create "
                         "communicators before MPI_Finalize)");
  }
  auto* rt = new MpiRuntime();
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      delete rt;
      throw_if_mpi(rc, "MPI_Init_thread");
    }
    rt->initialised_here_ = true;
    std::atexit(finalise_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  rt->thread_level_ = provided;
  rt->thread_multiple_ = provided == MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(MPI_COMM_WORLD, &rt->world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &rt->world_size_);
  if (provided < MPI_THREAD_SERIALIZED) {
    MWMS_LOG_WARN(kInit, "MPI provides " << level_name(provided)
                             << "; libmwms may call MPI from a communicator's progress thread "
                                "(initialise MPI with MPI_THREAD_SERIALIZED or higher)");
  }
  MWMS_LOG_DEBUG(kInit, "mpi " << (rt->initialised_here_ ? "initialised by libmwms" : "initialised by the program")
                               << ", " << level_name(provided) << ", world rank "
                               << rt->world_rank_ << " of " << rt->world_size_);
  g_runtime = rt;
  return *rt;
}

void MpiRuntime::note_peer_stalled() noexcept {
  g_peer_stalled.store(true, std::memory_order_release);
}

bool MpiRuntime::finalised() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::unique_lock<std::mutex> MpiRuntime::serialise() {
  if (thread_multiple_) return {};
  return std::unique_lock<std::mutex>(call_mutex_);
}

}  // namespace mwms::bootstrap
