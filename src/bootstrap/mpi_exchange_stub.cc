// Built when libmwms has no MPI: an mpirun job without TF_CONFIG cannot exchange endpoints.
#include "bootstrap/rendezvous.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

std::vector<std::string> mpi_allgather_strings(const std::string&) {
  throw BootstrapError(
      "started under mpirun without TF_CONFIG, but libmwms was built without MPI "
      "(MWMS_WITH_MPI=OFF): set TF_CONFIG for every process or rebuild with MPI");
}

}  // namespace mwms::bootstrap
