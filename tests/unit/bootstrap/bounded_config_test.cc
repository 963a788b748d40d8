// Note [bounded TF_CONFIG]: malformed and oversized TF_CONFIGs and cluster specs end in an
// mwms::Error with a bounded, valid UTF-8 message, in the library and in the real mwms-doctor
// binary (exit 2 with one JSON object under --json, never a crash).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bootstrap/json_text.h"
#include "bootstrap/peer_info.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

using Catch::Matchers::Contains;

namespace {

struct Case {
  const char* name;
  std::string text;
  bool invalid_argument;  // InvalidArgument (a limit) rather than BootstrapError (a bad spec)
  std::vector<std::string> says;
};

std::string tf_config_with_workers(const std::vector<std::string>& workers,
                                   const std::string& index = "0") {
  nlohmann::json doc;
  doc["cluster"]["worker"] = workers;
  std::string text = doc.dump();
  return text.substr(0, text.size() - 1) + R"(,"task":{"type":"worker","index":)" + index + "}}";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  std::string two = R"({"cluster":{"worker":["a.example:1","b.example:1"]},)";
  out.push_back({"invalid UTF-8 in a string",
                 two + R"("task":{"type":"work)" + std::string("\xFF") + R"(er","index":0}})",
                 true,
                 {"not valid UTF-8", "\\xFF", "byte 72"}});
  out.push_back({"invalid UTF-8 outside strings",
                 two + "\xC3\x28" + R"("task":{}})",
                 true,
                 {"not valid UTF-8", "\\xC3"}});
  out.push_back({"overlong UTF-8",
                 two + R"("task":{"type":")" + std::string("\xC0\xAF") + R"(","index":0}})",
                 true,
                 {"not valid UTF-8", "\\xC0"}});
  out.push_back(
      {"UTF-16 surrogate in UTF-8",
       two + R"("x":")" + std::string("\xED\xA0\x80") + R"(","task":{"type":"worker","index":0}})",
       true,
       {"not valid UTF-8", "\\xED"}});
  out.push_back({"1e309 as the index",
                 two + R"("task":{"type":"worker","index":1e309}})",
                 true,
                 {"\"1e309\"", "task.index", "does not fit"}});
  out.push_back(
      {"-1e999 as an address",
       R"({"cluster":{"worker":["a.example:1",-1e999]},"task":{"type":"worker","index":0}})",
       true,
       {"\"-1e999\"", "cluster.worker[1]"}});
  out.push_back({"10 MB host name",
                 tf_config_with_workers({std::string(10u << 20, 'h') + ":2222"}),
                 true,
                 {"above the limit of 1048576 bytes"}});
  out.push_back({"5 MiB address",
                 tf_config_with_workers({"a.example:1", std::string(5u << 20, '9')}),
                 true,
                 {"above the limit"}});
  out.push_back({"300-byte host name",
                 tf_config_with_workers({std::string(300, 'h') + ":1"}),
                 false,
                 {"cluster.worker[0]", "is 302 bytes", "at most 261", "(302 bytes)"}});
  out.push_back({"254-byte host name",
                 tf_config_with_workers({std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                                         std::string(63, 'c') + "." + std::string(62, 'd') + ":1"}),
                 false,
                 {"host of 254 bytes", "at most 253"}});
  out.push_back({"64-byte label",
                 tf_config_with_workers({std::string(64, 'l') + ".example:1"}),
                 false,
                 {"label", "64 bytes", "at most 63"}});
  out.push_back(
      {"port 65536", tf_config_with_workers({"a.example:65536"}), false, {"above 65535"}});
  out.push_back({"deep nesting",
                 std::string(100000, '[') + std::string(100000, ']'),
                 true,
                 {"deeper than 16"}});
  out.push_back({"deep nesting inside the cluster",
                 R"({"cluster":{"worker":)" + std::string(50, '[') + std::string(50, ']') + "}}",
                 true,
                 {"deeper than 16", "cluster.worker"}});
  out.push_back({"huge array",
                 R"({"cluster":{"worker":[)" +
                     [] {
                       std::string items;
                       for (int i = 0; i < 100000; ++i) items += i ? ",0" : "0";
                       return items;
                     }() +
                     "]}}",
                 true,
                 {"more than 65536 JSON values"}});
  std::vector<std::string> many;
  for (int i = 0; i < 5000; ++i) many.push_back("w" + std::to_string(i) + ".example:1");
  out.push_back(
      {"5000 tasks", tf_config_with_workers(many), true, {"5000 tasks", "limit of 4096"}});
  out.push_back({"an index that does not fit an int",
                 two + R"("task":{"type":"worker","index":99999999999999999999999}})",
                 false,
                 {"task.index"}});
  out.push_back({"control bytes in a value",
                 R"({"cluster":{"worker":["a\u0001b:1"]},"task":{"type":"worker","index":0}})",
                 false,
                 {"\\x01"}});
  out.push_back({"truncated",
                 two + R"("task":{"type":"worker","ind)",
                 false,
                 {"malformed JSON", "line 1, column"}});
  return out;
}

