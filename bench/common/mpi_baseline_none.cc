// Built when libmwms is configured without MPI (MWMS_WITH_MPI=OFF): --compare mpi is refused with
// this explanation instead of being silently ignored.
#include <cstdlib>

#include "common/mpi_baseline.h"
#include "mwms/errors.h"

namespace mwms::bench::mpi {

namespace {
const char* const kNoMpi = "this build has no MPI (configured with MWMS_WITH_MPI=OFF)";
}  // namespace

bool built_with_mpi() { return false; }
void init(bool) { throw BackendError(kNoMpi, 0); }
bool active() { return false; }
int world_size() { return 0; }
void finalize() noexcept {}
void abort_job(int status) noexcept { std::exit(status); }
void progress() { throw BackendError(kNoMpi, 0); }
std::string library_version() { return {}; }
std::string unsupported_reason(DataType, ReduceOp) { return kNoMpi; }
void all_reduce(void*, std::size_t, DataType, ReduceOp) { throw BackendError(kNoMpi, 0); }
void all_gather(void*, std::size_t, DataType) { throw BackendError(kNoMpi, 0); }
void reduce_scatter(void*, std::size_t, DataType, ReduceOp) { throw BackendError(kNoMpi, 0); }
void broadcast(void*, std::size_t, DataType, int) { throw BackendError(kNoMpi, 0); }

}  // namespace mwms::bench::mpi
