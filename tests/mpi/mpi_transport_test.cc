// The MPI transport under a real `mpirun` (tests/mpi/CMakeLists.txt runs this program with 2, 3
// and 4 ranks): every collective x a few dtypes and ops x counts {0, 1, 7, 1000003} with
// CommunicatorOptions::transport = kMpi, checked for exact values (inputs are small integers, so
// sums and products are exact) and for byte-identical results on every rank (an MPI_Allgather of
// a checksum). libmwms owns MPI here (nothing else initialises it): several communicators are
// created one after the other, which needs MPI to stay initialised between them, and mpirun
// fails the run if MPI is not finalised at exit.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/mpi_runtime.h"
#include "collective/transport/shm/shm_segment.h"
#include "kernels/reduce.h"
#include "mwms/mwms.h"
#include "support/values.h"

namespace {

using mwms::testing::input_value;
using mwms::testing::store;
using mwms::testing::load;

using mwms::DataType;
using mwms::ReduceOp;

const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt64,
                           DataType::kBFloat16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMean, ReduceOp::kProd};
const std::size_t kCounts[] = {0, 1, 7, 1000003};

using mwms::testing::reduced_value;

// Fails the case at the first element that differs from `want`.
void expect_values(const char* what, DataType t, ReduceOp op, const void* buf, std::size_t count,
                   const std::function<double(std::size_t)>& want) {
  const std::string mismatch = mwms::testing::first_mismatch(what, t, op, buf, count, want);
  if (!mismatch.empty()) FAIL(mismatch);
}

// FNV-1a over the bytes, compared across ranks through MPI itself (not through libmwms).
void expect_identical_everywhere(const char* what, const void* buf, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(buf);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
  REQUIRE(MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD) ==
          MPI_SUCCESS);
  for (std::uint64_t other : all) {
    if (other != h) FAIL(std::string(what) + ": the result differs between ranks");
  }
}

std::unique_ptr<mwms::Communicator> mpi_communicator(long long small_message_bytes,
                                                     std::size_t chunk_bytes = 0) {
  mwms::CommunicatorOptions copts;
  copts.transport = mwms::TransportChoice::kMpi;
  copts.timeout_seconds = 120;
  copts.small_message_bytes = small_message_bytes;
  copts.chunk_bytes = chunk_bytes;
  return mwms::Communicator::create(mwms::resolve_from_environment(), copts);
}

void check_all_reduce(mwms::Communicator& comm, DataType t, ReduceOp op, std::size_t count) {
  const int n = comm.world_size();
  std::vector<char> buf(count * mwms::dtype_size(t) + 1);
  for (std::size_t i = 0; i < count; ++i) store(t, buf.data(), i, input_value(comm.rank(), i, op));
  comm.all_reduce(buf.data(), count, t, op);
  expect_values("all_reduce", t, op, buf.data(), count,
                [&](std::size_t i) { return reduced_value(n, i, t, op); });
  expect_identical_everywhere("all_reduce", buf.data(), count * mwms::dtype_size(t));
}

void check_reduce_scatter(mwms::Communicator& comm, DataType t, ReduceOp op, std::size_t block) {
  const int n = comm.world_size();
  const std::size_t esize = mwms::dtype_size(t);
  std::vector<char> send(block * n * esize + 1), recv(block * esize + 1);
  for (std::size_t i = 0; i < block * n; ++i) store(t, send.data(), i, input_value(comm.rank(), i, op));
  comm.reduce_scatter(send.data(), recv.data(), block, t, op);
  const std::size_t first = block * static_cast<std::size_t>(comm.rank());
  expect_values("reduce_scatter", t, op, recv.data(), block,
                [&](std::size_t i) { return reduced_value(n, first + i, t, op); });
}

void check_all_gather(mwms::Communicator& comm, DataType t, std::size_t block) {
  const int n = comm.world_size();
  const std::size_t esize = mwms::dtype_size(t);
  std::vector<char> send(block * esize + 1), recv(block * n * esize + 1);
  for (std::size_t i = 0; i < block; ++i) store(t, send.data(), i, input_value(comm.rank(), i, ReduceOp::kSum));
  comm.all_gather(send.data(), recv.data(), block, t);
  expect_values("all_gather", t, ReduceOp::kSum, recv.data(), block * n, [&](std::size_t i) {
    return input_value(static_cast<int>(i / block), i % block, ReduceOp::kSum);
  });
  expect_identical_everywhere("all_gather", recv.data(), block * n * esize);
}

void check_broadcast(mwms::Communicator& comm, DataType t, std::size_t count, int root) {
  std::vector<char> buf(count * mwms::dtype_size(t) + 1);
  for (std::size_t i = 0; i < count; ++i) store(t, buf.data(), i, input_value(comm.rank(), i, ReduceOp::kSum));
  comm.broadcast(buf.data(), count, t, root);
  expect_values("broadcast", t, ReduceOp::kSum, buf.data(), count,
                [&](std::size_t i) { return input_value(root, i, ReduceOp::kSum); });
}

