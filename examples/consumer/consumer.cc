// mwms_consumer: the smallest program built against an installed libmwms (examples/consumer).
// Resolves its cluster from the environment (TF_CONFIG, else mpirun, else one process), all-reduces
// a small buffer and checks every element: rank r contributes (r + 1) * (i + 1) at element i, so
// the sum is n(n+1)/2 * (i + 1) on n ranks. Prints the result; exits 1 on a wrong value or on an
// mwms::Error.
#include <mwms/mwms.h>

#include <cstddef>
#include <cstdio>
#include <memory>
#include <vector>

int main() {
  try {
    mwms::ResolvedCluster cluster = mwms::resolve_from_environment();
    std::unique_ptr<mwms::Communicator> comm = mwms::Communicator::create(cluster);
    const int rank = comm->rank();
    const int n = comm->world_size();
    std::vector<float> buffer(8);
    for (std::size_t i = 0; i < buffer.size(); ++i) {
      buffer[i] = static_cast<float>((rank + 1) * static_cast<int>(i + 1));
    }
    comm->all_reduce(buffer.data(), buffer.size(), mwms::DataType::kFloat32, mwms::ReduceOp::kSum);
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    int wrong = 0;
    for (std::size_t i = 0; i < buffer.size(); ++i) {
      if (buffer[i] != ranks_sum * static_cast<float>(i + 1)) ++wrong;
    }
    std::printf("mwms_consumer: libmwms %s, rank %d of %d, all_reduce sum = [%g %g ... %g]%s\n",
                MWMS_VERSION_STRING, rank, n, buffer.front(), buffer[1], buffer.back(),
                wrong == 0 ? "" : " WRONG");
    return wrong == 0 ? 0 : 1;
  } catch (const mwms::Error& e) {
    std::fprintf(stderr, "mwms_consumer: %s\n", e.what());
    return 1;
  }
}
