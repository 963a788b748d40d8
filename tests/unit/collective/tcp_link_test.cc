// The TCP link's streams (Note [tcp stripes] in transport/tcp/tcp_link.h): payloads striped over
// K sockets arrive whole and in order, the prefix reported as arrived is always contiguous, the
// wire layout is the documented one, and the epoll wait descriptor wakes only for what is owed.
// Socket pairs stand in for TCP connections (sendmsg/recvmsg behave the same on both).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "collective/frame.h"
#include "collective/transport/tcp/tcp_link.h"

namespace {

using mwms::collective::FrameHeader;
using mwms::collective::RecvSlot;
using mwms::collective::SendSlot;
using mwms::collective::TcpLink;
using mwms::common::Socket;

// Two ends of K streams: a[i] talks to b[i].
struct Streams {
  std::vector<Socket> a, b;
};

Streams make_streams(int k) {
  Streams s;
  for (int i = 0; i < k; ++i) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    REQUIRE(::fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
    REQUIRE(::fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0);
    s.a.emplace_back(sv[0]);
    s.b.emplace_back(sv[1]);
  }
  return s;
}

FrameHeader header_for(std::size_t bytes, std::uint64_t seq) {
  FrameHeader h;
  h.seq = seq;
  h.payload_bytes = bytes;
  return h;
}

// Sends `data` from `tx` to `rx`, letting `step` more payload bytes out per round (the runner's
// gate), and checks after every receive poll that the arrived prefix is already correct.
void transfer(TcpLink& tx, TcpLink& rx, const std::vector<char>& data, std::uint64_t seq,
              std::size_t step) {
  const FrameHeader h = header_for(data.size(), seq);
  std::vector<char> landing(data.size() + 1, '\x7f');
  SendSlot send;
  send.start(&h, data.data(), data.size(), std::min(step, data.size()));
  RecvSlot recv;
  recv.start(landing.data(), data.size(), true);
  std::size_t last_arrived = 0;
  for (int round = 0; !(send.done && recv.done()); ++round) {
    REQUIRE(round < 1000000);
    tx.poll_send(send);
    send.ready = std::min(data.size(), send.ready + step);
    rx.poll_recv(recv);
    if (recv.header_arrived) recv.accepted = true;  // the runner's check (it matches here)
    REQUIRE(recv.arrived >= last_arrived);  // the prefix only grows
    REQUIRE(recv.arrived <= data.size());
    REQUIRE((recv.arrived == 0 || std::memcmp(landing.data(), data.data(), recv.arrived) == 0));
    last_arrived = recv.arrived;
    auto v = rx.recv_view(recv);
    rx.recv_release(recv, v.bytes);
  }
  CHECK(recv.header_arrived);
  CHECK(std::memcmp(&recv.header, &h, sizeof(h)) == 0);
  CHECK(landing.back() == '\x7f');  // nothing past the payload
}

}  // namespace

TEST_CASE("tcp link: payloads striped over several streams arrive whole and in order", "[unit]") {
  const std::size_t stripe = 4096;
  for (int k : {1, 2, 3, 4}) {
    Streams s = make_streams(k);
    TcpLink tx(1, std::move(s.a), stripe);
    TcpLink rx(0, std::move(s.b), stripe);
    std::uint64_t seq = 0;
    // Sizes around the stripe and the stream count, and one larger than the socket buffers
    // (short writes), back to back on the same streams.
    const std::size_t sizes[] = {0, 1, 63, stripe - 1, stripe, stripe + 1, 3 * stripe + 17,
                                 5 * stripe, (std::size_t{1} << 20) + 5};
    for (std::size_t bytes : sizes) {
      for (std::size_t step : {bytes + 1, stripe / 2 + 3}) {
        std::vector<char> data(bytes);
        for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131 + seq) % 251);
        INFO("streams " << k << " bytes " << bytes << " step " << step);
        transfer(tx, rx, data, ++seq, step);
      }
    }
  }
}

