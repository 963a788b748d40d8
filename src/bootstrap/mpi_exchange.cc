// Endpoint exchange through MPI for jobs started by `mpirun` without TF_CONFIG. Compiled only when
// libmwms is built with MPI (mpi_exchange_stub.cc otherwise). MPI is acquired from its one owner
// (Note [mpi ownership]) and stays initialised: the MPI transport may carry data later.
#include <mpi.h>

#include <string>
#include <vector>

#include "bootstrap/mpi_runtime.h"
#include "bootstrap/rendezvous.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

std::vector<std::string> mpi_allgather_strings(const std::string& mine) {
  MpiRuntime& mpi = MpiRuntime::acquire();
  const int size = mpi.world_size();
  constexpr int kSlot = 512;
  if (mine.size() >= kSlot) throw BootstrapError("endpoint too long: " + mine);
  std::vector<char> send(kSlot, '\0');
  mine.copy(send.data(), mine.size());
  std::vector<char> recv(static_cast<std::size_t>(kSlot) * static_cast<std::size_t>(size));
  {
    std::unique_lock<std::mutex> lock = mpi.serialise();
    // MPI_COMM_WORLD keeps the program's error handler (usually fatal); a code that does come
    // back is converted like every other MPI error.
    throw_if_mpi(MPI_Allgather(send.data(), kSlot, MPI_CHAR, recv.data(), kSlot, MPI_CHAR,
                               MPI_COMM_WORLD),
                 "MPI_Allgather of endpoints");
  }
  std::vector<std::string> out;
  for (int i = 0; i < size; ++i) out.emplace_back(recv.data() + static_cast<std::size_t>(i) * kSlot);
  return out;
}

}  // namespace mwms::bootstrap
