// Real processes started the way torchrun and srun start them (their variables, no TF_CONFIG):
// each resolves its cluster from the environment, all form one world and all-reduce the right
// value. A launcher that left each process alone would give world size 1 and the wrong sum.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <map>
#include <string>
#include <vector>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"

namespace {

using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using Vars = std::map<std::string, std::string>;

// In the child: the launcher's variables only, resolve, connect, all-reduce rank + 1.
void join_and_reduce(const Vars& vars, mwms::ClusterSource expected, mwms::TransportChoice transport,
                     const std::function<void(const std::string&)>& report) {
  for (const char* name : {"TF_CONFIG", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE",
                           "SLURM_PROCID", "SLURM_NTASKS"}) {
    ::unsetenv(name);
  }
  for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  mwms::ResolvedCluster cluster = mwms::resolve_from_environment();
  if (cluster.source != expected) throw std::runtime_error("resolved from another source");
  mwms::CommunicatorOptions options;
  options.connect_timeout_seconds = 30;
  options.timeout_seconds = 30;
  options.transport = transport;
  auto comm = mwms::Communicator::create(cluster, options);
  std::vector<std::int32_t> values(1000, comm->rank() + 1);
  comm->all_reduce(values.data(), values.size(), mwms::DataType::kInt32, mwms::ReduceOp::kSum);
  report("world " + std::to_string(comm->world_size()) + " rank " + std::to_string(comm->rank()) +
         " sum " + std::to_string(values.front()) + " last " + std::to_string(values.back()));
}

void expect_one_world(const std::vector<ChildResult>& results) {
  const int n = static_cast<int>(results.size());
  const int sum = n * (n + 1) / 2;
  for (const ChildResult& r : results) {
    INFO(mwms::testing::describe(results));
    CHECK(r.exit_code == 0);
    CHECK(r.output == "world " + std::to_string(n) + " rank " + std::to_string(r.rank) + " sum " +
                          std::to_string(sum) + " last " + std::to_string(sum) + "\n");
  }
}

}  // namespace

TEST_CASE("processes started with torchrun's variables form one world", "[tcp]") {
  for (int round = 0; round < 2; ++round) {
    // TCP links connect to the announced addresses; auto uses shared memory on one host.
    auto transport = round == 0 ? mwms::TransportChoice::kTcp : mwms::TransportChoice::kAuto;
    LaunchOptions options;
    options.world_size = 3;
    options.extra_ports = 1;  // MASTER_PORT
    auto results = mwms::testing::run_ranks(options, [&](int rank, const std::string&,
                                                         const auto& report) {
      const int port = mwms::testing::extra_ports().at(0);
      Vars vars{{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "3"},
                {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", "3"},
                {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
      join_and_reduce(vars, mwms::ClusterSource::kTorchrun, transport, report);
    });
    expect_one_world(results);
  }
}

TEST_CASE("processes started with srun's variables form one world", "[tcp]") {
  // Two consecutive free ports: task t listens at MWMS_SLURM_PORT_BASE + t.
  int base = 0;
  for (int attempt = 0; attempt < 20 && base == 0; ++attempt) {
    int candidate = mwms::testing::free_ports(1).at(0);
    int probe = mwms::testing::bind_any(candidate + 1);
    if (probe >= 0) {
      ::close(probe);
      base = candidate;
    }
  }
  REQUIRE(base > 0);
  LaunchOptions options;
  options.world_size = 2;
  auto results = mwms::testing::run_ranks(options, [&](int rank, const std::string&,
                                                       const auto& report) {
    Vars vars{{"SLURM_PROCID", std::to_string(rank)}, {"SLURM_NTASKS", "2"},
              {"SLURM_LOCALID", std::to_string(rank)}, {"SLURM_STEP_NODELIST", "localhost"},
              {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"MWMS_SLURM_PORT_BASE", std::to_string(base)}};
    join_and_reduce(vars, mwms::ClusterSource::kSlurm, mwms::TransportChoice::kTcp, report);
  });
  expect_one_world(results);
}

TEST_CASE("MWMS_SOCKET_IFNAME that matches no interface fails the ranks that advertise", "[tcp]") {
  // The children read MWMS_SOCKET_IFNAME first (ctest runs each test case in a fresh process, so
  // no earlier read in this process is inherited).
  LaunchOptions options;
  options.world_size = 2;
  options.extra_ports = 1;  // MASTER_PORT
  auto results = mwms::testing::run_ranks(options, [&](int rank, const std::string&,
                                                       const auto& report) {
    const int port = mwms::testing::extra_ports().at(0);
    ::setenv("MWMS_SOCKET_IFNAME", "=no-such-if0", 1);
    Vars vars{{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"},
              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
    mwms::CommunicatorOptions o;
    o.connect_timeout_seconds = 2;
    o.transport = mwms::TransportChoice::kTcp;
    auto comm = mwms::Communicator::create(mwms::resolve_from_environment(), o);
    report("connected");
  });
  INFO(mwms::testing::describe(results));
  CHECK(results[0].exit_code == 1);  // the leader: rank 1 never arrived
  CHECK_THAT(results[0].output, Catch::Matchers::Contains("never arrived"));
  CHECK(results[1].exit_code == 1);
  CHECK_THAT(results[1].output,
             Catch::Matchers::Contains("MWMS_SOCKET_IFNAME==no-such-if0 matches no interface") &&
                 Catch::Matchers::Contains("lo 127.0.0.1"));
}
