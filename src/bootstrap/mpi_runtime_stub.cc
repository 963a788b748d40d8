// Built when libmwms has no MPI (MWMS_WITH_MPI=OFF): nothing can acquire MPI.
#include <cstdlib>

#include "bootstrap/mpi_runtime.h"

namespace mwms::bootstrap {

bool launched_by_mpi() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

std::string mpi_error_text(int rc) { return "MPI error " + std::to_string(rc); }

void throw_if_mpi(int rc, const std::string& what, ErrorContext context) {
  if (rc == 0) return;
  throw BackendError(what + " failed: " + mpi_error_text(rc), rc, std::move(context));
}

MpiRuntime& MpiRuntime::acquire() {
  throw BootstrapError("libmwms was built without MPI (MWMS_WITH_MPI=OFF)");
}

void MpiRuntime::note_peer_stalled() noexcept {}

bool MpiRuntime::finalised() noexcept { return false; }

std::unique_lock<std::mutex> MpiRuntime::serialise() { return {}; }

}  // namespace mwms::bootstrap
