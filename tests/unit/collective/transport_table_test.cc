// The transport table (Note [transport table]): what it lists, how auto and a forced transport
// choose from it, and the in-memory transport connected through it like any other.
#include <catch2/catch.hpp>

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "collective/backend/engine_backend.h"
#include "collective/transport/mem/mem_transport.h"
#include "collective/transport/transport.h"
#include "mwms/errors.h"

namespace mc = mwms::collective;
using Catch::Matchers::Contains;
using mwms::DataType;
using mwms::ReduceOp;

namespace {

mwms::bootstrap::PeerInfo peer(int rank, const std::string& host, const std::string& transport,
                               std::vector<std::string> blobs) {
  mwms::bootstrap::PeerInfo p;
  p.rank = rank;
  p.address = "10.0.0." + std::to_string(rank) + ":5000";
  p.host_id = host;
  p.transport = transport;
  for (const std::string& b : blobs) p.blobs[b] = b == "tcp" ? "{\"streams\":1}" : "x";
  return p;
}

}  // namespace

TEST_CASE("the transport table lists every transport once, with what auto and users may pick",
          "[unit]") {
  std::vector<std::string> names;
  for (const mc::TransportEntry& e : mc::transport_table()) {
    names.emplace_back(e.name);
    CHECK(mc::find_transport(e.name) == &e);
    CHECK(e.create != nullptr);
    CHECK(e.cannot_connect != nullptr);
  }
  CHECK(names == std::vector<std::string>{"tcp", "shm", "mpi", "mem"});
  CHECK(mc::find_transport("shm")->priority > mc::find_transport("tcp")->priority);
  CHECK(mc::find_transport("tcp")->automatic);
  CHECK(mc::find_transport("shm")->automatic);
  CHECK_FALSE(mc::find_transport("mpi")->automatic);   // only when MWMS_TRANSPORT=mpi
  CHECK_FALSE(mc::find_transport("mem")->automatic);
  CHECK_FALSE(mc::find_transport("mem")->user_selectable);  // threads of one process: tests
  CHECK(mc::find_transport("udp") == nullptr);
  CHECK(mc::transport_choices() == "auto|tcp|shm|mpi");
  for (const char* ok : {"auto", "tcp", "shm", "mpi"}) CHECK_NOTHROW(mc::check_transport_choice(ok));
  REQUIRE_THROWS_WITH(mc::check_transport_choice("udp"),
                      Contains("MWMS_TRANSPORT=udp is not one of auto|tcp|shm|mpi"));
  REQUIRE_THROWS_AS(mc::check_transport_choice("mem"), mwms::InvalidArgument);
  // The selector's thresholds are the entries' (Note [selector thresholds]).
  CHECK(mc::find_transport("shm")->tuning.small_message_max_bytes == 8192);
  CHECK(mc::find_transport("mpi")->tuning.pair_exchange_max_bytes == std::size_t{2} << 20);
  CHECK_FALSE(mc::find_transport("mpi")->tuning.two_rank_ring);
  CHECK(mc::find_transport("tcp")->tuning.rabenseifner_max_bytes == 0);  // the defaults
}

TEST_CASE("auto gives each pair the highest-priority transport both ends can use", "[unit]") {
  // Ranks 0 and 1 share host A (both offer shm), rank 2 is on host B, rank 3 on A without shm.
  std::vector<mwms::bootstrap::PeerInfo> peers{
      peer(0, "A", "auto", {"tcp", "shm"}), peer(1, "A", "auto", {"tcp", "shm"}),
      peer(2, "B", "auto", {"tcp", "shm"}), peer(3, "A", "auto", {"tcp"})};
  for (int r = 0; r < 4; ++r) {
    std::vector<const mc::TransportEntry*> got = mc::choose_transports(r, peers);
    REQUIRE(got.size() == 4);
    CHECK(got[static_cast<std::size_t>(r)] == nullptr);
    for (int p = 0; p < 4; ++p) {
      if (p == r) continue;
      const bool shm = (r == 0 && p == 1) || (r == 1 && p == 0);
      INFO("rank " << r << " peer " << p);
      CHECK(std::string(got[static_cast<std::size_t>(p)]->name) == (shm ? "shm" : "tcp"));
    }
  }
  peers[2].blobs.erase("tcp");  // nothing connects rank 2 and the others
  REQUIRE_THROWS_WITH(mc::choose_transports(0, peers),
                      Contains("no transport connects rank 0 and rank 2") &&
                          Contains("shm: rank 2 (10.0.0.2:5000) is on another host") &&
                          Contains("tcp: rank 2 (10.0.0.2:5000) offers no TCP links"));
}

