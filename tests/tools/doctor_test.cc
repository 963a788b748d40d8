// mwms-doctor as a user runs it: the real binary, TF_CONFIG in its environment, JSON on stdout.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

struct Run {
  int status;
  std::string out;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Run doctor(const std::string& tf_config) {
  std::string cmd = "TF_CONFIG=" + quote(tf_config) + " " MWMS_DOCTOR_PATH " --json 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("mwms-doctor --json prints what TensorFlow derives for real TF_CONFIGs", "[unit][tools]") {
  for (const char* id : {"TC-01", "TC-06", "TC-10"}) {
    INFO(id);
    std::string dir = std::string(MWMS_SOURCE_DIR) + "/tests/data/tfconfig/";
    Run r = doctor(read_file(dir + id + ".json"));
    REQUIRE(r.status == 0);
    auto got = nlohmann::json::parse(r.out);
    auto want = nlohmann::json::parse(read_file(dir + id + ".expected.json"));
    for (const char* key : {"task_type", "task_index", "task_id", "num_workers", "is_chief", "ring"}) {
      INFO(key);
      CHECK(got.at(key) == want.at(key));
    }
  }
}

TEST_CASE("mwms-doctor exits 2 with the library's error on a bad TF_CONFIG", "[unit][tools]") {
  Run r = doctor(R"({"cluster":{"worker":["localhost:1","localhost:2"]},"task":{"type":"worker","index":5}})");
  CHECK(r.status == 2);
  auto got = nlohmann::json::parse(r.out);
  CHECK_THAT(got.at("error").get<std::string>(), Catch::Matchers::Contains("index"));
  Run master = doctor(R"({"cluster":{"master":["h:1"],"worker":["w:1"]},"task":{"type":"master","index":0}})");
  CHECK(master.status == 2);
  CHECK_THAT(master.out, Catch::Matchers::Contains("chief"));
  Run broken = doctor(R"({"cluster": {"worker": ["a:1"]}, "task": )");
  CHECK(broken.status == 2);
}
