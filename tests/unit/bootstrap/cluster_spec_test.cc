// ClusterSpec, split_address and is_loopback_host: parsing, validation messages, canonical form.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "expect_error.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

using Catch::Matchers::Contains;
using mwms::ClusterSpec;
using mwms::test::bootstrap_error;
using JobMap = std::map<std::string, std::vector<std::string>>;

TEST_CASE("split_address accepts host:port, [ipv6]:port and DNS names", "[unit][bootstrap]") {
  CHECK(mwms::split_address("algo-1:8890") == std::pair<std::string, int>{"algo-1", 8890});
  CHECK(mwms::split_address("10.0.0.7:1") == std::pair<std::string, int>{"10.0.0.7", 1});
  CHECK(mwms::split_address("tfjob-worker-0.team-ns.svc:65535") ==
        std::pair<std::string, int>{"tfjob-worker-0.team-ns.svc", 65535});
  CHECK(mwms::split_address("[::1]:2222") == std::pair<std::string, int>{"::1", 2222});
  CHECK(mwms::split_address("[fe80::1%eth0]:80") ==
        std::pair<std::string, int>{"fe80::1%eth0", 80});
  CHECK(mwms::split_address("host:02222") == std::pair<std::string, int>{"host", 2222});
}

TEST_CASE("split_address rejects malformed addresses naming where and the value",
          "[unit][bootstrap]") {
  struct Case {
    const char* address;
    const char* why;
  };
  const Case cases[] = {
      {"", "is empty"},
      {"algo-1", "has no port"},
      {"algo-1:", "empty port"},
      {"algo-1:http", "non-numeric port"},
      {"algo-1:-5", "non-numeric port"},
      {"algo-1:0", "port 0"},
      {"algo-1:65536", "above 65535"},
      {"algo-1:99999999999999999999", "above 65535"},
      {"::1:2222", "without brackets"},
      {"[::1]2222", "no port"},
      {"[::1:2222", "closing"},
      {"[]:2222", "empty host"},
      {":2222", "empty host"},
      {"grpc://algo-1:2222", "URL scheme"},
      {"algo 1:2222", "white space"},
  };
  for (const Case& c : cases) {
    INFO("address " << c.address);
    std::string msg = bootstrap_error([&] { mwms::split_address(c.address, "entry X"); });
    CHECK_THAT(msg, Contains("entry X") && Contains(std::string("\"") + c.address + "\"") &&
                        Contains(c.why));
  }
}

