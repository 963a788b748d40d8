// The control plane's finalized notice (Note [finalize] in engine/control_plane.h): recorded when
// well formed, a PeerError naming the field when not; bounded (no payload is ever read). The
// heartbeat (Note [heartbeat]): a silent peer is lost and the next collective names it; a peer
// that keeps talking, finalized or sends no heartbeats by choice is not; an abort that arrives
// between collectives fails the next one.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
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

TEST_CASE("a finalized notice is recorded, and a close after it is an orderly one",
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

namespace {

FrameHeader heartbeat(int root, std::uint64_t interval_ms) {
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kHeartbeat);
  h.root = root;
  h.count = interval_ms;
  return h;
}

mwms::ErrorContext base_context() {
  mwms::ErrorContext ctx;
  ctx.rank = 0;
  ctx.world_size = 2;
  ctx.task = "worker 0";
  ctx.op = "heartbeat";
  return ctx;
}

mwms::ErrorContext call_context(std::int64_t seq) {
  mwms::ErrorContext ctx = base_context();
  ctx.op = "all_reduce";
  ctx.seq = seq;
  return ctx;
}

// What "rank 1" received: the number of heartbeat frames, each checked (root 0, the interval).
int read_heartbeats(int fd, std::uint64_t interval_ms) {
  int n = 0;
  FrameHeader h;
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 0) > 0 && ::read(fd, &h, sizeof h) == static_cast<ssize_t>(sizeof h)) {
    // Copies: FrameHeader is packed, and Catch binds references to what it compares.
    const std::uint8_t kind = h.kind;
    const std::int32_t root = h.root;
    const std::uint64_t count = h.count;
    CHECK(kind == static_cast<std::uint8_t>(CollectiveKind::kHeartbeat));
    CHECK(root == 0);
    CHECK(count == interval_ms);
    ++n;
  }
  return n;
}

// The next collective's check (EngineBackend::run): empty when nothing was found.
std::string next_collective(ControlPlane& plane) {
  auto hold = plane.hold();
  try {
    plane.throw_if_failed(call_context(7));
  } catch (const mwms::PeerError& e) {
    CHECK(e.context().peer_rank == 1);
    CHECK(e.context().seq == 7);
    return e.what();
  }
  return "";
}

// The FailureCause in the next collective's error (kUnknown when nothing was found, too).
mwms::FailureCause next_cause(ControlPlane& plane) {
  auto hold = plane.hold();
  try {
    plane.throw_if_failed(call_context(7));
  } catch (const mwms::Error& e) {
    return e.context().cause;
  }
  return mwms::FailureCause::kUnknown;
}

}  // namespace

