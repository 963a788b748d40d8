// resolve_tf_config / resolve_flags / resolve_explicit / resolve_from_environment against
// TensorFlow's rules, real platform TF_CONFIGs and every documented error.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "mwms/communicator.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

using Catch::Matchers::Contains;
using mwms::ClusterSource;
using mwms::resolve_tf_config;
using mwms::ResolvedCluster;
using mwms::test::bootstrap_error;
using Ring = std::vector<std::string>;

namespace {

constexpr const char* kWhere = "TF_CONFIG environment variable";

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string tf_error(const std::string& json) {
  return bootstrap_error([&] { resolve_tf_config(json, kWhere); });
}

// Sets and clears environment variables for one test and puts the old values back afterwards.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* name : {"TF_CONFIG", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK",
                             "PMI_SIZE", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "PMIX_RANK",
                             "PMIX_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID"}) {
      const char* value = std::getenv(name);
      saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
      unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  void set(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST_CASE("real TF_CONFIG examples resolve to TensorFlow's values", "[unit][bootstrap]") {
  for (const char* id : {"TC-01", "TC-06", "TC-10"}) {
    INFO(id);
    std::string dir = std::string(MWMS_SOURCE_DIR) + "/tests/data/tfconfig/";
    std::string tf_config = read_text(dir + id + ".json");
    auto expected = nlohmann::json::parse(read_text(dir + id + ".expected.json"));
    ResolvedCluster r = resolve_tf_config(tf_config, kWhere);
    CHECK(r.task.type == expected.at("task_type").get<std::string>());
    CHECK(r.task.index == expected.at("task_index").get<int>());
    CHECK(r.task_id == expected.at("task_id").get<int>());
    CHECK(r.num_workers == expected.at("num_workers").get<int>());
    CHECK(r.is_chief == expected.at("is_chief").get<bool>());
    CHECK(r.ring == expected.at("ring").get<Ring>());
    CHECK(r.in_ring);
    CHECK(r.source == ClusterSource::kTfConfig);
    CHECK(r.source_detail == kWhere);
  }
}

TEST_CASE("Kubeflow TFJob worker with environment cloud", "[unit][bootstrap]") {
  ResolvedCluster r = resolve_tf_config(
      R"({"cluster":{"chief":["tfjob-chief-0.ns.svc:2222"],"ps":["tfjob-ps-0.ns.svc:2222"],
          "worker":["tfjob-worker-0.ns.svc:2222","tfjob-worker-1.ns.svc:2222"]},
          "task":{"type":"worker","index":1},"environment":"cloud"})");
  CHECK(r.task_id == 2);
  CHECK(r.num_workers == 3);
  CHECK_FALSE(r.is_chief);
  CHECK(r.ring == Ring{"tfjob-chief-0.ns.svc:2222", "tfjob-worker-0.ns.svc:2222",
                       "tfjob-worker-1.ns.svc:2222"});
  CHECK(r.task_name() == "worker 1");
  CHECK(r.task_name_of_rank(0) == "chief 0");
  CHECK(r.task_name_of_rank(1) == "worker 0");
  CHECK(r.task_name_of_rank(2) == "worker 1");
  // Note [ps rank]: the ps tasks follow the training tasks in a parameter-server job's mesh.
  CHECK(r.task_name_of_rank(3) == "ps 0");
  CHECK(r.task_name_of_rank(4) == "rank 4");
  CHECK(r.num_ps == 1);
}

