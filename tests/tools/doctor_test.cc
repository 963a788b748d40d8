// mwms-doctor as a user runs it: the real binary, TF_CONFIG in its environment, JSON on stdout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "mwms/config.h"

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

// Runs `cmd` through sh; its exit status (-1 when killed) and what it wrote to stdout.
Run run_shell(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Run doctor(const std::string& tf_config, const std::string& extra = "") {
  return run_shell("TF_CONFIG=" + quote(tf_config) + " " MWMS_DOCTOR_PATH " --json " + extra +
                   " 2>/dev/null");
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

TEST_CASE("mwms-doctor --json reports every launcher present and their conflict", "[unit][tools]") {
  auto run = [](const std::string& env) {
    std::string cmd = "env -u TF_CONFIG -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u "
                      "SLURM_PROCID -u RANK -u WORLD_SIZE -u PMIX_RANK -u PMI_RANK " +
                      env + " " MWMS_DOCTOR_PATH " --json 2>/dev/null";
    return run_shell(cmd);
  };
  std::string tf = quote(R"({"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}})");
  Run conflict = run("TF_CONFIG=" + tf + " OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2");
  CHECK(conflict.status == 2);
  auto c = nlohmann::json::parse(conflict.out);
  CHECK(c.at("error").get<std::string>().find(
            "TF_CONFIG lists 1 worker but mpirun started 2 processes (OMPI_COMM_WORLD_SIZE=2)") == 0);
  CHECK(c.at("source") == "tf_config");
  REQUIRE(c.at("sources").size() == 2);
  CHECK(c["sources"][0].at("source") == "tf_config");
  CHECK(c["sources"][0].at("world_size") == 1);
  CHECK(c["sources"][1].at("source") == "mpi");
  CHECK(c["sources"][1].at("world_size") == 2);
  CHECK(c["sources"][1].at("rank") == 1);

  // A TF_CONFIG that does not parse is the source that failed, not "default".
  std::string bad = quote(R"({"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":3}})");
  Run broken = run("TF_CONFIG=" + bad);
  CHECK(broken.status == 2);
  auto b = nlohmann::json::parse(broken.out);
  CHECK(b.at("source") == "tf_config");
  CHECK(b.at("error").get<std::string>().find("task worker 3 is out of range") != std::string::npos);

  Run nested = run("RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 MASTER_ADDR=n1 MASTER_PORT=29500 "
                   "SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_STEP_NODELIST='n[1-2]' "
                   "SLURM_STEP_TASKS_PER_NODE=1\\(x2\\)");
  CHECK(nested.status == 0);
  auto j = nlohmann::json::parse(nested.out);
  CHECK(j.at("source") == "torchrun");
  CHECK(j.at("task_id") == 3);
  CHECK(j.at("num_workers") == 4);
  CHECK(j.at("local_rank") == 1);
  REQUIRE(j.at("sources").size() == 2);
  CHECK(j["sources"][1].at("source") == "slurm");
  CHECK(j["sources"][1].at("world_size") == 2);
  CHECK(j["sources"][1].at("rank") == 1);
  CHECK(j["sources"][1].at("local_rank") == 0);
}

TEST_CASE("mwms-doctor: Slurm ports from MWMS_SLURM_PORT_BASE", "[unit][tools]") {
  auto run = [](const std::string& env) {
    std::string cmd = "env -u TF_CONFIG -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u RANK "
                      "-u WORLD_SIZE -u PMIX_RANK -u PMI_RANK SLURM_PROCID=1 SLURM_NTASKS=3 "
                      "SLURM_LOCALID=1 SLURM_STEP_NODELIST='a1,b[07]' "
                      "SLURM_STEP_TASKS_PER_NODE=2,1 " +
                      env + " " MWMS_DOCTOR_PATH " --json 2>/dev/null";
    return run_shell(cmd);
  };
  Run base = run("MWMS_SLURM_PORT_BASE=9100");
  REQUIRE(base.status == 0);
  auto j = nlohmann::json::parse(base.out);
  CHECK(j.at("source") == "slurm");
  CHECK(j.at("task_id") == 1);
  CHECK(j.at("ring") == nlohmann::json::array({"a1:9100", "a1:9101", "b07:9100"}));
  CHECK(nlohmann::json::parse(run("").out).at("ring")[2] == "b07:8888");
  Run bad = run("MWMS_SLURM_PORT_BASE=0");
  CHECK(bad.status == 2);
  CHECK(nlohmann::json::parse(bad.out).at("error").get<std::string>().find(
            "MWMS_SLURM_PORT_BASE=0 is out of range (allowed: 1..65535)") != std::string::npos);
}

