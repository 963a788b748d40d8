// The flat all-reduce (Note [flat all-reduce] in src/collective/algorithms/flat_all_reduce.cc)
// run by real PlanRunners over the in-memory transport, one thread per rank: every dtype and op in
// lines and staged, mismatches against flat and plan peers, a peer that moves on while another
// looks at its ring (Note [flat mismatch]), and the selector's rules.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective/algorithms/algorithms.h"
#include "collective/engine/flat_slots.h"
#include "collective/engine/plan_runner.h"
#include "collective/selector.h"
#include "collective/transport/mem/mem_transport.h"
#include "mwms/errors.h"
#include "support/threaded_world.h"
#include "support/values.h"

namespace {

using mwms::DataType;
using mwms::ReduceOp;
using mwms::testing::fill_expected;
using mwms::testing::fill_input;
using mwms::testing::kAllDtypes;
using mwms::testing::kAllOps;
using mwms::testing::RankState;
using mwms::testing::run_world;
namespace mc = mwms::collective;

}  // namespace

// Note [flat all-reduce]: counts on either side of a line boundary (Note [flat lines]: 48 bytes a
// line) and of the lines' limit, staged ones up to a whole set, and calls in a row, so that both
// sets of each protocol are reused.
TEST_CASE("the flat all-reduce of every dtype and op on 1..8 threaded ranks", "[unit]") {
  for (int n = 1; n <= 8; ++n) {
    INFO("world size " << n);
    run_world(n, 1 << 16, 4096, [&](RankState& st) {
      if (n == 1) return;                  // the engine never runs a collective of one rank
      if (!st.runner->has_flat_slots()) {  // no Catch assertion off the main thread
        st.failure = "the runner sees no flat slots over the in-memory links";
        return;
      }
      std::vector<char> buf, want;
      for (DataType t : kAllDtypes) {
        const std::size_t esize = mwms::dtype_size(t);
        const std::size_t most = mc::kFlatPayloadBytes / esize;
        // Staged (Note [flat staging]) above the lines: the first staged count, one whose
        // segments are uneven (4099 elements over n ranks) and the largest set.
        for (std::size_t count :
             {std::size_t{0}, std::size_t{1}, mc::kFlatLineData / esize - 1,
              mc::kFlatLineData / esize, mc::kFlatLineData / esize + 1, std::size_t{1000} / esize,
              most, most + 1, std::size_t{4099}, mc::kFlatStageBytes / esize}) {
          for (ReduceOp op : kAllOps) {
            const bool staged = count * esize > mc::kFlatPayloadBytes;
            if (staged && op != ReduceOp::kSum && op != ReduceOp::kMean && count > 4099) continue;
            fill_input(buf, st.rank, count, t, op);
            fill_expected(want, st.world_size, 0, count, t, op);
            st.run(mc::flat_all_reduce(), mc::CollectiveKind::kAllReduce, t, op, count, -1,
                   {buf.data(), buf.data()});
            st.expect("all_reduce", mc::flat_all_reduce(), t, op, count, buf.data(), want);
          }
        }
      }
    });
  }
}

// Note [flat mismatch]: ranks in different calls fail with CollectiveMismatchError, whether both
// are flat (their tags differ) or one runs a plan (it finds the other's slot, the other its frame).
TEST_CASE("a flat all-reduce beside another call: a mismatch on both threaded ranks", "[unit]") {
  for (int variant = 0; variant < 5; ++variant) {
    INFO("variant " << variant);
    std::vector<std::string> caught(2);
    run_world(2, 1 << 16, 4096, [&](RankState& st) {
      std::vector<float> buf(100000, 1.0f);
      const mc::Algorithm& other =
          variant == 2 ? mc::recursive_doubling_all_reduce() : mc::flat_all_reduce();
      const bool flat_side = st.rank == 0;
      // 0: counts 4 and 8; 1: dtypes differ; 2: flat against recursive doubling; 3: lines
      // against staged (Note [flat staging]); 4: two staged counts.
      const std::size_t counts[] = {8, 4, 1000, 100000, 99999};
      std::size_t count = flat_side || variant == 1 ? 4 : counts[variant];
      if (flat_side && variant == 4) count = 100000;
      const DataType t = !flat_side && variant == 1 ? DataType::kInt32 : DataType::kFloat32;
      try {
        st.run(flat_side ? mc::flat_all_reduce() : other, mc::CollectiveKind::kAllReduce, t,
               ReduceOp::kSum, count, -1,
               {reinterpret_cast<char*>(buf.data()), reinterpret_cast<char*>(buf.data())});
      } catch (const mwms::CollectiveMismatchError& e) {
        caught[static_cast<std::size_t>(st.rank)] = e.what();
      }
    });
    for (const std::string& what : caught) {
      INFO(what);
      CHECK(what.find("flat") != std::string::npos);
    }
  }
}