TEST_CASE("chief + workers + ps + evaluator: ids of every task", "[unit][bootstrap]") {
  const std::string cluster =
      R"("cluster":{"chief":["c:1"],"worker":["w0:1","w1:1","w2:1"],"ps":["p0:1","p1:1"],
                    "evaluator":["e:1"]})";
  auto resolve = [&](const std::string& type, int index) {
    return resolve_tf_config("{" + cluster + R"(,"task":{"type":")" + type + R"(","index":)" +
                             std::to_string(index) + "}}");
  };
  const Ring ring{"c:1", "w0:1", "w1:1", "w2:1"};
  ResolvedCluster chief = resolve("chief", 0);
  CHECK(chief.task_id == 0);
  CHECK(chief.is_chief);
  CHECK(chief.num_workers == 4);
  CHECK(chief.ring == ring);
  for (int i = 0; i < 3; ++i) {
    ResolvedCluster w = resolve("worker", i);
    CHECK(w.task_id == i + 1);
    CHECK_FALSE(w.is_chief);  // a chief exists, so worker 0 does not lead
    CHECK(w.num_workers == 4);
    CHECK(w.ring == ring);
  }
  ResolvedCluster eval = resolve("evaluator", 0);
  CHECK_FALSE(eval.in_ring);
  CHECK(eval.task_id == 0);
  CHECK(eval.num_workers == 1);
  CHECK(eval.is_chief);  // multi_worker_util.is_chief: the evaluator is chief of its own world
  CHECK(eval.ring == Ring{"e:1"});
  CHECK(eval.task_name() == "evaluator 0");
  CHECK(eval.task_name_of_rank(0) == "evaluator 0");
  for (int i = 0; i < 2; ++i) {
    // A ps resolves (it serves a ParameterServerStrategy) outside every all-reduce ring, with
    // the rank after the training tasks (Note [ps rank]); a Communicator refuses it at once.
    ResolvedCluster ps = resolve("ps", i);
    CHECK_FALSE(ps.in_ring);
    CHECK_FALSE(ps.is_chief);
    CHECK(ps.task_id == 4 + i);
    CHECK(ps.num_workers == 4);
    CHECK(ps.num_ps == 2);
    CHECK(ps.ring == ring);
    CHECK(ps.task_name() == "ps " + std::to_string(i));
    CHECK(ps.task_name_of_rank(0) == "chief 0");
    CHECK(ps.task_name_of_rank(5) == "ps 1");
    std::string msg = bootstrap_error([&] { mwms::Communicator::create(ps); });
    CHECK_THAT(msg, Contains("ps " + std::to_string(i)) &&
                        Contains("p" + std::to_string(i) + ":1") &&
                        Contains("MultiWorkerMirroredStrategy") && Contains("parameter server") &&
                        Contains("ParameterServerStrategy"));
  }
}

TEST_CASE("SageMaker and GCP AI Platform TF_CONFIGs", "[unit][bootstrap]") {
  ResolvedCluster sm = resolve_tf_config(
      R"({"cluster": {"worker": ["algo-1:8890", "algo-2:8890"]}, "environment": "cloud",
          "task": {"index": 0, "type": "worker"}})");
  CHECK(sm.task_id == 0);
  CHECK(sm.is_chief);  // no chief: worker 0 leads
  CHECK(sm.num_workers == 2);

  ResolvedCluster gcp = resolve_tf_config(
      R"({"cluster": {"chief": ["cmle-training-master-0:2222"],
                      "worker": ["cmle-training-worker-0:2222", "cmle-training-worker-1:2222"]},
          "environment": "cloud",
          "task": {"type": "worker", "index": 0, "cloud": "t1a2b3c4d5e6f7-ml", "trial": "3"},
          "job": {"scale_tier": "CUSTOM", "master_type": "n1-standard-8", "worker_count": "2",
                  "region": "us-central1", "python_version": "3.7"},
          "trial": "3", "rpc_layer": "grpc"})");
  CHECK(gcp.task_id == 1);
  CHECK(gcp.num_workers == 3);
  CHECK_FALSE(gcp.is_chief);
  CHECK(gcp.ring == Ring{"cmle-training-master-0:2222", "cmle-training-worker-0:2222",
                         "cmle-training-worker-1:2222"});
}

TEST_CASE("IPv6 addresses and index forms", "[unit][bootstrap]") {
  ResolvedCluster r = resolve_tf_config(
      R"({"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]}, "task": {"type": "worker",
          "index": "1"}})");
  CHECK(r.task.index == 1);
  CHECK(r.task_id == 1);
  CHECK(r.ring == Ring{"[::1]:2222", "[::1]:2223"});
  auto with_index = [](const std::string& index) {
    return R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": )" +
           index + "}}";
  };
  CHECK(resolve_tf_config(with_index("1.0")).task_id == 1);
  for (const char* bad : {"\"one\"", "1.5", "true", "[1]", "\"1x\"", "\"\""}) {
    INFO(bad);
    CHECK_THAT(tf_error(with_index(bad)),
               Contains(kWhere) && Contains("task.index") && Contains(bad));
  }
  CHECK_THAT(tf_error(with_index("-1")), Contains("worker -1") && Contains("out of range"));
  CHECK_THAT(tf_error(with_index("2")),
             Contains("worker 2") && Contains("out of range") && Contains("2 tasks"));
}