TEST_CASE("heartbeat: a silent peer is lost and the next collective fails naming it",
          "[unit][collective][heartbeat]") {
  Pair p = make_pair();
  p.plane->start_heartbeat(0.05, base_context());  // lost after 4 x 50 ms of silence
  const auto start = std::chrono::steady_clock::now();
  std::string failure;
  while (failure.empty() && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    failure = next_collective(*p.plane);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(failure);
  CHECK(seconds >= 0.2);  // never before 4 intervals
  CHECK_THAT(failure, Contains("rank 1 (worker 1, b:2) sent nothing on its control connection"));
  CHECK_THAT(failure, Contains("before all_reduce seq 7"));
  CHECK(next_collective(*p.plane) == failure);  // stays failed
  // Note [no finalize after a stall] reads this, not the text.
  CHECK(next_cause(*p.plane) == mwms::FailureCause::kStalled);
  p.plane->stop_heartbeat();
  CHECK(read_heartbeats(p.peer.fd(), 50) >= 4);  // the first one at once, then one per interval
}

TEST_CASE("heartbeat: a peer that keeps sending, finalized or sends none is never lost",
          "[unit][collective][heartbeat]") {
  for (const char* how : {"heartbeats", "finalized", "interval 0"}) {
    INFO(how);
    Pair p = make_pair();
    p.plane->start_heartbeat(0.1, base_context());  // lost after 0.4 s of silence
    if (std::strcmp(how, "finalized") == 0) send(p.peer.fd(), finalized(1, 3));
    if (std::strcmp(how, "interval 0") == 0) send(p.peer.fd(), heartbeat(1, 0));
    for (int i = 0; i < 30; ++i) {  // 1.5 s: several times the loss threshold
      if (std::strcmp(how, "heartbeats") == 0) send(p.peer.fd(), heartbeat(1, 100));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      read_heartbeats(p.peer.fd(), 100);  // keep rank 0's sends flowing
    }
    CHECK(next_collective(*p.plane).empty());
    auto hold = p.plane->hold();
    CHECK_FALSE(p.plane->lost(1));
  }
}

TEST_CASE("heartbeat: an abort that arrives between collectives fails the next one at once",
          "[unit][collective][heartbeat]") {
  Pair p = make_pair();
  p.plane->start_heartbeat(0.05, base_context());
  const std::string reason = "loss is NaN";
  FrameHeader h;
  h.kind = static_cast<std::uint8_t>(CollectiveKind::kAbort);
  h.root = 1;
  h.payload_bytes = reason.size();
  send(p.peer.fd(), h);
  REQUIRE(::write(p.peer.fd(), reason.data(), reason.size()) ==
          static_cast<ssize_t>(reason.size()));
  std::string failure;
  for (int i = 0; i < 200 && failure.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    failure = next_collective(*p.plane);
  }
  CHECK_THAT(failure, Contains("rank 1 failed: loss is NaN"));
  CHECK_THAT(failure, !Contains("sent nothing"));
}

TEST_CASE("an abort carries the failing rank's FailureCause to the relayed error",
          "[unit][collective][heartbeat]") {
  struct Case {
    std::uint8_t sent;
    mwms::FailureCause expected;
  };
  for (const Case& c : {Case{0, mwms::FailureCause::kUnknown}, Case{1, mwms::FailureCause::kDied},
                        Case{2, mwms::FailureCause::kStalled},
                        Case{9, mwms::FailureCause::kUnknown}}) {  // a value it does not know
    INFO("sent " << int{c.sent});
    Pair p = make_pair();
    const std::string reason = "rank 2 sent nothing on its control connection";
    FrameHeader h;
    h.kind = static_cast<std::uint8_t>(CollectiveKind::kAbort);
    h.root = 1;
    h.dtype = c.sent;
    h.payload_bytes = reason.size();
    send(p.peer.fd(), h);
    REQUIRE(::write(p.peer.fd(), reason.data(), reason.size()) ==
            static_cast<ssize_t>(reason.size()));
    try {
      p.plane->poll(nullptr, 0, 1000, call_context(3));
      FAIL("no error");
    } catch (const mwms::PeerError& e) {
      CHECK_THAT(std::string(e.what()), Contains("rank 1 failed: " + reason));
      CHECK(e.context().cause == c.expected);
    }
  }
}

TEST_CASE("heartbeat: a malformed heartbeat is a PeerError", "[unit][collective][heartbeat]") {
  Pair p = make_pair();
  send(p.peer.fd(), heartbeat(0, 100));  // root is not the sender
  CHECK_THROWS_WITH(p.plane->poll(nullptr, 0, 1000, mwms::ErrorContext{}),
                    Contains("malformed heartbeat (root is not the sender"));
}

TEST_CASE("stall blame follows the wait chain across collectives and forgets a cleared wait",
          "[unit][collective]") {
  // Note [stall blame]: rank 1 of 3 waits in seq 6 for rank 0, which is still in seq 5 waiting
  // for rank 2 (it sent rank 1 its last bytes of seq 5 before rank 2 stopped). Rank 1 must name
  // rank 2, the end of the chain; before, edges of another seq were not followed and rank 1
  // named rank 0 (issue 20, item 4).
  int a[2], b[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, a) == 0);
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, b) == 0);
  REQUIRE(::fcntl(a[0], F_SETFL, O_NONBLOCK) == 0);
  REQUIRE(::fcntl(b[0], F_SETFL, O_NONBLOCK) == 0);
  std::vector<mwms::common::Socket> links(3);
  links[0] = mwms::common::Socket(a[0]);
  links[2] = mwms::common::Socket(b[0]);
  mwms::common::Socket rank0(a[1]), rank2(b[1]);
  mwms::collective::PeerNames names;
  names.addresses = {"a:1", "b:2", "c:3"};
  names.tasks = {"worker 0", "worker 1", "worker 2"};
  ControlPlane plane(1, std::move(links), names);
  mwms::ErrorContext ctx;
  auto notice = [](int waiter, int waited, std::uint64_t seq) {
    FrameHeader h;
    h.kind = static_cast<std::uint8_t>(CollectiveKind::kStallNotice);
    h.step = waiter;
    h.root = waited;
    h.seq = seq;
    return h;
  };
  CHECK(plane.blame(0) == 0);  // nothing heard: the rank waited for
  send(rank0.fd(), notice(0, 2, 5));
  plane.poll(nullptr, 0, 1000, ctx);
  CHECK(plane.blame(0) == 2);
  // A notice about rank 0 sent by rank 2 is not believed: only a rank's own notice moves its edge.
  send(rank2.fd(), notice(0, 1, 5));
  plane.poll(nullptr, 0, 1000, ctx);
  CHECK(plane.blame(0) == 2);
  // Rank 0 moves again: its wait is over, and an old edge must not blame rank 2 later.
  send(rank0.fd(), notice(0, -1, 5));
  plane.poll(nullptr, 0, 1000, ctx);
  CHECK(plane.blame(0) == 0);
  // A chain that comes back to this rank stops before it: rank 1 never blames itself.
  send(rank0.fd(), notice(0, 2, 7));
  send(rank2.fd(), notice(2, 1, 7));
  plane.poll(nullptr, 0, 1000, ctx);
  plane.poll(nullptr, 0, 1000, ctx);
  CHECK(plane.blame(0) == 2);
}