TEST_CASE("the selector takes the flat all-reduce over shared memory up to its limit", "[unit]") {
  mc::SelectorOptions opts;
  mc::SelectionInput in;
  in.topology.world_size = 4;
  in.topology.links = mc::find_transport("shm")->tuning;
  const std::size_t limit = in.topology.links.flat_max_bytes;
  REQUIRE(limit > 0);
  for (std::size_t bytes : {std::size_t{0}, std::size_t{4}, limit}) {
    in.bytes = bytes;
    CHECK(mc::select_algorithm(in, opts).algorithm == &mc::flat_all_reduce());
  }
  in.kind = mc::CollectiveKind::kBarrier;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::flat_all_reduce());
  in.kind = mc::CollectiveKind::kAllReduce;
  in.bytes = limit + 4;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::recursive_doubling_all_reduce());
  in.bytes = 4;
  opts.small_message_bytes = 0;  // MWMS_SMALL_MESSAGE_BYTES=0: no small-message path at all
  CHECK(mc::select_algorithm(in, opts).algorithm != &mc::flat_all_reduce());
  opts.small_message_bytes = 65536;
  in.topology.world_size = 17;  // beyond kFlatMaxRanks
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::recursive_doubling_all_reduce());
  in.topology.world_size = 4;
  in.topology.links = mc::find_transport("tcp")->tuning;  // no flat slots
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::recursive_doubling_all_reduce());
  in.topology.links = mc::find_transport("shm")->tuning;  // more ranks than cores: staged too
  in.topology.ranks_exceed_cores = true;
  in.bytes = mc::kFlatStageBytes;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::flat_all_reduce());
  in.bytes = mc::kFlatStageBytes + 4;
  CHECK(mc::select_algorithm(in, opts).algorithm != &mc::flat_all_reduce());
  in.topology.ranks_exceed_cores = false;
  in.bytes = 4;
  in.topology.links = mc::find_transport("tcp")->tuning;
  opts.forced = "flat";
  REQUIRE_THROWS_WITH(mc::select_algorithm(in, opts), Catch::Matchers::Contains("no flat slots"));
  in.topology.links = mc::find_transport("mem")->tuning;  // slots, never chosen unforced
  in.bytes = mc::kFlatStageBytes + 4;
  REQUIRE_THROWS_WITH(mc::select_algorithm(in, opts),
                      Catch::Matchers::Contains("larger than a flat staging set"));
  in.bytes = mc::kFlatStageBytes;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::flat_all_reduce());
  opts.forced = "";
  in.bytes = 4;
  CHECK(mc::select_algorithm(in, opts).algorithm == &mc::recursive_doubling_all_reduce());
}

namespace {

// Rank 0's link to rank 2, "preempted" once inside the look at the ring (Note [flat mismatch]):
// it waits there until rank 2's next frame is in the ring, as if rank 0 had lost the core
// between seeing rank 2 unpublished and peeking at its ring.
struct PreemptedLink final : mc::Link {
  mc::Link* inner;
  std::atomic<bool>* armed;
  std::atomic<bool>* released;
  PreemptedLink(mc::Link* l, std::atomic<bool>* a, std::atomic<bool>* r)
      : inner(l), armed(a), released(r) {}
  const mc::TransportCaps& caps() const noexcept override { return inner->caps(); }
  int peer() const noexcept override { return inner->peer(); }
  bool poll_send(mc::SendSlot& s) override { return inner->poll_send(s); }
  bool poll_recv(mc::RecvSlot& s) override { return inner->poll_recv(s); }
  mc::RecvView recv_view(const mc::RecvSlot& s) override { return inner->recv_view(s); }
  void recv_release(mc::RecvSlot& s, std::size_t b) override { inner->recv_release(s, b); }
  void wait(double m, bool s, bool r) override { inner->wait(m, s, r); }
  mc::Doorbell* doorbell() const noexcept override { return inner->doorbell(); }
  bool moved_since_poll(bool s, bool r) const noexcept override {
    return inner->moved_since_poll(s, r);
  }
  mc::FlatSlots flat_slots() const noexcept override { return inner->flat_slots(); }
  bool peek_envelope(mc::FrameHeader* out) const noexcept override {
    if (armed->exchange(false)) {
      released->store(true);
      const auto t0 = std::chrono::steady_clock::now();
      mc::FrameHeader h;
      while (!inner->peek_envelope(&h) &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
        std::this_thread::yield();
      }
    }
    return inner->peek_envelope(out);
  }
};

}  // namespace

