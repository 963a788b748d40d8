// The control plane's finalized notice (Note [finalize] in engine/control_plane.h): recorded when
// well formed, a PeerError naming the field when not; bounded (no payload is ever read).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "collective/engine/control_plane.h"
#include "collective/frame.h"

namespace {

using Catch::Matchers::Contains;
using mwms::collective::CollectiveKind;
using mwms::collective::ControlPlane;
using mwms::collective::FrameHeader;

// Rank 0 of a world of two whose control link to rank 1 is one end of a socket pair; the other
// end (returned) plays rank 1.
struct Pair {
  mwms::common::Socket peer;
  std::unique_ptr<ControlPlane> plane;
};

Pair make_pair() {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  REQUIRE(::fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
  std::vector<mwms::common::Socket> links(2);
  links[1] = mwms::common::Socket(sv[0]);
  mwms::collective::PeerNames names;
  names.addresses = {"a:1", "b:2"};
  names.tasks = {"worker 0", "worker 1"};
  Pair p;
  p.peer = mwms::common::Socket(sv[1]);
  p.plane = std::make_unique<ControlPlane>(0, std::move(links), names);
  return p;
}

FrameHeader finalized(int root, std::uint64_t seq) {
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kFinalized);
  h.root = root;
  h.seq = seq;
  return h;
}

void send(int fd, const FrameHeader& h) {
  REQUIRE(::write(fd, &h, sizeof h) == static_cast<ssize_t>(sizeof h));
}

}  // namespace

TEST_CASE("a finalized notice is recorded; a close after it is an orderly one",
          "[unit][collective]") {
  Pair p = make_pair();
  mwms::ErrorContext ctx;
  CHECK(p.plane->finalized_after(1) == -1);
  CHECK(p.plane->finalized_before(100) == -1);
  send(p.peer.fd(), finalized(1, 5));
  p.plane->poll(nullptr, 0, 1000, ctx);
  CHECK(p.plane->finalized_after(1) == 5);
  CHECK(p.plane->finalized_before(4) == -1);  // rank 1 completed seq 4
  CHECK(p.plane->finalized_before(5) == 1);   // and will never join seq 5
  CHECK_FALSE(p.plane->closed(1));
  p.peer = mwms::common::Socket();  // rank 1 exits
  p.plane->poll(nullptr, 0, 1000, ctx);
  CHECK(p.plane->closed(1));
  CHECK(p.plane->finalized_after(1) == 5);
}

TEST_CASE("a malformed finalized notice is a PeerError naming what is wrong",
          "[unit][collective]") {
  struct Bad {
    const char* what;
    FrameHeader header;
  };
  FrameHeader other_root = finalized(0, 5);
  FrameHeader payload = finalized(1, 5);
  payload.payload_bytes = 1u << 30;  // never read, never allocated
  FrameHeader step = finalized(1, 5);
  step.step = 3;
  FrameHeader seq = finalized(1, std::uint64_t{1} << 63);
  for (const Bad& bad : {Bad{"root is not the sender", other_root},
                         Bad{"payload_bytes is not 0", payload}, Bad{"step is not 0", step},
                         Bad{"seq is out of range", seq}}) {
    INFO(bad.what);
    Pair p = make_pair();
    send(p.peer.fd(), bad.header);
    try {
      p.plane->poll(nullptr, 0, 1000, mwms::ErrorContext{});
      FAIL("accepted");
    } catch (const mwms::PeerError& e) {
      CHECK_THAT(std::string(e.what()), Contains("malformed finalized notice"));
      CHECK_THAT(std::string(e.what()), Contains(bad.what));
      CHECK(e.context().peer_rank == 1);
    }
    CHECK(p.plane->finalized_after(1) == -1);
  }
}