void check_message(const std::string& message) {
  CHECK(mwms::bootstrap::invalid_utf8_offset(message) == std::string::npos);
  CHECK(message.size() < 2048);
  CHECK_NOTHROW(nlohmann::json(message).dump());  // serialisable without an error handler
}

struct Run {
  int status;
  std::string out;
};

Run run(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

std::string write_temp(const std::string& text) {
  char path[] = "/tmp/mwms-bounded-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace

TEST_CASE("resolve_tf_config is total and bounded on malformed and oversized input",
          "[unit][bootstrap][bounded]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    std::string message;
    bool invalid_argument = false;
    try {
      mwms::resolve_tf_config(c.text, "TF_CONFIG");
      FAIL("accepted");
    } catch (const mwms::InvalidArgument& e) {
      invalid_argument = true;
      message = e.what();
    } catch (const mwms::BootstrapError& e) {
      message = e.what();
    } catch (const std::exception& e) {
      FAIL("a non-mwms exception escaped: " << e.what());
    }
    INFO(message);
    CHECK(invalid_argument == c.invalid_argument);
    CHECK_THAT(message, Contains("TF_CONFIG"));
    for (const std::string& part : c.says) CHECK_THAT(message, Contains(part));
    check_message(message);
  }
}

TEST_CASE("cluster spec files have the same bounds", "[unit][bootstrap][bounded]") {
  CHECK_THROWS_AS(mwms::ClusterSpec::from_json("{\"worker\":[\"a\xFF:1\"]}", "cluster.json"),
                  mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::ClusterSpec::from_json(R"({"worker":[1e400]})"), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::resolve_flags("worker", 0, std::string(100, '[')), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::ClusterSpec({{"worker", {std::string(300, 'x') + ":1"}}}),
                  mwms::BootstrapError);
  // At the limits, accepted.
  std::string host = std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                     std::string(63, 'c') + "." + std::string(61, 'd');
  REQUIRE(host.size() == 253);
  CHECK(
      mwms::ClusterSpec({{"worker", {host + ":65535", "[" + host + "]:1"}}}).num_tasks("worker") ==
      2);
  CHECK(mwms::split_address("h:00002222").second == 2222);
}

TEST_CASE("quote_value escapes and bounds what it quotes", "[unit][bootstrap][bounded]") {
  using mwms::bootstrap::quote_value;
  CHECK(quote_value("a:1") == "\"a:1\"");
  CHECK(quote_value("a\"b\\c\x01") == "\"a\\x22b\\x5Cc\\x01\"");
  CHECK(quote_value("\xFF\xC3") == "\"\\xFF\\xC3\"");
  CHECK(quote_value("\xC3\xA9") == "\"\xC3\xA9\"");  // é stays as it is
  std::string longer = quote_value(std::string(1000, 'x'));
  CHECK(longer.size() < 160);
  CHECK_THAT(longer, Contains("... (1000 bytes)"));
  // A cut never splits a character.
  std::string accents;
  for (int i = 0; i < 200; ++i) accents += "\xC3\xA9";
  CHECK(mwms::bootstrap::invalid_utf8_offset(quote_value(accents)) == std::string::npos);
}

TEST_CASE("mwms-doctor --json exits 2 with one JSON object on every malformed input",
          "[unit][tools][bounded]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    std::string file = write_temp(c.text);
    Run r = run(std::string(MWMS_DOCTOR_PATH) + " --json --tf_config " + file + " 2>/dev/null");
    Run human = run(std::string(MWMS_DOCTOR_PATH) + " --tf_config " + file + " >/dev/null 2>&1");
    std::remove(file.c_str());
    CHECK(human.status == 2);
    INFO(r.out);
    CHECK(r.status == 2);
    nlohmann::json doc;
    REQUIRE_NOTHROW(doc = nlohmann::json::parse(r.out));
    REQUIRE(doc.contains("error"));
    check_message(doc.at("error").get<std::string>());
  }
  // The user's report: TF_CONFIG in the environment with an invalid byte used to SIGABRT.
  Run env = run("TF_CONFIG=$(printf '{\"cluster\":{\"worker\":[\"a\\377:1\"]}}') " MWMS_DOCTOR_PATH
                " --json 2>/dev/null");
  CHECK(env.status == 2);
  CHECK_THAT(env.out, Contains("not valid UTF-8"));
}