// Found in review: rank 0 waits in flat call 2 for rank 1, sees rank 2 unpublished, and loses the
// core; rank 2 publishes, finishes the call and sends rank 0 the first frame of the ring
// all-reduce that every rank calls next. That frame is not a mismatch, and reading it must not
// consume it: every rank completes both calls with the right sums.
TEST_CASE("a peer that moves on past a flat call while another looks at its ring is no mismatch",
          "[unit]") {
  const int n = 3;
  mc::MemFabric fabric(n, 1 << 16);
  std::vector<std::vector<std::unique_ptr<mc::Link>>> links;
  for (int r = 0; r < n; ++r) links.push_back(fabric.links_of(r));
  std::atomic<bool> armed{false}, released{false};
  std::vector<std::string> failures(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::vector<mc::Link*> raw;
      for (auto& l : links[static_cast<std::size_t>(r)]) raw.push_back(l.get());
      PreemptedLink slow(raw[2] != nullptr ? raw[2] : raw[1], &armed, &released);
      if (r == 0) raw[2] = &slow;
      mc::RunnerOptions o;
      o.spin_seconds = 1e-6;  // reach the slow path at once
      o.yield_while_spinning = true;
      mc::PlanRunner runner(raw, nullptr, o);
      RankState st;
      st.rank = r;
      st.world_size = n;
      st.runner = &runner;
      std::vector<float> small(4), big(4096);
      auto run = [&](const mc::Algorithm& a, std::vector<float>& v) {
        for (float& x : v) x = static_cast<float>(r + 1);
        st.run(a, mc::CollectiveKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, v.size(), -1,
               {reinterpret_cast<char*>(v.data()), reinterpret_cast<char*>(v.data())});
        for (float x : v) {
          if (x != 6.0f && st.failure.empty())
            st.failure = "wrong sum after " + std::string(a.name());
        }
      };
      try {
        run(mc::flat_all_reduce(), small);  // k = 1, every rank alike
        if (r == 0) armed = true;
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        if (r == 2) {
          while (!released) std::this_thread::yield();
        }
        run(mc::flat_all_reduce(), small);  // k = 2
        run(mc::ring_all_reduce(), big);
      } catch (const std::exception& e) {
        released = true;
        st.failure = e.what();
      }
      failures[static_cast<std::size_t>(r)] = st.failure;
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& f : failures) {
    INFO(f);
    CHECK(f.empty());
  }
}

// communicator.h: a refused call leaves the buffers as they were. A flat rank checks every
// peer's identity before it reduces into its buffer, so even the ranks that agree with each
// other (0 and 1 here) refuse with their buffers intact when one peer (2) disagrees.
TEST_CASE("a flat call that one of three threaded ranks disagrees with changes no buffer",
          "[unit]") {
  for (std::size_t agreed : {std::size_t{4}, std::size_t{3000}, std::size_t{100000}}) {
    INFO(agreed << " floats on ranks 0 and 1");
    std::vector<std::string> outcome(3);
    run_world(3, 1 << 16, 4096, [&](RankState& st) {
      const std::size_t count = st.rank == 2 ? agreed + 1 : agreed;
      std::vector<float> buf(count, static_cast<float>(st.rank + 1));
      const std::vector<float> before = buf;
      try {
        st.run(mc::flat_all_reduce(), mc::CollectiveKind::kAllReduce, DataType::kFloat32,
               ReduceOp::kSum, count, -1,
               {reinterpret_cast<char*>(buf.data()), reinterpret_cast<char*>(buf.data())});
        outcome[static_cast<std::size_t>(st.rank)] = "not refused";
      } catch (const mwms::CollectiveMismatchError&) {
        outcome[static_cast<std::size_t>(st.rank)] = buf == before ? "refused" : "buffer changed";
      }
    });
    for (const std::string& o : outcome) CHECK(o == "refused");
  }
}
