// The ring link (shared memory, and the in-memory test transport): no payload byte lands at
// RecvSlot::landing before the runner accepted the envelope (Note [accept before landing] in
// transport/link.h), so a refused collective leaves the caller's buffer as it was.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "collective/frame.h"
#include "collective/transport/mem/mem_transport.h"

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