// Shared-memory segments this process holds: its mappings (/proc/self/maps) and open
// descriptors (/proc/self/fd) of a "mwms-shm" memfd (shm_segment.cc names them so).
int shm_segments_held() {
  int held = 0;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("mwms-shm") != std::string::npos) ++held;
  }
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), link_ec).string();
    if (target.find("mwms-shm") != std::string::npos) ++held;
  }
  return held;
}

}  // namespace

TEST_CASE("the MPI transport creates no shared-memory segment", "[mpi]") {
  // No link uses shm when MPI carries every pair: its segment (2 x MWMS_SHM_RING_BYTES per rank)
  // would only cost memory and start-up time.
  REQUIRE(shm_segments_held() == 0);
  const std::uint64_t created = mwms::collective::ShmSegment::created_count();
  auto comm = mpi_communicator(-1);
  // The segment would be freed again before create() returns (only peers opening it keep it):
  // the count says whether one was made at all, /proc below that none is left behind.
  CHECK(mwms::collective::ShmSegment::created_count() == created);
  std::vector<float> v(1000, 1.0f);
  comm->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  CHECK(v[0] == static_cast<float>(comm->world_size()));
  CHECK(shm_segments_held() == 0);
}

TEST_CASE("the MPI transport carries every collective", "[mpi]") {
  REQUIRE(mwms::bootstrap::launched_by_mpi());
  // The default selection (small all-reduces gathered) with the default 8 MiB MPI pieces; then
  // rings (and pipelines) only, with an explicit 64 KiB chunk, so that the 4 MB messages go in
  // dozens of pieces and wrap the staging ring (Note [mpi staging]) many times.
  const std::pair<long long, std::size_t> configs[] = {{-1, 0}, {0, 65536}};
  for (const auto& [small, chunk] : configs) {
    auto comm = mpi_communicator(small, chunk);
    INFO("world size " << comm->world_size() << ", small_message_bytes " << small
                       << ", chunk_bytes " << chunk);
    REQUIRE(comm->describe().find("mpi") != std::string::npos);
    // 80 MiB: more 8 MiB pieces per message (a ring block: 80 MiB / n) than the staging ring's
    // 2 slots, at every n <= 4.
    if (chunk == 0) check_all_reduce(*comm, DataType::kFloat32, ReduceOp::kSum, 20u << 20);
    for (DataType t : kTypes) {
      for (ReduceOp op : kOps) {
        for (std::size_t count : kCounts) {
          // The largest count once per dtype (sum) and once per op (float32): enough to cover
          // pieces, gating and windows without minutes of 4 ranks on 2 cores.
          if (count > 1000 && op != ReduceOp::kSum && t != DataType::kFloat32) continue;
          check_all_reduce(*comm, t, op, count);
          check_reduce_scatter(*comm, t, op, count);
        }
      }
      for (std::size_t count : kCounts) {
        check_all_gather(*comm, t, count);
        for (int root = 0; root < comm->world_size(); ++root) {
          if (count <= 1000 || root == comm->world_size() - 1) check_broadcast(*comm, t, count, root);
        }
      }
      comm->barrier();
    }
  }
  // libmwms initialised MPI (nobody else did) and keeps it until exit.
  mwms::bootstrap::MpiRuntime& mpi = mwms::bootstrap::MpiRuntime::acquire();
  CHECK(mpi.initialised_here());
  CHECK_FALSE(mwms::bootstrap::MpiRuntime::finalised());
}