TEST_CASE("tcp link: stripe j travels on stream j mod K, the envelope on stream 0", "[unit]") {
  const std::size_t stripe = 64;
  Streams s = make_streams(2);
  int raw0 = s.b[0].fd(), raw1 = s.b[1].fd();
  TcpLink tx(1, std::move(s.a), stripe);
  std::vector<char> data(4 * stripe + 10);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 256);
  const FrameHeader h = header_for(data.size(), 7);
  SendSlot send;
  send.start(&h, data.data(), data.size(), data.size());
  while (!send.done) tx.poll_send(send);
  std::vector<char> got0(1024), got1(1024);
  ssize_t n0 = ::read(raw0, got0.data(), got0.size());
  ssize_t n1 = ::read(raw1, got1.data(), got1.size());
  // Stripes 0, 2, 4 (10 bytes) on stream 0 after the envelope; 1 and 3 on stream 1.
  REQUIRE(n0 == static_cast<ssize_t>(sizeof(FrameHeader) + 2 * stripe + 10));
  REQUIRE(n1 == static_cast<ssize_t>(2 * stripe));
  CHECK(std::memcmp(got0.data(), &h, sizeof(h)) == 0);
  const char* p0 = got0.data() + sizeof(h);
  CHECK(std::memcmp(p0, data.data(), stripe) == 0);
  CHECK(std::memcmp(p0 + stripe, data.data() + 2 * stripe, stripe) == 0);
  CHECK(std::memcmp(p0 + 2 * stripe, data.data() + 4 * stripe, 10) == 0);
  CHECK(std::memcmp(got1.data(), data.data() + stripe, stripe) == 0);
  CHECK(std::memcmp(got1.data() + stripe, data.data() + 3 * stripe, stripe) == 0);
}

TEST_CASE("tcp link: the epoll wait descriptor wakes for owed bytes only", "[unit]") {
  Streams s = make_streams(3);
  TcpLink tx(1, std::move(s.a), 64);
  TcpLink rx(0, std::move(s.b), 64);
  REQUIRE(rx.wait_events(POLLOUT) == POLLIN);  // an epoll set polls readable only
  auto ready = [&](TcpLink& l) {
    pollfd p{l.wait_fd(), l.wait_events(POLLIN), 0};
    return ::poll(&p, 1, 0) == 1;
  };
  std::vector<char> data(200, 'x'), landing(200);
  const FrameHeader h = header_for(data.size(), 1);
  RecvSlot recv;
  recv.start(landing.data(), data.size(), true);
  rx.poll_recv(recv);
  CHECK_FALSE(ready(rx));  // every stream owes bytes, none has any
  SendSlot send;
  send.start(&h, data.data(), data.size(), data.size());
  while (!send.done) tx.poll_send(send);
  CHECK(ready(rx));
  while (!recv.done()) {
    rx.poll_recv(recv);
    recv.accepted = recv.header_arrived;
    rx.recv_release(recv, rx.recv_view(recv).bytes);
  }
  // The next message is already in the sockets, but no receive is posted: no wake-up.
  send.start(&h, data.data(), data.size(), data.size());
  while (!send.done) tx.poll_send(send);
  CHECK_FALSE(ready(rx));
}

TEST_CASE("tcp link: no payload byte lands before the envelope is accepted", "[unit]") {
  // Note [accept before landing] (link.h), Note [tcp peek]: the whole message is in the sockets,
  // yet until the runner sets `accepted` the landing area stays as it was, on every stream.
  const std::size_t stripe = 4096;
  for (int k : {1, 3}) {
    Streams s = make_streams(k);
    TcpLink tx(1, std::move(s.a), stripe);
    TcpLink rx(0, std::move(s.b), stripe);
    std::uint64_t seq = 0;
    for (std::size_t bytes : {std::size_t{16}, std::size_t{5000}, std::size_t{20000},
                              3 * stripe + 100}) {
      INFO("streams " << k << " bytes " << bytes);
      std::vector<char> data(bytes), landing(bytes, '\x5a');
      for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i % 251 + 1);
      const FrameHeader h = header_for(bytes, ++seq);
      SendSlot send;
      send.start(&h, data.data(), bytes, bytes);
      RecvSlot recv;
      recv.start(landing.data(), bytes, true);
      for (int round = 0; round < 200 && !send.done; ++round) {
        tx.poll_send(send);
        rx.poll_recv(recv);  // never accepted in this loop
      }
      for (int round = 0; round < 10; ++round) rx.poll_recv(recv);
      REQUIRE(recv.header_arrived);
      CHECK(recv.arrived == 0);
      CHECK(std::count(landing.begin(), landing.end(), '\x5a') == static_cast<long>(bytes));
      recv.accepted = true;
      for (int round = 0; !(send.done && recv.done()); ++round) {
        REQUIRE(round < 100000);
        tx.poll_send(send);
        rx.poll_recv(recv);
        rx.recv_release(recv, rx.recv_view(recv).bytes);
      }
      CHECK(std::memcmp(landing.data(), data.data(), bytes) == 0);
    }
  }
}
