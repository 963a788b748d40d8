// MessageChannel's receive sink and gated sends (Note [receive sink], Note [link messages]) over
// the in-memory transport, both ends driven from one thread: tiny rings and payloads released a
// few odd bytes at a time make the link's views end inside a float and wrap around the ring, so
// every path of the sink (whole units from the link, units gathered in the landing area) runs.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collective/engine/message_channel.h"
#include "collective/transport/mem/mem_transport.h"
#include "mwms/errors.h"

namespace {

namespace mc = mwms::collective;

struct Recorder final : mc::RecvSink {
  std::vector<char> got;
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  bool refuse = false;
  void on_envelope(const mc::FrameHeader& h) override {
    if (refuse) throw mwms::PeerError("refused kind " + std::to_string(h.kind), {});
  }
  void consume(std::size_t offset, const char* data, std::size_t bytes) override {
    calls.emplace_back(offset, bytes);
    got.insert(got.end(), data, data + bytes);
  }
  std::size_t unit() const noexcept override { return sizeof(float); }
};

struct Pair {
  mc::MemFabric fabric;
  std::vector<std::unique_ptr<mc::Link>> l0, l1;
  std::unique_ptr<mc::MessageChannel> a, b;  // rank 0 sends, rank 1 receives
  explicit Pair(std::size_t ring) : fabric(2, ring) {
    l0 = fabric.links_of(0);
    l1 = fabric.links_of(1);
    a = std::make_unique<mc::MessageChannel>(std::vector<mc::Link*>{nullptr, l0[1].get()},
                                             nullptr, mc::RunnerOptions{});
    b = std::make_unique<mc::MessageChannel>(std::vector<mc::Link*>{l1[0].get(), nullptr},
                                             nullptr, mc::RunnerOptions{});
  }
  void pump(int rounds) {
    const mwms::ErrorContext c;
    for (int i = 0; i < rounds; ++i) {
      a->pump(c);
      b->pump(c);
    }
  }
};

std::vector<char> payload(std::size_t bytes) {
  std::vector<char> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<char>(i * 7 + 3);
  return v;
}

}  // namespace

TEST_CASE("message channel: a sink gets every byte once, in order, in whole floats",
          "[unit]") {
  for (std::size_t step : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{4096}}) {
    INFO("released " << step << " bytes at a time");
    Pair p(192);  // smaller than the message: views wrap around the ring
    const std::vector<char> data = payload(4 * 1001);
    std::vector<char> landing(data.size());
    Recorder sink;
    mc::FrameHeader h;
    h.kind = 0x46;
    const std::uint64_t ticket = p.a->queue_send(1, h, data.data(), data.size(), 0);
    p.b->start_recv(0, landing.data(), landing.size(), &sink);
    for (std::size_t ready = 0; ready < data.size();) {
      ready = std::min(data.size(), ready + step);
      p.a->set_ready(1, ticket, ready);
      p.pump(4);
      // Never more than was allowed out, and never a partial float before the end.
      REQUIRE(sink.got.size() <= ready);
    }
    p.pump(64);
    REQUIRE(p.b->recv_done(0));
    REQUIRE(p.a->sends_idle(1));
    REQUIRE(sink.got == data);
    std::size_t at = 0;
    for (const auto& [offset, bytes] : sink.calls) {
      CHECK(offset == at);
      CHECK(offset % 4 == 0);
      CHECK(bytes % 4 == 0);
      at += bytes;
    }
  }
}

TEST_CASE("message channel: a gated send goes no further than set_ready allows", "[unit]") {
  Pair p(4096);
  const std::vector<char> data = payload(1000);
  std::vector<char> landing(data.size(), 0);
  mc::FrameHeader h;
  const std::uint64_t ticket = p.a->queue_send(1, h, data.data(), data.size(), 100);
  p.b->start_recv(0, landing.data(), landing.size());
  p.pump(16);
  CHECK_FALSE(p.b->recv_done(0));
  CHECK_FALSE(p.a->sends_idle(1));
  CHECK(std::memcmp(landing.data(), data.data(), 100) == 0);
  CHECK(landing[100] == 0);
  p.a->set_ready(1, ticket, 50);  // never fewer than before
  p.a->set_ready(1, ticket, data.size());
  p.pump(16);
  REQUIRE(p.b->recv_done(0));
  CHECK(landing == data);
}

TEST_CASE("message channel: a sink that refuses the envelope fails the peer, nothing consumed",
          "[unit]") {
  Pair p(4096);
  const std::vector<char> data = payload(64);
  std::vector<char> landing(data.size());
  Recorder sink;
  sink.refuse = true;
  mc::FrameHeader h;
  h.kind = 0x46;
  p.a->queue_send(1, h, data.data(), data.size());
  p.b->start_recv(0, landing.data(), landing.size(), &sink);
  p.pump(16);
  REQUIRE(p.b->failed(0));
  CHECK(sink.calls.empty());
  CHECK_THROWS_WITH(std::rethrow_exception(p.b->failure(0)),
                    Catch::Matchers::Contains("refused kind 70"));
}