TEST_CASE("task or index omitted: an error as in TensorFlow, even for one task",
          "[unit][bootstrap]") {
  CHECK_THAT(
      tf_error(R"({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}})"),
      Contains(kWhere) && Contains("no \"task\"") && Contains("1 training task (worker 0 at a:1)"));
  CHECK_THAT(tf_error(R"({"cluster": {"chief": ["c:1"]}, "task": {}})"), Contains("no \"task\""));
  CHECK_THAT(tf_error(R"({"cluster": {"chief": ["c:1"]}, "task": null})"), Contains("no \"task\""));
  CHECK_THAT(tf_error(R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}})"),
             Contains(kWhere) && Contains("no \"task\"") && Contains("chief 0 at c:1") &&
                 Contains("worker 1 at w1:1"));
  CHECK_THAT(tf_error(R"({"cluster": {"ps": ["p:1"]}})"), Contains("no chief or worker"));
  CHECK_THAT(tf_error(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                          "task": {"type": "chief"}})"),
             Contains("no \"index\"") && Contains("{\"type\": \"chief\", \"index\": 0}"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker"}})"),
             Contains("no \"index\""));
}

TEST_CASE("empty TF_CONFIG object or empty cluster is a world of one", "[unit][bootstrap]") {
  // TF trains locally whenever the cluster lists no job, without reading "task".
  for (const char* json :
       {"{}", R"({"cluster": {}})", R"({"cluster": {}, "task": {"type": "worker", "index": 0}})",
        R"({"cluster": {}, "task": {"type": "worker", "index": 3}})",
        R"({"cluster": {}, "task": {"type": "worker"}})"}) {
    INFO(json);
    ResolvedCluster r = resolve_tf_config(json);
    CHECK(r.num_workers == 1);
    CHECK(r.task_id == 0);
    CHECK(r.is_chief);
    CHECK(r.in_ring);
    CHECK(r.ring.empty());
  }
  CHECK(resolve_tf_config("{}").task_name_of_rank(0) == "worker 0");
}

TEST_CASE("a listed job with no tasks is a job, as in TensorFlow", "[unit][bootstrap]") {
  CHECK_THAT(tf_error(R"({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}})"),
             Contains("worker 0") && Contains("no \"worker\" job"));
  CHECK_THAT(tf_error(R"({"cluster": {"ps": []}, "task": {"type": "worker", "index": 0}})"),
             Contains("no \"worker\" job"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": [], "ps": []}})"), Contains("no \"task\""));
  // Deliberate: with an empty chief job TF makes no task chief; libmwms refuses the cluster.
  CHECK_THAT(tf_error(R"({"cluster": {"chief": [], "worker": ["a:1", "b:1"]},
                          "task": {"type": "worker", "index": 0}})"),
             Contains("cluster.chief is listed with no task"));
  // An empty ps job next to the workers changes nothing.
  ResolvedCluster r = resolve_tf_config(
      R"({"cluster": {"ps": [], "worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})");
  CHECK(r.is_chief);
  CHECK(r.num_workers == 2);
}

TEST_CASE("TF_CONFIG structural errors name the source and what was found", "[unit][bootstrap]") {
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["a:1"]}, "task": )"),
             Contains(kWhere) && Contains("malformed JSON") && Contains("line 1, column"));
  // Where: the byte, line and column of the bad token, and the path of the value being read; a
  // string token is quoted whole (its ':' is not structural); nlohmann's own text, which repeats
  // "expected ...", is not appended.
  const std::string missing_comma = tf_error("{\"cluster\": {\"worker\": [\"a:1\",\n \"b:2\" \"c:3\"]}}");
  CHECK_THAT(missing_comma, Contains("expected ']' at byte 39, found \"\\x22c:3\\x22\"") &&
                                Contains("(line 2, column 8, in cluster.worker[2])"));
  CHECK(missing_comma.find("expected ']'") == missing_comma.rfind("expected"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "ind)"),
             Contains("found the end of the text (line 1, column") && Contains(", in task)"));
  CHECK_THAT(tf_error(R"(["a:1"])"), Contains(kWhere) && Contains("array"));
  CHECK_THAT(tf_error(R"("worker")"), Contains("string"));
  CHECK_THAT(tf_error(R"({"sparseCluster": {"worker": {"1": "w1:1"}}, "task": {"type": "worker",
                         "index": 1}})"),
             Contains(kWhere) && Contains("no \"cluster\"") && Contains("\"sparseCluster\"") &&
                 Contains("\"task\""));
  CHECK_THAT(tf_error(R"({"cluster": ["a:1"], "task": {"type": "worker", "index": 0}})"),
             Contains("\"cluster\" is a JSON array"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})"),
             Contains("cluster.worker") && Contains("list"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["a:1"]}, "task": "worker"})"),
             Contains("\"task\" is a JSON string"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})"),
             Contains("no \"type\""));
}