namespace {

// A loopback TCP listener on an ephemeral port (closed with the object), and a free port.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

std::string two_workers(int port0, int port1, int index, const std::string& host0 = "127.0.0.1",
                        const std::string& host1 = "127.0.0.1") {
  return "{\"cluster\":{\"worker\":[\"" + host0 + ":" + std::to_string(port0) + "\",\"" +
         host1 + ":" + std::to_string(port1) + "\"]},\"task\":{\"type\":\"worker\","
         "\"index\":" + std::to_string(index) + "}}";
}

std::vector<std::string> severities(const Run& r) {
  std::vector<std::string> out;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  for (const auto& f : doc.at("check")) out.push_back(f.at("severity").get<std::string>());
  return out;
}

}  // namespace

TEST_CASE("mwms-doctor check finds a busy port, a foreign address and says why", "[unit][tools]") {
  Listener busy;
  int free_port = 0;
  {
    Listener probe;
    free_port = probe.port;
  }
  // This task's port is free and the peer's is taken by someone: ok, info; exit 0.
  Run a = doctor(two_workers(free_port, busy.port, 0), "check --timeout 1");
  INFO(a.out);
  CHECK(a.status == 0);
  // The first finding is the descriptor budget (ok under the test's limit).
  CHECK(severities(a) == std::vector<std::string>{"ok", "ok", "info"});
  // This task's own port is taken: an error naming the port, with the fix; exit 2.
  Run b = doctor(two_workers(free_port, busy.port, 1), "check --timeout 1");
  INFO(b.out);
  CHECK(b.status == 2);
  REQUIRE(severities(b) == std::vector<std::string>{"ok", "ok", "error"});
  const nlohmann::json b_doc = nlohmann::json::parse(b.out);
  const nlohmann::json& f = b_doc["check"][2];
  CHECK(f["what"].get<std::string>().find("port " + std::to_string(busy.port) +
                                          " is already in use") != std::string::npos);
  CHECK_FALSE(f["fix"].get<std::string>().empty());
  // This task's address is not this machine's (TEST-NET-1, RFC 5737): the wrong index, or DNS.
  Run c = doctor(two_workers(free_port, busy.port, 0, "192.0.2.1", "192.0.2.2"), "check --timeout 0.2");
  INFO(c.out);
  CHECK(c.status == 2);
  const nlohmann::json c_doc = nlohmann::json::parse(c.out);
  CHECK(c_doc["check"][1]["cause"].get<std::string>().find("wrong task index") !=
        std::string::npos);
}

// Note [descriptor budget]: `check` sets this task's need (world size, transport, streams per
// peer) against `ulimit -n`: an error finding with the fix under a limit too low, ok otherwise.
TEST_CASE("mwms-doctor check reports the descriptor budget against ulimit -n", "[unit][tools]") {
  const std::string tf =
      R"({"cluster":{"worker":["localhost:1","localhost:2","localhost:3","localhost:4"]},)"
      R"("task":{"type":"worker","index":0}})";
  const std::string cmd = "TF_CONFIG=" + quote(tf) +
                          " MWMS_TRANSPORT=tcp MWMS_NSOCKS_PERPEER=3 sh -c 'ulimit -n %d && "
                          MWMS_DOCTOR_PATH " --json check --timeout 0.1' 2>/dev/null";
  for (int limit : {16, 200}) {
    char line[1024];
    std::snprintf(line, sizeof line, cmd.c_str(), limit);
    Run r = run_shell(line);
    INFO(r.out);
    const nlohmann::json doc = nlohmann::json::parse(r.out);
    const nlohmann::json& f = doc["check"][0];
    const std::string what = f["what"].get<std::string>();
    CHECK(what.find("limit " + std::to_string(limit) + " (ulimit -n)") != std::string::npos);
    CHECK(what.find("needs about 18 (1 listener, 3 control links, 9 TCP streams to 3 peers "
                    "(MWMS_NSOCKS_PERPEER=3), 3 epoll sets") != std::string::npos);
    CHECK(f["severity"] == (limit == 16 ? "error" : "ok"));
    if (limit == 16) {
      CHECK(r.status == 2);
      CHECK(f["fix"].get<std::string>().find("ulimit -n") != std::string::npos);
    }
  }
}

TEST_CASE("mwms-doctor usage errors exit 2 with a JSON error under --json", "[unit][tools]") {
  for (const char* bad : {"--bogus", "--task_index 1", "--tf_config x.json --job_name worker"}) {
    Run r = doctor("{}", bad);
    INFO(bad << ": " << r.out);
    CHECK(r.status == 2);
    CHECK(nlohmann::json::parse(r.out).contains("error"));
  }
}

