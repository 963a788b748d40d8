// The parameter-server protocol's pure parts (strategy/ps/ps_protocol.h): the description a
// worker sends each ps round-trips, its decoder is bounded and total (every truncation, every
// corrupted byte: a PeerError or a valid description, nothing else), the first difference
// between two descriptions is named, and the segment layout (Note [ps segments]) packs the small
// shards and sends the large ones alone.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "strategy/ps/ps_protocol.h"

namespace {

namespace ps = mwms::strategy::ps;
using Catch::Matchers::Contains;

ps::JobDescription sample() {
  ps::JobDescription d;
  d.sync_replicas = 1;
  d.replicas_to_aggregate = 2;
  d.total_num_replicas = 3;
  d.max_staleness = -1;
  d.optimizer = 1;
  d.learning_rate = 0.01;
  d.momentum = 0.9;
  d.beta1 = 0.9;
  d.beta2 = 0.999;
  d.epsilon = 1e-8;
  d.num_workers = 3;
  d.num_ps = 2;
  d.shards = {{"dense_1/kernel/part_0", 0, 0, 0, 100352},
              {"dense_1/bias", 1, 0, 0, 256},
              {"dense_2/kernel", 2, 0, 0, 2560},
              {"dense_2/bias", 3, 0, 0, 10}};
  return d;
}

std::string decode_error(const std::string& bytes) {
  try {
    ps::decode(bytes.data(), bytes.size(), mwms::ErrorContext{});
  } catch (const mwms::PeerError& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("a ps description round-trips", "[unit][ps]") {
  const ps::JobDescription d = sample();
  const std::string bytes = ps::encode(d);
  const ps::JobDescription back = ps::decode(bytes.data(), bytes.size(), mwms::ErrorContext{});
  CHECK(ps::first_difference(d, back).empty());
  CHECK(ps::encode(back) == bytes);
  REQUIRE(back.shards.size() == 4);
  CHECK(back.shards[0].name == "dense_1/kernel/part_0");
  CHECK(back.shards[0].count == 100352);
  CHECK(back.learning_rate == 0.01);
}

TEST_CASE("the ps description decoder is bounded and total", "[unit][ps]") {
  const std::string bytes = ps::encode(sample());
  // Every truncation is refused, naming where it stopped.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " bytes");
    CHECK_THAT(decode_error(bytes.substr(0, n)), Contains("malformed parameter-server"));
  }
  CHECK_THAT(decode_error(bytes + "x"), Contains("after the last shard"));
  // Every single corrupted byte: refused, or a description that re-encodes to those bytes.
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (unsigned char flip : {0x01u, 0x80u, 0xffu}) {
      std::string b = bytes;
      b[i] = static_cast<char>(static_cast<unsigned char>(b[i]) ^ flip);
      try {
        const ps::JobDescription d = ps::decode(b.data(), b.size(), mwms::ErrorContext{});
        CHECK(ps::encode(d) == b);
      } catch (const mwms::PeerError&) {
      }
    }
  }
  std::string huge = bytes;
  // A shard count that the remaining bytes cannot hold is refused before anything is reserved.
  // The shard count follows the 69 bytes of magic, version, options and cluster size.
  const std::size_t at = 4 + 2 + 1 + 4 + 4 + 4 + 1 + 8 + 8 + 1 + 8 + 8 + 8 + 4 + 4;
  std::uint32_t many = 0xffffffffu;
  std::memcpy(&huge[at], &many, 4);
  CHECK_THAT(decode_error(huge), Contains("shards in"));
  CHECK_THAT(decode_error("XMPS" + bytes.substr(4)), Contains("bad magic"));
}

TEST_CASE("the first difference between the chief's and a worker's description", "[unit][ps]") {
  const ps::JobDescription chief = sample();
  ps::JobDescription w = sample();
  CHECK(ps::first_difference(chief, w).empty());
  w.optimizer = 2;
  CHECK_THAT(ps::first_difference(chief, w), Contains("optimizer"));
  w = sample();
  w.learning_rate = 0.1;
  CHECK_THAT(ps::first_difference(chief, w), Contains("learning_rate") && Contains("0.1"));
  w = sample();
  w.shards[2].count = 2561;
  CHECK_THAT(ps::first_difference(chief, w),
             Contains("shard 2") && Contains("2560") && Contains("2561"));
  w = sample();
  w.sync_replicas = 0;
  CHECK_THAT(ps::first_difference(chief, w), Contains("sync") && Contains("async"));
}

TEST_CASE("ps segments: one pack of the small shards, each large shard alone", "[unit][ps]") {
  const ps::Layout l = ps::ps_layout(sample().shards);
  // 256 + 2560 + 10 floats are small (< 64 KiB), 100352 floats are large.
  REQUIRE(l.segments.size() == 2);
  CHECK(l.segments[0].pack);
  CHECK(l.segments[0].count == 256 + 2560 + 10);
  CHECK(l.segments[0].element_offset == 0);
  CHECK_FALSE(l.segments[1].pack);
  CHECK(l.segments[1].first_shard == 0);
  CHECK(l.segments[1].element_offset == 2826);
  CHECK(l.segments[1].count == 100352);
  CHECK(l.shard_offset == std::vector<std::size_t>{2826, 0, 256, 2816});
  CHECK(l.total == 2826 + 100352);
  CHECK(ps::ps_layout({}).segments.empty());
  // The envelope of a segment is what check_segment accepts, and nothing else.
  const mwms::collective::FrameHeader h = ps::segment_header(l, 1, 7);
  CHECK_NOTHROW(ps::check_segment(h, l, 1, 7, mwms::ErrorContext{}));
  CHECK_THROWS_AS(ps::check_segment(h, l, 1, 8, mwms::ErrorContext{}),
                  mwms::CollectiveMismatchError);
  CHECK_THROWS_AS(ps::check_segment(h, l, 0, 7, mwms::ErrorContext{}),
                  mwms::CollectiveMismatchError);
}
