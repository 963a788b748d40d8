// Endpoint exchange through MPI for jobs started by `mpirun` without TF_CONFIG. Compiled only when
// libmwms is built with MPI (mpi_exchange_stub.cc otherwise).
#include <mpi.h>

#include <string>
#include <vector>

#include "bootstrap/rendezvous.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

std::vector<std::string> mpi_allgather_strings(const std::string& mine) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw BootstrapError("MPI was already finalised; cannot exchange endpoints");
  // We only borrow MPI to exchange endpoints: if the program did not initialise it, we do, and
  // finalise again right away so that the program's own exit path is unchanged.
  bool own = !initialized;
  if (own) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) {
      throw BootstrapError("MPI_Init_thread failed while exchanging endpoints under mpirun");
    }
  }
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  constexpr int kSlot = 512;
  std::vector<char> send(kSlot, '\0');
  if (mine.size() >= kSlot) throw BootstrapError("endpoint too long: " + mine);
  mine.copy(send.data(), mine.size());
  std::vector<char> recv(static_cast<std::size_t>(kSlot) * static_cast<std::size_t>(size));
  int rc = MPI_Allgather(send.data(), kSlot, MPI_CHAR, recv.data(), kSlot, MPI_CHAR,
                         MPI_COMM_WORLD);
  if (own) MPI_Finalize();
  if (rc != MPI_SUCCESS) throw BootstrapError("MPI_Allgather of endpoints failed");
  std::vector<std::string> out;
  for (int i = 0; i < size; ++i) out.emplace_back(recv.data() + static_cast<std::size_t>(i) * kSlot);
  return out;
}

}  // namespace mwms::bootstrap
