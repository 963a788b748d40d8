// The ring link (shared memory, and the in-memory test transport): no payload byte lands at
// RecvSlot::landing before the runner accepted the envelope (Note [accept before landing] in
// transport/link.h), so a refused collective leaves the caller's buffer as it was.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collective/frame.h"
#include "collective/transport/mem/mem_transport.h"
#include "collective/transport/shm/shm_link.h"
#include "collective/transport/shm/shm_segment.h"

namespace mc = mwms::collective;

TEST_CASE("ring link: no payload byte lands before the envelope is accepted", "[unit]") {
  mc::MemFabric fabric(2, 1 << 16);
  auto from = fabric.links_of(0);
  auto to = fabric.links_of(1);
  mc::Link& tx = *from[1];
  mc::Link& rx = *to[0];
  std::uint64_t seq = 0;
  for (std::size_t bytes : {std::size_t{16}, std::size_t{4096}, std::size_t{20000}}) {
    for (bool land : {true, false}) {
      INFO("bytes " << bytes << " must_land " << land);
      std::vector<char> data(bytes), landing(bytes, '\x5a');
      for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i % 251 + 1);
      mc::FrameHeader h;
      h.seq = ++seq;
      h.payload_bytes = bytes;
      mc::SendSlot send;
      send.start(&h, data.data(), bytes, bytes);
      mc::RecvSlot recv;
      recv.start(landing.data(), bytes, land);
      for (int round = 0; round < 100 && !send.done; ++round) tx.poll_send(send);
      REQUIRE(send.done);  // the whole message is in the ring
      for (int round = 0; round < 10; ++round) rx.poll_recv(recv);
      REQUIRE(recv.header_arrived);
      CHECK(std::count(landing.begin(), landing.end(), '\x5a') == static_cast<long>(bytes));
      recv.accepted = true;
      std::vector<char> got;
      for (int round = 0; !recv.done(); ++round) {
        REQUIRE(round < 1000);
        rx.poll_recv(recv);
        mc::RecvView v = rx.recv_view(recv);
        got.insert(got.end(), v.data, v.data + v.bytes);
        rx.recv_release(recv, v.bytes);
      }
      REQUIRE(got.size() == bytes);
      CHECK(std::memcmp(got.data(), data.data(), bytes) == 0);
      if (land) CHECK(std::memcmp(landing.data(), data.data(), bytes) == 0);
    }
  }
}

// Note [doorbell]: the links of a rank share one doorbell, so a wait on several must re-check
// every one of them after announcing itself. A peer that produced on the second link before the
// announcement bumped nothing (nobody slept yet); a wait that re-checked only the first link slept
// until its cap (2 ms a time in MessageChannel: a synchronous ps step took 8 ms, not 0.5 ms).
TEST_CASE("ring link: a wait on several links sees a peer that moved on any of them",
          "[unit]") {
  mc::MemFabric fabric(3, 1 << 16);
  auto mine = fabric.links_of(0);
  auto one = fabric.links_of(1);
  auto two = fabric.links_of(2);
  REQUIRE(mine[1]->doorbell() != nullptr);
  REQUIRE(mine[1]->doorbell() == mine[2]->doorbell());
  mc::RecvSlot from1, from2;
  std::vector<char> landing(64);
  from1.start(landing.data(), 64, true);
  from2.start(landing.data(), 64, true);
  mine[1]->poll_recv(from1);
  mine[2]->poll_recv(from2);
  REQUIRE_FALSE(from2.header_arrived);
  // Nothing moved: the wait sleeps its whole cap.
  const mc::LinkWait both[] = {{mine[1].get(), false, true}, {mine[2].get(), false, true}};
  auto t0 = std::chrono::steady_clock::now();
  mc::wait_links(both, 2, 0.05);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= 0.04);
  // Rank 2 sends while rank 0 is not asleep: no doorbell bump, only its ring's head moves.
  mc::FrameHeader h;
  h.seq = 1;
  h.payload_bytes = 64;
  std::vector<char> data(64, 'x');
  mc::SendSlot send;
  send.start(&h, data.data(), 64, 64);
  for (int round = 0; round < 100 && !send.done; ++round) two[0]->poll_send(send);
  REQUIRE(send.done);
  // A wait on both links returns at once (a 5 s cap that the check would notice).
  t0 = std::chrono::steady_clock::now();
  mc::wait_links(both, 2, 5.0);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.0);
  mine[2]->poll_recv(from2);
  CHECK(from2.header_arrived);
  // A wait on the first link alone sleeps: rank 1 did not move.
  const mc::LinkWait first[] = {{mine[1].get(), false, true}};
  t0 = std::chrono::steady_clock::now();
  mc::wait_links(first, 1, 0.05);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= 0.04);
}