TEST_CASE("a forced transport is every pair's or an error naming the pair", "[unit]") {
  std::vector<mwms::bootstrap::PeerInfo> peers{peer(0, "A", "shm", {"shm"}),
                                               peer(1, "B", "shm", {"shm"})};
  REQUIRE_THROWS_WITH(mc::choose_transports(0, peers),
                      Contains("transport shm was asked for") &&
                          Contains("rank 1 (10.0.0.1:5000) is on another host than rank 0"));
  peers[1].host_id = "A";
  CHECK(std::string(mc::choose_transports(0, peers)[1]->name) == "shm");
  peers[1].blobs.clear();
  REQUIRE_THROWS_WITH(mc::choose_transports(0, peers),
                      Contains("rank 1 has shared memory disabled (MWMS_SHM_DISABLE=1)"));
  std::vector<mwms::bootstrap::PeerInfo> mpi{peer(0, "A", "mpi", {"mpi"}),
                                             peer(1, "B", "mpi", {})};
  REQUIRE_THROWS_WITH(mc::choose_transports(1, mpi), Contains("rank 1 has no MPI link"));
  mpi[1].transport = "tcp";
  REQUIRE_THROWS_WITH(mc::choose_transports(0, mpi),
                      Contains("uses transport tcp but rank 0 uses mpi") &&
                          Contains("must be the same on every rank"));
}

TEST_CASE("the in-memory transport connects threads through the table and all-reduces",
          "[unit]") {
  // Every step goes through the table, as communicator_factory.cc does for a job: the entry
  // creates each rank's transport, its blob is published, choose_transports picks the entry for
  // every pair and the transport connects them; then the engine runs an all-reduce over them.
  constexpr int kRanks = 3;
  const mc::TransportEntry* entry = mc::find_transport("mem");
  REQUIRE(entry != nullptr);
  std::vector<std::unique_ptr<mc::Transport>> transports;
  std::vector<mwms::bootstrap::PeerInfo> peers;
  for (int r = 0; r < kRanks; ++r) {
    mc::TransportOptions topts;
    topts.rank = r;
    topts.world_size = kRanks;
    topts.chunk_bytes = 4096;
    topts.job_fingerprint = "transport table test";
    transports.push_back(entry->create(topts));
    REQUIRE(transports.back() != nullptr);
    REQUIRE(std::string(transports.back()->caps().name) == "mem");
    mwms::bootstrap::PeerInfo p = peer(r, "A", "mem", {});
    p.blobs["mem"] = transports.back()->local_address();
    peers.push_back(p);
  }
  std::vector<std::vector<float>> results(kRanks);
  std::vector<std::exception_ptr> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::vector<const mc::TransportEntry*> chosen = mc::choose_transports(r, peers);
        std::vector<int> to;
        for (int p = 0; p < kRanks; ++p) {
          if (p != r) {
            if (chosen[static_cast<std::size_t>(p)] != entry) throw std::runtime_error("not mem");
            to.push_back(p);
          }
        }
        mc::ConnectContext ctx;
        ctx.rank = r;
        ctx.world_size = kRanks;
        ctx.peers = &peers;
        ctx.deadline = mwms::common::deadline_after(10);
        std::vector<std::unique_ptr<mc::Link>> got =
            transports[static_cast<std::size_t>(r)]->connect(to, ctx);
        std::vector<std::unique_ptr<mc::Link>> links(kRanks);
        for (std::size_t i = 0; i < to.size(); ++i) {
          links[static_cast<std::size_t>(to[i])] = std::move(got[i]);
        }
        mc::EngineOptions eo;
        eo.topology.world_size = kRanks;
        eo.runner.chunk_bytes = 4096;
        eo.runner.yield_while_spinning = true;  // more threads than cores
        mc::EngineBackend engine(r, std::move(links), nullptr, eo);
        const std::size_t count = 10000;  // several chunks per step
        std::vector<float>& v = results[static_cast<std::size_t>(r)];
        v.assign(count, 0.0f);
        for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * (i % 7));
        mc::CollectiveArgs args;
        args.call = {mc::CollectiveKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, count,
                     -1, 0, r, kRanks, 0};
        args.buffers = {reinterpret_cast<const char*>(v.data()), reinterpret_cast<char*>(v.data())};
        engine.run(args, mwms::ErrorContext{});
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  transports.clear();  // the links keep their fabric
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<float>& v = results[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < v.size(); ++i) {
      REQUIRE(v[i] == static_cast<float>(6 * (i % 7)));  // (1 + 2 + 3) x (i mod 7)
    }
  }
}