TEST_CASE("is_loopback_host knows loopback names and addresses", "[unit][bootstrap]") {
  for (const char* host : {"localhost", "LOCALHOST", "localhost.", "localhost.localdomain",
                           "ip6-localhost", "127.0.0.1", "127.1.2.3", "127.255.255.254", "::1",
                           "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "x.localhost"}) {
    INFO(host);
    CHECK(mwms::is_loopback_host(host));
  }
  for (const char* host : {"algo-1", "10.0.0.1", "128.0.0.1", "1127.0.0.1", "127.0.0.1.example",
                           "::2", "fe80::1", "localhost-1", "my-localhost", "0.0.0.0", ""}) {
    INFO(host);
    CHECK_FALSE(mwms::is_loopback_host(host));
  }
}

TEST_CASE("ClusterSpec from a map: counts, addresses, empty jobs dropped", "[unit][bootstrap]") {
  ClusterSpec spec(JobMap{{"chief", {"c:1"}}, {"worker", {"w0:2", "w1:3"}}, {"ps", {}}});
  CHECK(spec.jobs().size() == 2);
  CHECK(spec.num_tasks("chief") == 1);
  CHECK(spec.num_tasks("worker") == 2);
  CHECK(spec.num_tasks("ps") == 0);
  CHECK(spec.num_tasks("evaluator") == 0);
  CHECK(spec.task_address("worker", 1) == "w1:3");
  CHECK(spec.task_address("chief", 0) == "c:1");
  CHECK_THAT(bootstrap_error([&] { spec.task_address("worker", 2); }),
             Contains("worker 2") && Contains("2 task"));
  CHECK_THAT(bootstrap_error([&] { spec.task_address("worker", -1); }), Contains("worker -1"));
  CHECK_THAT(bootstrap_error([&] { spec.task_address("evaluator", 0); }),
             Contains("no evaluator job"));
  CHECK_THAT(bootstrap_error([] { ClusterSpec(JobMap{{"master", {}}}); }), Contains("\"chief\""));
  CHECK_THAT(bootstrap_error([] {
               ClusterSpec(JobMap{{"worker", {"w0:2", "w0"}}});
             }),
             Contains("cluster.worker[1]") && Contains("\"w0\""));
}

TEST_CASE("ClusterSpec canonical JSON and fingerprint", "[unit][bootstrap]") {
  CHECK(ClusterSpec().canonical_json() == "{}");
  // FNV-1a 64 of "{}" and of {"worker":["a:1"]}, computed independently.
  CHECK(ClusterSpec().fingerprint() == "08f44b07b5901a25");
  ClusterSpec one(JobMap{{"worker", {"a:1"}}});
  CHECK(one.canonical_json() == R"({"worker":["a:1"]})");
  CHECK(one.fingerprint() == "51dcf2797101ed11");

  ClusterSpec a = ClusterSpec::from_json(R"({"worker": ["w0:2", "w1:3"], "chief": ["c:1"]})");
  ClusterSpec b = ClusterSpec::from_json(R"({ "chief" : ["c:1"], "worker":["w0:2","w1:3"] })");
  CHECK(a.canonical_json() == R"({"chief":["c:1"],"worker":["w0:2","w1:3"]})");
  CHECK(a.canonical_json() == b.canonical_json());
  CHECK(a.fingerprint() == b.fingerprint());
  CHECK(a.fingerprint().size() == 16);
  // Worker order is ring order, so swapping two workers is a different cluster.
  ClusterSpec swapped = ClusterSpec::from_json(R"({"chief": ["c:1"], "worker": ["w1:3", "w0:2"]})");
  CHECK(swapped.fingerprint() != a.fingerprint());
}

TEST_CASE("ClusterSpec::from_json accepts dense index maps and rejects sparse ones",
          "[unit][bootstrap]") {
  ClusterSpec dense = ClusterSpec::from_json(R"({"worker": {"1": "w1:3", "0": "w0:2"}})");
  REQUIRE(dense.num_tasks("worker") == 2);
  CHECK(dense.task_address("worker", 0) == "w0:2");
  CHECK(dense.task_address("worker", 1) == "w1:3");
  CHECK_THAT(bootstrap_error([] {
               ClusterSpec::from_json(R"({"worker": {"0": "w0:2", "2": "w2:3"}})", "SRC");
             }),
             Contains("SRC") && Contains("sparse") && Contains("worker 1"));
  CHECK_THAT(bootstrap_error([] { ClusterSpec::from_json(R"({"worker": {"a": "w0:2"}})"); }),
             Contains("\"a\""));
}

TEST_CASE("ClusterSpec::from_json rejects bad specs naming the entry", "[unit][bootstrap]") {
  auto err = [](const char* json) {
    return bootstrap_error([&] { ClusterSpec::from_json(json, "TF_CONFIG cluster"); });
  };
  CHECK_THAT(err(R"({"worker": ["w0:2",)"),
             Contains("TF_CONFIG cluster") && Contains("malformed JSON") && Contains("column"));
  CHECK_THAT(err(R"(["w0:2"])"), Contains("array"));
  CHECK_THAT(err(R"({"worker": "w0:2"})"),
             Contains("cluster.worker") && Contains("string") && Contains("list"));
  CHECK_THAT(err(R"({"worker": ["w0:2", 7]})"), Contains("cluster.worker[1]") && Contains("7"));
  CHECK_THAT(err(R"({"master": ["m:1"], "worker": ["w0:2"]})"),
             Contains("\"master\"") && Contains("rename it \"chief\""));
  CHECK_THAT(err(R"({"trainer": ["t:1"]})"),
             Contains("\"trainer\"") && Contains("chief, worker, ps, evaluator"));
  CHECK_THAT(err(R"({"chief": ["c0:1", "c1:1"]})"),
             Contains("at most one chief") && Contains("cluster.chief[1]") && Contains("c1:1"));
  CHECK_THAT(err(R"({"worker": ["w:1"], "evaluator": ["e0:1", "e1:1"]})"),
             Contains("at most one evaluator"));
  CHECK_THAT(err(R"({"worker": ["w0:2", "algo-2"]})"),
             Contains("TF_CONFIG cluster") && Contains("cluster.worker[1]") &&
                 Contains("worker 1") && Contains("\"algo-2\"") && Contains("no port"));
  CHECK_THAT(err(R"({"worker": ["w0:2", "w1:0"]})"),
             Contains("cluster.worker[1]") && Contains("\"w1:0\"") && Contains("port 0"));
  CHECK_THAT(err(R"({"worker": ["w0:2", ""]})"),
             Contains("cluster.worker[1]") && Contains("is empty"));
  CHECK_THAT(err(R"({"worker": ["w0:2", "w1:70000"]})"),
             Contains("cluster.worker[1]") && Contains("\"w1:70000\""));
  CHECK_THAT(err(R"({"worker": ["w0:2", "w1:x2"]})"),
             Contains("cluster.worker[1]") && Contains("non-numeric"));
}

TEST_CASE("ClusterSpec rejects duplicate addresses naming both entries", "[unit][bootstrap]") {
  std::string msg = bootstrap_error([] {
    ClusterSpec::from_json(R"({"chief": ["h1:2222"], "worker": ["h2:2222", "H1:2222"]})", "SRC");
  });
  CHECK_THAT(msg, Contains("SRC") && Contains("cluster.chief[0]") && Contains("chief 0") &&
                      Contains("cluster.worker[1]") && Contains("worker 1") && Contains("H1:2222"));
  // A ps task on a worker's port is just as impossible.
  CHECK_THAT(
      bootstrap_error([] { ClusterSpec::from_json(R"({"worker": ["h1:1"], "ps": ["h1:1"]})"); }),
      Contains("cluster.ps[0]") && Contains("cluster.worker[0]"));
}

TEST_CASE("ClusterSpec rejects loopback mixed with routable training addresses",
          "[unit][bootstrap]") {
  std::string msg = bootstrap_error([] {
    ClusterSpec::from_json(R"({"chief": ["localhost:2222"], "worker": ["10.0.0.2:2222"]})",
                           "TF_CONFIG environment variable");
  });
  CHECK_THAT(msg, Contains("TF_CONFIG environment variable") && Contains("loopback") &&
                      Contains("cluster.chief[0]") && Contains("localhost:2222") &&
                      Contains("cluster.worker[0]") && Contains("10.0.0.2:2222") &&
                      Contains("different machine on each host"));
  CHECK_THAT(
      bootstrap_error([] { ClusterSpec::from_json(R"({"worker": ["[::1]:1", "algo-2:1"]})"); }),
      Contains("[::1]:1") && Contains("algo-2:1"));
  // All loopback (one machine) and all routable are both fine; ps never joins the ring.
  CHECK_NOTHROW(ClusterSpec::from_json(R"({"worker": ["127.0.0.1:1", "localhost:2"]})"));
  CHECK_NOTHROW(ClusterSpec::from_json(R"({"worker": ["algo-1:1", "algo-2:1"]})"));
  CHECK_NOTHROW(ClusterSpec::from_json(R"({"worker": ["127.0.0.1:1"], "ps": ["algo-9:1"]})"));
}