TEST_CASE("async collectives over MPI from the progress thread", "[mpi]") {
  auto comm = mpi_communicator(-1);
  const int n = comm->world_size();
  std::vector<float> a(1000003), b(4097);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(input_value(comm->rank(), i, ReduceOp::kSum));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(comm->rank());
  auto wa = comm->all_reduce_async(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
  auto wb = comm->all_reduce_async(b.data(), b.size(), DataType::kFloat32, ReduceOp::kMax);
  wa->wait();
  wb->wait();
  expect_values("async all_reduce", DataType::kFloat32, ReduceOp::kSum, a.data(), a.size(),
                [&](std::size_t i) { return reduced_value(n, i, DataType::kFloat32, ReduceOp::kSum); });
  for (float v : b) REQUIRE(v == static_cast<float>(n - 1));
}

TEST_CASE("ranks ordered by TF_CONFIG differently from MPI map peers through the blobs", "[mpi]") {
  int mpi_rank = 0;
  int n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  // Rank 0 picks the ports; TF_CONFIG gives the MPI ranks in reverse order.
  int base = 0;
  if (mpi_rank == 0) base = 21000 + static_cast<int>(std::random_device{}() % 8000);
  REQUIRE(MPI_Bcast(&base, 1, MPI_INT, 0, MPI_COMM_WORLD) == MPI_SUCCESS);
  std::string workers;
  for (int i = 0; i < n; ++i) {
    workers += (i ? "," : "") + std::string("\"127.0.0.1:") + std::to_string(base + i) + "\"";
  }
  const int task = n - 1 - mpi_rank;
  const std::string tf_config = "{\"cluster\":{\"worker\":[" + workers +
                                "]},\"task\":{\"type\":\"worker\",\"index\":" +
                                std::to_string(task) + "}}";
  mwms::CommunicatorOptions copts;
  copts.transport = mwms::TransportChoice::kMpi;
  copts.timeout_seconds = 60;
  auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), copts);
  REQUIRE(comm->rank() == task);
  std::vector<std::int64_t> gathered(static_cast<std::size_t>(n));
  const std::int64_t mine = mpi_rank;
  comm->all_gather(&mine, gathered.data(), 1, DataType::kInt64);
  for (int r = 0; r < n; ++r) CHECK(gathered[static_cast<std::size_t>(r)] == n - 1 - r);
  check_all_reduce(*comm, DataType::kFloat32, ReduceOp::kSum, 1000003);
}

namespace mwms::testing {
long allocations();  // ../multiproc/alloc_counter.cc (counts operator new; MPI's malloc is not ours)
}  // namespace mwms::testing

TEST_CASE("steady-state collectives over MPI allocate nothing", "[mpi]") {
  auto comm = mpi_communicator(-1);
  const std::size_t n = static_cast<std::size_t>(comm->world_size());
  std::vector<float> big((1u << 20) * n), small(100 * n), out(1u << 20);
  auto round = [&] {
    comm->all_reduce(big.data(), big.size(), DataType::kFloat32, ReduceOp::kMean);
    comm->all_reduce(small.data(), 100, DataType::kFloat32, ReduceOp::kSum);
    comm->reduce_scatter(big.data(), out.data(), 1u << 20, DataType::kFloat32, ReduceOp::kSum);
    comm->all_gather(out.data(), big.data(), 1u << 20, DataType::kFloat32);
    comm->broadcast(small.data(), small.size(), DataType::kFloat32, /*root=*/0);
    comm->barrier();
  };
  round();  // grows the scratch buffers and plans once
  const long before = mwms::testing::allocations();
  for (int i = 0; i < 10; ++i) round();
  CHECK(mwms::testing::allocations() - before == 0);
}

TEST_CASE("a refused collective over MPI leaves the caller's buffers as they were", "[mpi]") {
  // Issue 20, item 2 (Note [accept before landing]): every rank passes the same bytes with
  // another dtype, so every rank's first envelope is refused and no rank may have written its
  // buffer, whatever the world size.
  const DataType kinds[] = {DataType::kFloat32, DataType::kFloat16, DataType::kFloat64,
                            DataType::kInt32, DataType::kBFloat16, DataType::kInt64};
  struct Case {
    const char* algorithm;
    std::size_t bytes;
    bool broadcast;
  };
  const Case cases[] = {{"rd", 64, false}, {"ring", 1 << 20, false}, {"", 4096, true},
                        {"", 1 << 20, true}};
  for (const Case& k : cases) {
    INFO("algorithm " << k.algorithm << " bytes " << k.bytes << " broadcast " << k.broadcast);
    mwms::CommunicatorOptions copts;
    copts.transport = mwms::TransportChoice::kMpi;
    copts.timeout_seconds = 30;
    copts.algorithm = k.algorithm;
    auto comm = mwms::Communicator::create(mwms::resolve_from_environment(), copts);
    const int rank = comm->rank();
    REQUIRE(comm->world_size() <= 6);
    const DataType dtype = kinds[rank];
    std::vector<unsigned char> buf(k.bytes);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(0x21 + (i + rank) % 64);
    const std::vector<unsigned char> before = buf;
    bool refused = false;
    try {
      if (k.broadcast) {
        comm->broadcast(buf.data(), k.bytes / mwms::dtype_size(dtype), dtype, 0);
      } else {
        comm->all_reduce(buf.data(), k.bytes / mwms::dtype_size(dtype), dtype, ReduceOp::kSum);
      }
    } catch (const mwms::CollectiveMismatchError&) {
      refused = true;
    } catch (const mwms::PeerError& e) {
      refused = std::string(e.what()).find("ranks called different collectives") != std::string::npos;
      if (!refused) FAIL(e.what());
    }
    // A broadcast's root only sends and may complete without hearing the refusals.
    CHECK((refused || (k.broadcast && rank == 0)));
    CHECK(buf == before);
  }
}