TEST_CASE("TF_CONFIG job and task errors", "[unit][bootstrap]") {
  CHECK_THAT(tf_error(R"({"cluster": {"master": ["m:1"], "worker": ["w:1"]},
                          "task": {"type": "worker", "index": 0}})"),
             Contains(kWhere) && Contains("\"master\"") && Contains("\"chief\""));
  CHECK_THAT(
      tf_error(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "master", "index": 0}})"),
      Contains("master 0") && Contains("\"chief\""));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "trainer",
                          "index": 0}})"),
             Contains("\"trainer\"") && Contains("chief, worker, ps, evaluator"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["w:1"], "learner": ["l:1"]},
                          "task": {"type": "worker", "index": 0}})"),
             Contains("\"learner\"") && Contains("chief, worker, ps, evaluator"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "chief", "index": 0}})"),
             Contains(kWhere) && Contains("chief 0") && Contains("no \"chief\" job") &&
                 Contains("worker (1 task)"));
  CHECK_THAT(tf_error(R"({"cluster": {"chief": ["c:1", "d:1"], "worker": ["w:1"]},
                          "task": {"type": "worker", "index": 0}})"),
             Contains("at most one chief") && Contains("cluster.chief[1]"));
  CHECK_THAT(tf_error(R"({"cluster": {"worker": ["w:1"], "evaluator": ["e:1", "f:1"]},
                          "task": {"type": "worker", "index": 0}})"),
             Contains("at most one evaluator"));
  CHECK_THAT(tf_error(R"({"cluster": {"ps": ["p:7"]}, "task": {"type": "ps", "index": 0}})"),
             Contains(kWhere) && Contains("ps 0") && Contains("p:7") &&
                 Contains("no chief or worker"));
}

TEST_CASE("TF_CONFIG address errors name entry, task and value", "[unit][bootstrap]") {
  auto with_worker1 = [](const std::string& address) {
    return R"({"cluster": {"worker": ["algo-1:2222", ")" + address +
           R"("]}, "task": {"type": "worker", "index": 0}})";
  };
  for (const char* bad : {"", "algo-2", "algo-2:", "algo-2:abc", "algo-2:0", "algo-2:65536"}) {
    INFO(bad);
    CHECK_THAT(tf_error(with_worker1(bad)), Contains(kWhere) && Contains("cluster.worker[1]") &&
                                                Contains("worker 1") &&
                                                Contains(std::string("\"") + bad + "\""));
  }
  CHECK_THAT(tf_error(with_worker1("algo-1:2222")), Contains("cluster.worker[0]") &&
                                                        Contains("cluster.worker[1]") &&
                                                        Contains("same address"));
  CHECK_THAT(tf_error(with_worker1("localhost:2223")), Contains(kWhere) && Contains("loopback") &&
                                                           Contains("localhost:2223") &&
                                                           Contains("algo-1:2222"));
  CHECK_THAT(tf_error(with_worker1("127.0.0.1:2223")), Contains("127.0.0.1:2223"));
}

TEST_CASE("resolve_flags takes a job map or {\"cluster\": ...}", "[unit][bootstrap]") {
  const char* bare = R"({"chief": ["c:1"], "worker": ["w0:1", "w1:1"]})";
  const char* wrapped = R"({"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}})";
  for (const char* spec : {bare, wrapped}) {
    INFO(spec);
    ResolvedCluster r = mwms::resolve_flags("worker", 1, spec);
    CHECK(r.source == ClusterSource::kFlags);
    CHECK(r.task.type == "worker");
    CHECK(r.task_id == 2);
    CHECK(r.num_workers == 3);
    CHECK_FALSE(r.is_chief);
    CHECK(r.ring == Ring{"c:1", "w0:1", "w1:1"});
    CHECK(mwms::resolve_flags("chief", 0, spec).is_chief);
  }
  CHECK_THAT(bootstrap_error([&] { mwms::resolve_flags("worker", 2, bare); }),
             Contains("--task_index") && Contains("worker 2") && Contains("out of range"));
  CHECK_THAT(bootstrap_error([&] { mwms::resolve_flags("ps", 0, bare); }),
             Contains("no \"ps\" job"));
  CHECK_THAT(bootstrap_error([&] { mwms::resolve_flags("", 0, bare); }), Contains("--job_name"));
  CHECK_THAT(bootstrap_error([] { mwms::resolve_flags("worker", 0, "{\"worker\": [\"a\"]}"); }),
             Contains("--cluster_spec") && Contains("cluster.worker[0]"));
  CHECK_THAT(bootstrap_error([] { mwms::resolve_flags("worker", 0, "[1]"); }),
             Contains("--cluster_spec") && Contains("array"));
}