// The links a transport hands the runner wrap a RingLink (ShmLink here, MemLink for the
// in-memory transport): each must pass on the doorbell and the re-check, or wait_links() falls
// back to sleeping on one link (Note [doorbell]), and the flat slots (Note [flat slots]).
TEST_CASE("shm link: the rank's doorbell, the re-check and the flat areas reach the runner",
          "[unit]") {
  const std::string job = "ring-link-test";
  std::vector<std::shared_ptr<mc::ShmSegment>> seg;
  for (int r = 0; r < 3; ++r) seg.push_back(mc::ShmSegment::create(r, 3, 1 << 16, job));
  auto peer_view = [&](int owner) {
    return mc::ShmSegment::open(seg[static_cast<std::size_t>(owner)]->address(), owner, 3, job);
  };
  mc::TransportCaps caps;
  caps.name = "shm";
  // Rank 0's links to 1 and 2, and rank 2's link to 0.
  mc::ShmLink to1(0, 1, caps, seg[0], peer_view(1));
  mc::ShmLink to2(0, 2, caps, seg[0], peer_view(2));
  mc::ShmLink two(2, 0, caps, seg[2], peer_view(0));
  REQUIRE(to1.doorbell() == seg[0]->doorbell());
  REQUIRE(to2.doorbell() == seg[0]->doorbell());
  const mc::FlatSlots f = to2.flat_slots();
  CHECK(f.own == seg[0]->flat_area());
  CHECK(f.own_bell == seg[0]->doorbell());
  REQUIRE(f.peer != nullptr);
  // The peer's flat area is its owner's memory: what rank 2 writes there, rank 0 reads.
  two.flat_slots().own[100] = 'q';
  CHECK(f.peer[100] == 'q');
  mc::RecvSlot from1, from2;
  std::vector<char> landing(64);
  from1.start(landing.data(), 64, true);
  from2.start(landing.data(), 64, true);
  to1.poll_recv(from1);
  to2.poll_recv(from2);
  const mc::LinkWait both[] = {{&to1, false, true}, {&to2, false, true}};
  CHECK_FALSE(to2.moved_since_poll(false, true));
  mc::FrameHeader h;
  h.payload_bytes = 64;
  std::vector<char> data(64, 'x');
  mc::SendSlot send;
  send.start(&h, data.data(), 64, 64);
  for (int round = 0; round < 100 && !send.done; ++round) two.poll_send(send);
  REQUIRE(send.done);
  CHECK(to2.moved_since_poll(false, true));
  // peek_envelope shows the next envelope without consuming it (Note [flat mismatch]).
  mc::FrameHeader peeked;
  CHECK_FALSE(to1.peek_envelope(&peeked));
  REQUIRE(to2.peek_envelope(&peeked));
  REQUIRE(to2.peek_envelope(&peeked));
  const std::uint64_t peeked_bytes = peeked.payload_bytes;  // a packed field: copy, not bind
  CHECK(peeked_bytes == 64);
  const auto t0 = std::chrono::steady_clock::now();
  mc::wait_links(both, 2, 5.0);  // returns at once: rank 2 produced on the second link
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.0);
  to2.poll_recv(from2);  // the peeked envelope is still the next message
  CHECK(from2.header_arrived);
  const std::uint64_t got_bytes = from2.header.payload_bytes;
  CHECK(got_bytes == 64);
}
