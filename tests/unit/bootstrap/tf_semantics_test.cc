// resolve_tf_config against TensorFlow 2.21 itself: every vector of
// tests/data/tfconfig/tf_semantics_vectors.json (written by scripts/tf_semantics_vectors.py from
// TFConfigClusterResolver and multi_worker_util; no TensorFlow is needed here) must resolve to
// TF's values, or raise where TF raises, or fail one of libmwms's deliberate stricter checks
// listed below with its reason (Note [TF_CONFIG semantics] in src/bootstrap/tf_config.cc).
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace {

using nlohmann::json;

struct Deliberate {
  const char* label_prefix;  // vectors whose label starts with this
  const char* message;       // our error must contain this
  const char* reason;        // why libmwms rejects what TensorFlow accepts
};

// Each entry must match at least one vector (checked below), so the table cannot go stale.
const Deliberate kDeliberate[] = {
    {"no-cluster-", "no \"cluster\" key",
     "a TF_CONFIG with keys but no \"cluster\" is a launcher bug; TF silently trains alone"},
    {"sparse-cluster-key", "sparseCluster", "Kubeflow's sparse format cannot form a ring"},
    {"top-level-", "expected a JSON object", "TF treats \"[]\" or a JSON string as local training"},
    {"empty-cluster-task-master", "\"master\"", "the TF1 name; TF 2 rejects it in a cluster"},
    {"lenient-index-fraction", "task.index", "int(1.5) == 1 hides a generator bug"},
    {"lenient-index-bool", "task.index", "int(True) == 1 hides a generator bug"},
    {"lenient-index-plus", "task.index", "only plain decimal strings are indexes"},
    {"lenient-index-spaces", "task.index", "only plain decimal strings are indexes"},
    {"lenient-index-underscore", "task.index", "Python's \"0_1\" == 1 is not an index"},
    {"lenient-index-negative", "out of range", "TF gives worker -1 the id -1: no rank"},
    {"address-no-port", "has no port", "a task must be reachable at host:port"},
    {"address-port0", "port 0", "a task needs a fixed port to be reachable"},
    {"address-port-too-big", "above 65535", "not a TCP port"},
    {"address-empty", "is empty", "not an address"},
    {"address-scheme", "URL scheme", "rpc_layer names the protocol, not the address"},
    {"address-space", "white space", "not an address"},
    {"address-ipv6-unbracketed", "IPv6", "ambiguous host:port split"},
    {"address-duplicate", "same address", "two tasks cannot listen on one host:port"},
    {"address-loopback-mix", "mix loopback", "Note [loopback mixing]: tasks would dial themselves"},
    {"dict-jobs-sparse", "sparse", "a ring needs every task listed"},
    {"chief-empty-with-workers", "cluster.chief is listed with no task",
     "TF would then have no chief at all"},
    {"grid:chief0+", "cluster.chief is listed with no task", "TF would then have no chief at all"},
};

json load_vectors() {
  std::string path =
      std::string(MWMS_SOURCE_DIR) + "/tests/data/tfconfig/tf_semantics_vectors.json";
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

const Deliberate* deliberate_for(const std::string& label) {
  for (const Deliberate& d : kDeliberate) {
    if (label.rfind(d.label_prefix, 0) == 0) return &d;
  }
  return nullptr;
}

// TF's collective_leader for the ring's rank 0 ("/job:chief/replica:0/task:0").
std::string leader_of(const mwms::ResolvedCluster& r) {
  std::string name = r.task_name_of_rank(0);  // "chief 0" / "worker 0"
  std::size_t space = name.find(' ');
  return "/job:" + name.substr(0, space) + "/replica:0/task:" + name.substr(space + 1);
}

}  // namespace

TEST_CASE("TF_CONFIG resolves as TensorFlow 2.21 does on every conformance vector",
          "[unit][bootstrap][tf_semantics]") {
  json doc = load_vectors();
  const json& vectors = doc.at("vectors");
  REQUIRE(vectors.size() >= 500);
  std::map<std::string, int> used;
  int agreed = 0;
  int raised_both = 0;
  int ps_tasks = 0;  // TF raises for a ps (no collective id); libmwms resolves it
  for (const json& v : vectors) {
    const std::string label = v.at("label");
    const std::string text = v.at("tf_config");
    INFO("vector " << label << ": TF_CONFIG=" << text);
    std::string error;
    mwms::ResolvedCluster r;
    try {
      r = mwms::resolve_tf_config(text, "TF_CONFIG");
    } catch (const mwms::Error& e) {
      error = e.what();
    } catch (const std::exception& e) {
      FAIL("a non-mwms exception escaped: " << e.what());
    }
    INFO("libmwms: " << (error.empty() ? "accepted" : error));
    if (v.at("tf_raised").get<bool>()) {
      INFO("TensorFlow raised " << v.at("error_kind").get<std::string>() << ": "
                                << v.at("error").get<std::string>());
      if (error.empty() && v.at("error").get<std::string>().find("no id for task_type 'ps'") !=
                               std::string::npos) {
        // MWMS's id_in_cluster has no id for a ps; libmwms resolves it for the
        // parameter-server mode, outside every all-reduce ring (Note [ps rank]), and
        // Communicator::create refuses it.
        CHECK(r.task.type == "ps");
        CHECK_FALSE(r.in_ring);
        CHECK(r.task_id == r.num_workers + r.task.index);
        ++ps_tasks;
        continue;
      }
      CHECK_FALSE(error.empty());
      ++raised_both;
      continue;
    }
    const json& tf = v.at("values");
    if (!error.empty()) {
      const Deliberate* d = deliberate_for(label);
      INFO("TensorFlow accepted it; a rejection must be one of the deliberate checks");
      REQUIRE(d != nullptr);
      INFO("deliberate: " << d->reason);
      CHECK_THAT(error, Catch::Matchers::Contains(d->message));
      ++used[d->label_prefix];
      continue;
    }
    CHECK(deliberate_for(label) == nullptr);  // a listed difference that no longer differs
    CHECK(r.is_chief == tf.at("is_chief").get<bool>());
    CHECK(r.task_id == tf.at("id_in_cluster").get<int>());
    CHECK(r.num_workers == tf.at("num_workers").get<int>());
    if (tf.at("local").get<bool>()) {
      CHECK(r.ring.empty());
    } else {
      CHECK(r.task.type == tf.at("task_type").get<std::string>());
      CHECK(r.task.index == tf.at("task_id").get<int>());
      bool evaluator = r.task.type == "evaluator";
      CHECK(r.in_ring == !evaluator);
      if (!evaluator) {
        CHECK(leader_of(r) == tf.at("collective_leader").get<std::string>());
        CHECK(static_cast<int>(r.ring.size()) == r.num_workers);
      }
      // The same jobs and addresses (TF keeps empty jobs as {}; ClusterSpec drops them).
      std::map<std::string, std::vector<std::string>> want;
      for (const auto& [job, tasks] : tf.at("cluster").items()) {
        if (tasks.empty()) continue;
        if (tasks.is_array()) {
          want[job] = tasks.get<std::vector<std::string>>();
        } else {
          for (int i = 0; i < static_cast<int>(tasks.size()); ++i)
            want[job].push_back(tasks.at(std::to_string(i)));
        }
      }
      CHECK(r.cluster.jobs() == want);
    }
    ++agreed;
  }
  for (const Deliberate& d : kDeliberate) {
    INFO("deliberate difference " << d.label_prefix << " matched no vector");
    CHECK(used[d.label_prefix] > 0);
  }
  CHECK(agreed >= 90);
  CHECK(raised_both >= 400);
  CHECK(ps_tasks >= 10);
}