TEST_CASE("resolve_explicit applies the same rules", "[unit][bootstrap]") {
  mwms::ClusterSpec spec(std::map<std::string, std::vector<std::string>>{
      {"worker", {"w0:1", "w1:1"}}, {"evaluator", {"e:1"}}});
  ResolvedCluster r = mwms::resolve_explicit(spec, mwms::TaskSpec{"worker", 1});
  CHECK(r.source == ClusterSource::kExplicit);
  CHECK(r.task_id == 1);
  CHECK_FALSE(r.is_chief);
  CHECK(r.task_name_of_rank(0) == "worker 0");
  CHECK_FALSE(mwms::resolve_explicit(spec, mwms::TaskSpec{"evaluator", 0}).in_ring);
  CHECK_THAT(bootstrap_error([&] {
               mwms::resolve_explicit(spec, mwms::TaskSpec{"worker", 5});
             }),
             Contains("worker 5") && Contains("out of range"));
}

TEST_CASE("resolve_from_environment: TF_CONFIG, then mpirun, then one process",
          "[unit][bootstrap]") {
  EnvGuard env;
  SECTION("no configuration: a single process") {
    ResolvedCluster r = mwms::resolve_from_environment();
    CHECK(r.source == ClusterSource::kDefault);
    CHECK(r.num_workers == 1);
    CHECK(r.task_id == 0);
    CHECK(r.is_chief);
    CHECK(r.task.type == "worker");
    CHECK(r.task_name() == "single process");
  }
  SECTION("TF_CONFIG wins over an mpirun environment that agrees with it") {
    // One that disagrees is an error: launchers_test.cc.
    env.set("TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:1"]},
                             "task": {"type": "worker", "index": 1}})");
    env.set("OMPI_COMM_WORLD_RANK", "1");
    env.set("OMPI_COMM_WORLD_SIZE", "2");
    ResolvedCluster r = mwms::resolve_from_environment();
    CHECK(r.source == ClusterSource::kTfConfig);
    CHECK(r.source_detail == "TF_CONFIG environment variable");
    CHECK(r.task_id == 1);
    CHECK(r.num_workers == 2);
  }
  SECTION("an empty TF_CONFIG counts as unset") {
    env.set("TF_CONFIG", "");
    CHECK(mwms::resolve_from_environment().source == ClusterSource::kDefault);
  }
  SECTION("a bad TF_CONFIG names the environment variable") {
    env.set("TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps"}})");
    CHECK_THAT(bootstrap_error([] { mwms::resolve_from_environment(); }),
               Contains("TF_CONFIG environment variable") && Contains("\"ps\""));
  }
  SECTION("Open MPI") {
    env.set("OMPI_COMM_WORLD_RANK", "2");
    env.set("OMPI_COMM_WORLD_SIZE", "4");
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    ResolvedCluster r = mwms::resolve_from_environment();
    CHECK(r.source == ClusterSource::kMpi);
    CHECK(r.task.type == "worker");
    CHECK(r.task.index == 2);
    CHECK(r.task_id == 2);
    CHECK(r.num_workers == 4);
    CHECK_FALSE(r.is_chief);
    CHECK(r.in_ring);
    CHECK(r.ring.empty());
    CHECK(r.local_rank == 1);
    CHECK(r.task_name() == "mpi rank 2");
    CHECK(r.task_name_of_rank(3) == "mpi rank 3");
  }
  SECTION("PMI (MPICH, Slurm)") {
    env.set("PMI_RANK", "0");
    env.set("PMI_SIZE", "3");
    ResolvedCluster r = mwms::resolve_from_environment();
    CHECK(r.source == ClusterSource::kMpi);
    CHECK(r.task_id == 0);
    CHECK(r.num_workers == 3);
    CHECK(r.is_chief);
    CHECK(r.local_rank == 0);
  }
  SECTION("inconsistent mpirun variables are errors") {
    env.set("OMPI_COMM_WORLD_RANK", "4");
    env.set("OMPI_COMM_WORLD_SIZE", "4");
    CHECK_THAT(bootstrap_error([] { mwms::resolve_from_environment(); }),
               Contains("OMPI_COMM_WORLD_RANK=4"));
    env.set("OMPI_COMM_WORLD_SIZE", "four");
    CHECK_THAT(bootstrap_error([] { mwms::resolve_from_environment(); }),
               Contains("OMPI_COMM_WORLD_SIZE=four"));
    unsetenv("OMPI_COMM_WORLD_SIZE");
    CHECK_THAT(bootstrap_error([] { mwms::resolve_from_environment(); }),
               Contains("OMPI_COMM_WORLD_SIZE is not"));
  }
}
