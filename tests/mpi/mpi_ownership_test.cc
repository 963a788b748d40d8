// A program that initialises MPI itself before libmwms and finalises it after (Note [mpi
// ownership]): libmwms must use the program's MPI, never finalise it, and leave it usable. Run by
// CTest under mpirun; exits 0 when everything held, 1 with a message otherwise.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "bootstrap/mpi_runtime.h"
#include "mwms/mwms.h"

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "mpi_ownership_test: %s\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    return fail("MPI_Init_thread failed");
  }
  int rank = 0;
  int n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int status = 0;
  try {
    mwms::CommunicatorOptions copts;
    copts.transport = mwms::TransportChoice::kMpi;
    copts.timeout_seconds = 60;
    for (int round = 0; round < 2; ++round) {  // two communicators: MPI survives the first
      auto comm = mwms::Communicator::create(mwms::resolve_from_environment(), copts);
      std::vector<double> v(300007, static_cast<double>(rank + 1));
      comm->all_reduce(v.data(), v.size(), mwms::DataType::kFloat64, mwms::ReduceOp::kSum);
      for (double x : v) {
        if (x != n * (n + 1) / 2.0) status = fail("wrong all_reduce result");
      }
    }
    if (mwms::bootstrap::MpiRuntime::acquire().initialised_here()) {
      status = fail("libmwms claims to have initialised MPI, which the program did");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_ownership_test: %s\n", e.what());
    status = 1;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return fail("libmwms finalised MPI, which the program owns");
  // MPI still carries the program's own messages after libmwms is done with it.
  int sum = 0;
  const int one = 1;
  if (MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS || sum != n) {
    status = fail("MPI_Allreduce after libmwms failed");
  }
  MPI_Finalize();
  if (status == 0 && rank == 0) std::printf("mpi ownership: ok on %d ranks\n", n);
  return status;
}
