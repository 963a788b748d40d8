// Note [option sentinels] (mwms/options.h): std::nullopt is the one "not set"; the 0.x sentinels
// still read as unset for one release; set values are taken as they are.
#include "collective/option_values.h"

#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "common/env.h"
#include "mwms/options.h"
#include "mwms/parameter_server.h"

namespace mc = mwms::collective;
using mwms::TransportChoice;

TEST_CASE("option sentinels: every optional field is unset by default", "[unit]") {
  const mwms::CommunicatorOptions c;
  CHECK_FALSE(c.timeout_seconds);
  CHECK_FALSE(c.connect_timeout_seconds);
  CHECK_FALSE(c.chunk_bytes);
  CHECK_FALSE(c.small_message_bytes);
  CHECK_FALSE(c.algorithm);
  CHECK_FALSE(c.transport);
  const mwms::CommunicationOptions s;
  CHECK_FALSE(s.bytes_per_pack);
  CHECK_FALSE(s.timeout_seconds);
  const mwms::ParameterServerOptions p;
  CHECK_FALSE(p.timeout_seconds);
  CHECK_FALSE(p.connect_timeout_seconds);
  CHECK_FALSE(p.transport);
}

TEST_CASE("option sentinels: unset reads the variable, a set value is taken", "[unit]") {
  const double timeout = mwms::common::env_double("MWMS_TIMEOUT_SECONDS");
  CHECK(mc::seconds_option(std::nullopt, "f", "MWMS_TIMEOUT_SECONDS") == timeout);
  CHECK(mc::seconds_option(7.5, "f", "MWMS_TIMEOUT_SECONDS") == 7.5);
  const long long chunk = mwms::common::env_int("MWMS_CHUNK_BYTES");
  CHECK(mc::bytes_option(std::nullopt, "f", "MWMS_CHUNK_BYTES") == chunk);
  CHECK(mc::bytes_option(std::size_t{8192}, "f", "MWMS_CHUNK_BYTES") == 8192);
  CHECK(mc::bytes_option_set(std::size_t{8192}));
  CHECK_FALSE(mc::bytes_option_set(std::nullopt));
  const long long small = mwms::common::env_int("MWMS_SMALL_MESSAGE_BYTES");
  CHECK(mc::small_message_option(std::nullopt) == small);
  CHECK(mc::small_message_option(0LL) == 0);  // 0 is a value: everything on bandwidth algorithms
  CHECK(mc::small_message_option(1LL << 20) == 1 << 20);
  CHECK(mc::algorithm_option(std::nullopt) == mwms::common::env_string("MWMS_ALGO"));
  CHECK(mc::algorithm_option(std::string("rd")) == "rd");
  CHECK(mc::transport_option(std::nullopt, "f") == std::nullopt);
  CHECK(mc::transport_option(TransportChoice::kShm, "f") == TransportChoice::kShm);
  // Work::wait's limit: the call's value, else the collective's own timeout (0: deprecated unset).
  CHECK(mc::seconds_or(std::nullopt, 42.0, "w") == 42.0);
  CHECK(mc::seconds_or(0.25, 42.0, "w") == 0.25);
  CHECK(mc::seconds_or(0.0, 42.0, "w") == 42.0);
  CHECK(mc::seconds_or(-3.0, 42.0, "w") == 42.0);
}

TEST_CASE("option sentinels: the deprecated 0.x spellings still compile and read as unset",
          "[unit]") {
  mwms::CommunicatorOptions c;
  c.timeout_seconds = 0;
  c.connect_timeout_seconds = -1;
  c.chunk_bytes = 0;
  c.small_message_bytes = -1;
  c.algorithm = "";
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  c.transport = TransportChoice::kFromEnvironment;
#pragma GCC diagnostic pop
  // Twice each: the second read is silent (one warning per field) and gives the same value.
  for (int i = 0; i < 2; ++i) {
    CHECK(mc::seconds_option(c.timeout_seconds, "t", "MWMS_TIMEOUT_SECONDS") ==
          mwms::common::env_double("MWMS_TIMEOUT_SECONDS"));
    CHECK(mc::seconds_option(c.connect_timeout_seconds, "c", "MWMS_CONNECT_TIMEOUT_SECONDS") ==
          mwms::common::env_double("MWMS_CONNECT_TIMEOUT_SECONDS"));
    CHECK(mc::bytes_option(c.chunk_bytes, "k", "MWMS_CHUNK_BYTES") ==
          mwms::common::env_int("MWMS_CHUNK_BYTES"));
    CHECK_FALSE(mc::bytes_option_set(c.chunk_bytes));
    CHECK(mc::small_message_option(c.small_message_bytes) ==
          mwms::common::env_int("MWMS_SMALL_MESSAGE_BYTES"));
    CHECK(mc::algorithm_option(c.algorithm) == mwms::common::env_string("MWMS_ALGO"));
    CHECK(mc::transport_option(c.transport, "x") == std::nullopt);
  }
  mwms::CommunicationOptions s;
  s.bytes_per_pack = 0;
  s.timeout_seconds = 0;
  CHECK(mc::bytes_option(s.bytes_per_pack, "b", "MWMS_BYTES_PER_PACK") ==
        mwms::common::env_int("MWMS_BYTES_PER_PACK"));
}