TEST_CASE("mwms-doctor says what JSON it expected at which byte, and why a file cannot be read",
          "[unit][tools]") {
  using Catch::Matchers::Contains;
  Run top = doctor("not json");
  CHECK(top.status == 2);
  const std::string top_error = nlohmann::json::parse(top.out).at("error").get<std::string>();
  CHECK_THAT(top_error, Contains("expected a JSON object") && Contains("at byte 1, found \"no\""));
  Run inner = doctor(R"({"cluster": {"worker": [no]}})");
  CHECK(inner.status == 2);
  CHECK_THAT(nlohmann::json::parse(inner.out).at("error").get<std::string>(),
             Contains("expected a JSON value at byte 25, found \"no\""));
  Run cut = doctor(R"({"cluster": {"worker": ["a:1"]})");  // 31 bytes: byte 32 is the end
  CHECK_THAT(nlohmann::json::parse(cut.out).at("error").get<std::string>(),
             Contains("expected '}' at byte 32, found the end of the text"));
  Run missing = doctor("", "--tf_config /nonexistent/mwms-tf.json");
  CHECK(missing.status == 2);
  CHECK_THAT(nlohmann::json::parse(missing.out).at("error").get<std::string>(),
             Contains("--tf_config /nonexistent/mwms-tf.json: cannot open the file: No such file "
                      "or directory"));
}

TEST_CASE("mwms-doctor --json says whether the build has CUDA and NCCL and what it sees",
          "[unit][tools]") {
  Run r = doctor(read_file(std::string(MWMS_SOURCE_DIR) + "/tests/data/tfconfig/TC-01.json"));
  REQUIRE(r.status == 0);
  const auto gpu = nlohmann::json::parse(r.out).at("gpu");
  INFO(gpu.dump());
  CHECK(gpu.at("cuda").get<bool>() == (MWMS_HAVE_CUDA == 1));
  CHECK(gpu.at("nccl").get<bool>() == (MWMS_HAVE_NCCL == 1));
  if (MWMS_HAVE_CUDA == 0) {
    CHECK(gpu.at("devices").is_null());
    CHECK_THAT(gpu.at("error").get<std::string>(),
               Catch::Matchers::Contains("not built with CUDA"));
  } else if (::access("/dev/nvidiactl", F_OK) != 0) {  // no NVIDIA driver on this machine
    CHECK(gpu.at("devices").is_null());
    CHECK_THAT(gpu.at("error").get<std::string>(),
               Catch::Matchers::StartsWith("no driver (cudaGetDeviceCount: "));
  } else {  // a driver: a count (0 when CUDA_VISIBLE_DEVICES hides every device)
    CHECK(gpu.at("devices").get<int>() >= 0);
  }
}

TEST_CASE("mwms-doctor exits 2 naming an MWMS_ variable libmwms would refuse, warns of unknown ones",
          "[unit][tools]") {
  const std::string tf = R"({"cluster":{"worker":["localhost:1"]},"task":{"type":"worker","index":0}})";
  Run bad = run_shell("TF_CONFIG=" + quote(tf) +
                      " MWMS_TIMEOUT_SECONDS=abc MWMS_NSOCKS_PERPEER=0 MWMS_TRANSPORT=udp "
                      "MWMS_TIMEOUT_SECOND=3 " MWMS_DOCTOR_PATH " --json 2>/dev/null");
  CHECK(bad.status == 2);
  auto got = nlohmann::json::parse(bad.out);
  CHECK(got.at("env").at("errors") ==
        nlohmann::json::array({"MWMS_TIMEOUT_SECONDS=abc is not a number (allowed: > 0)",
                               "MWMS_TRANSPORT=udp is not one of auto|tcp|shm|mpi",
                               "MWMS_NSOCKS_PERPEER=0 is out of range (allowed: 1-16)"}));
  CHECK(got.at("env").at("unknown") == nlohmann::json::array({"MWMS_TIMEOUT_SECOND"}));
  Run human = run_shell("TF_CONFIG=" + quote(tf) + " MWMS_TIMEOUT_SECONDS=0 MWMS_TIMEOUT_SECOND=3 "
                        MWMS_DOCTOR_PATH " 2>/dev/null");
  CHECK(human.status == 2);
  CHECK_THAT(human.out, Catch::Matchers::Contains(
                            "env:         error: MWMS_TIMEOUT_SECONDS=0 is out of range (allowed: > 0)"));
  CHECK_THAT(human.out, Catch::Matchers::Contains(
                            "env:         warning: unknown variable MWMS_TIMEOUT_SECOND is ignored"));
  Run good = run_shell("TF_CONFIG=" + quote(tf) + " MWMS_TIMEOUT_SECONDS=2.5 " MWMS_DOCTOR_PATH
                       " --json 2>/dev/null");
  CHECK(good.status == 0);
  CHECK(nlohmann::json::parse(good.out).at("env").at("errors").empty());
}