TEST_CASE("mwms-doctor describes a ps task as a parameter server with its own address",
          "[unit][tools]") {
  // A new user's report: the ps task of docs/parameter_server.md's cluster was called an
  // evaluator, both worker addresses were labelled "ps 0 <- this process", and the note said
  // the ps was not used although train runs this cluster in ps mode.
  std::string file = write_temp(
      R"({"ps": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]})");
  Run ps = run(std::string(MWMS_DOCTOR_PATH) + " --job_name ps --task_index 0 --cluster_spec " +
               file + " 2>&1");
  Run worker = run(std::string(MWMS_DOCTOR_PATH) +
                   " --job_name worker --task_index 1 --cluster_spec " + file + " 2>&1");
  std::remove(file.c_str());
  INFO(ps.out);
  CHECK(ps.status == 0);
  CHECK_THAT(ps.out, Contains("role:        parameter server"));
  CHECK_THAT(ps.out, Contains("address:     localhost:2222  <- this process"));
  CHECK_THAT(ps.out, Contains("rank 0  worker 0  localhost:2223\n"));
  CHECK_THAT(ps.out, Contains("rank 1  worker 1  localhost:2224\n"));
  CHECK_THAT(ps.out, !Contains("evaluator"));
  CHECK_THAT(ps.out, !Contains("not used"));
  INFO(worker.out);
  CHECK(worker.status == 0);
  CHECK_THAT(worker.out, Contains("rank 1  worker 1  localhost:2224  <- this process"));
  CHECK_THAT(worker.out, Contains("a parameter-server job"));
}

// The online cores a rank publishes decide, on every rank alike, whether its host runs more
// ranks than cores (Topology::ranks_exceed_cores): optional, an integer in [0, 2^20].
TEST_CASE("peer info carries the host's online cores, optional and bounded",
          "[unit][bootstrap][bounded]") {
  mwms::bootstrap::PeerInfo p;
  p.rank = 3;
  p.address = "10.0.0.1:2222";
  p.host_id = "h";
  p.transport = "auto";
  p.online_cores = 96;
  nlohmann::json j = mwms::bootstrap::to_json(p);
  mwms::bootstrap::PeerInfo back;
  std::string why;
  REQUIRE(mwms::bootstrap::from_json(j, &back, &why));
  CHECK(back.online_cores == 96);
  j.erase("online_cores");  // an older peer: unknown
  REQUIRE(mwms::bootstrap::from_json(j, &back, &why));
  CHECK(back.online_cores == 0);
  for (const nlohmann::json& bad : {nlohmann::json(-1), nlohmann::json((1LL << 20) + 1),
                                    nlohmann::json("8"), nlohmann::json(2.5)}) {
    j["online_cores"] = bad;
    CHECK_FALSE(mwms::bootstrap::from_json(j, &back, &why));
    CHECK_THAT(why, Contains("online_cores"));
  }
}
