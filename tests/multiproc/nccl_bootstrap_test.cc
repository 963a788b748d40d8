// Note [nccl unique id] over real processes: rank 0's NCCL unique id reaches every rank through
// our rendezvous (TF_CONFIG), and each rank creates its NCCL communicator with it. NCCL is the
// fake table (support/fake_nccl.h), so this runs without a GPU.
#include <catch2/catch.hpp>

#include <string>

#include "collective/device_communicator.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "support/fake_nccl.h"

TEST_CASE("the NCCL unique id of rank 0 reaches every rank through the rendezvous",
          "[tcp][multiproc][nccl]") {
  mwms::testing::LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 60;
  auto results = mwms::testing::run_ranks(opts, [](int rank, const std::string& tf_config,
                                                   const auto& report) {
    auto& world = mwms::testing::FakeNcclWorld::get();
    world.reset();
    mwms::CommunicatorOptions o;
    o.connect_timeout_seconds = 20;
    o.timeout_seconds = 10;
    o.implementation = mwms::Implementation::kNccl;
    auto comm = mwms::collective::create_device_communicator(
        mwms::resolve_tf_config(tf_config), o, &mwms::testing::fake_nccl_api(), nullptr);
    REQUIRE(comm->rank() == rank);
    REQUIRE(comm->world_size() == 3);
    REQUIRE(world.comms.size() == 1);
    report("init " + mwms::collective::to_hex(world.comms[0]->id));
    report(" made " + std::to_string(world.unique_ids.load()));
    report(" world " + std::to_string(world.comms[0]->world_size));
  });
  REQUIRE(results.size() == 3);
  INFO(mwms::testing::describe(results));
  const std::string first = results[0].output.substr(0, 5 + 256);
  CHECK(first.size() == 261);
  CHECK(first != "init " + std::string(256, '0'));
  for (const auto& r : results) {
    CHECK(r.exit_code == 0);
    CHECK(r.output.substr(0, 261) == first);  // every rank initialised with rank 0's id
    CHECK(r.output.find(" world 3") != std::string::npos);
    // Only rank 0 made an id.
    CHECK(r.output.find(r.rank == 0 ? " made 1" : " made 0") != std::string::npos);
  }
}

TEST_CASE("a failing ncclGetUniqueId on rank 0 fails every rank with NCCL's code",
          "[tcp][multiproc][nccl]") {
  mwms::testing::LaunchOptions opts;
  opts.world_size = 2;
  opts.timeout_seconds = 60;
  auto results = mwms::testing::run_ranks(opts, [](int rank, const std::string& tf_config,
                                                   const auto& report) {
    auto& world = mwms::testing::FakeNcclWorld::get();
    world.reset();
    if (rank == 0) world.fail("get_unique_id", mwms::collective::kNcclInvalidUsage);
    mwms::CommunicatorOptions o;
    o.connect_timeout_seconds = 20;
    o.timeout_seconds = 10;
    o.implementation = mwms::Implementation::kNccl;
    try {
      mwms::collective::create_device_communicator(mwms::resolve_tf_config(tf_config), o,
                                                   &mwms::testing::fake_nccl_api(), nullptr);
      report("created");
    } catch (const mwms::Error& e) {
      report(std::string("error: ") + e.what());
    }
  });
  REQUIRE(results.size() == 2);
  INFO(mwms::testing::describe(results));
  for (const auto& r : results) {
    CHECK(r.exit_code == 0);
    // Not a rendezvous timeout and not "no valid id": NCCL's own failure, on both ranks at once.
    CHECK(r.output.rfind("error: ", 0) == 0);
    CHECK(r.output.find(r.rank == 0 ? "ncclGetUniqueId" : "ncclGetUniqueId (rank 0)") !=
          std::string::npos);
  }
}
