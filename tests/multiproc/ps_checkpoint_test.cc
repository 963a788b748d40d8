// Checkpoints of a parameter-server job and the session's recovery, with real processes (issue
// 16, items 5 and 6): every ps writes its shard file, the chief the manifest; a new job restores
// values, optimizer slots and global step bit for bit (Adam, whose update depends on all three);
// a damaged newest checkpoint falls back to the one before it; no usable checkpoint fails the
// chief naming the directory. A ps killed mid-training and started again: the
// MonitoredTrainingSession of every worker reconnects the job, restores the newest checkpoint
// and finishes with the values its global step implies.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"

namespace {

using Catch::Matchers::Contains;
using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;
using Report = std::function<void(const std::string&)>;

// run_ranks' TF_CONFIG (N workers) with the last task as the only ps.
std::string with_ps(const std::string& tf_config, int rank) {
  nlohmann::json j = nlohmann::json::parse(tf_config);
  std::vector<std::string> all = j["cluster"]["worker"].get<std::vector<std::string>>();
  const int workers = static_cast<int>(all.size()) - 1;
  nlohmann::json cluster;
  cluster["worker"] = std::vector<std::string>(all.begin(), all.begin() + workers);
  cluster["ps"] = std::vector<std::string>(all.begin() + workers, all.end());
  nlohmann::json task = {{"type", rank < workers ? "worker" : "ps"},
                         {"index", rank < workers ? rank : 0}};
  return nlohmann::json{{"cluster", cluster}, {"task", task}}.dump();
}

mwms::ParameterServerOptions options(mwms::OptimizerKind kind, double timeout = 20) {
  mwms::ParameterServerOptions o;
  o.sync_replicas = true;  // deterministic: every step is the mean of both workers' gradients
  o.optimizer.kind = kind;
  o.optimizer.learning_rate = 0.01;
  o.timeout_seconds = timeout;
  o.connect_timeout_seconds = 30;
  o.transport = mwms::TransportChoice::kShm;
  return o;
}

// Two small variables (one pack) and a large one (its own segment); the gradient is a function
// of the worker and the global step it was computed at, so two runs that reach a step by
// different paths (straight, or through a restore) must hold the same bits.
struct Model {
  std::vector<float> kernel = std::vector<float>(12), bias = std::vector<float>(5),
                     big = std::vector<float>(40000);
  std::vector<float> dk = std::vector<float>(12), db = std::vector<float>(5),
                     dbig = std::vector<float>(40000);
  void declare(mwms::ParameterServerStrategy& s) {
    auto init = [](float* v, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) v[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
    };
    s.create_variable({"dense/kernel", {4, 3}}, kernel.data(), dk.data(), init);
    s.create_variable({"dense/bias", {5}}, bias.data(), db.data(), init);
    s.create_variable({"big", {40000}}, big.data(), dbig.data(), init);
  }
  void set_gradient(int worker, std::int64_t step) {
    for (auto* g : {&dk, &db, &dbig}) {
      for (std::size_t i = 0; i < g->size(); ++i) {
        (*g)[i] = 0.01f * static_cast<float>((worker + 1) * (1 + (step + i) % 5)) - 0.02f;
      }
    }
  }
  // FNV-1a over the bits of every value.
  std::string hash() const {
    std::uint64_t h = 1469598103934665603ull;
    for (const auto* v : {&kernel, &bias, &big}) {
      for (float x : *v) {
        std::uint32_t b;
        std::memcpy(&b, &x, 4);
        for (int k = 0; k < 4; ++k) {
          h ^= (b >> (8 * k)) & 0xff;
          h *= 1099511628211ull;
        }
      }
    }
    char text[32];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
    return text;
  }
};

std::string field(const std::string& output, const std::string& key) {
  const std::size_t at = output.find(key + "=");
  if (at == std::string::npos) return "";
  const std::size_t end = output.find_first_of(" \n", at);
  return output.substr(at + key.size() + 1, end == std::string::npos ? end : end - at - key.size() - 1);
}

std::string make_dir() {
  char tmpl[] = "/tmp/mwms_ps_ckpt_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

// One job of 2 workers + 1 ps: the chief restores from `dir` (when `restore`), every worker
// trains up to `steps` global steps, the chief saves at each step in `saves`; every worker
// reports step=<restored step> end=<final step> hash=<values>.
std::vector<ChildResult> job(const std::string& dir, bool restore, std::int64_t steps,
                             std::vector<std::int64_t> saves,
                             mwms::OptimizerKind kind = mwms::OptimizerKind::kAdam) {
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 90;
  return run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
    mwms::ParameterServerStrategy s(mwms::resolve_tf_config(with_ps(tf, rank)),
                                    options(kind));
    if (s.is_ps()) {
      s.join();
      return;
    }
    Model m;
    m.declare(s);
    const std::int64_t start = s.initialize(restore ? dir : std::string());
    if (s.is_chief() && restore) report("restored_from=" + s.restored_from() + " ");
    while (s.global_step() < steps) {
      m.set_gradient(rank, s.global_step());
      s.apply_gradients();
      for (std::int64_t at : saves) {
        if (s.is_chief() && s.global_step() == at) s.save_checkpoint(dir, 5);
      }
    }
    report("step=" + std::to_string(start) + " end=" + std::to_string(s.global_step()) +
           " hash=" + m.hash());
    s.finalize();
  });
}

void flip_byte(const std::string& path, long offset) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  REQUIRE(f != nullptr);
  REQUIRE(std::fseek(f, offset, SEEK_SET) == 0);
  const int c = std::fgetc(f);
  REQUIRE(std::fseek(f, offset, SEEK_SET) == 0);
  std::fputc(c ^ 0x10, f);
  std::fclose(f);
}

}  // namespace

TEST_CASE("ps checkpoints restore values, Adam slots and global step bit for bit",
          "[multiproc][ps]") {
  const std::string dir = make_dir();
  // Straight through 10 steps: the reference; also writes the checkpoints of steps 5 and 10.
  auto a = job(dir, false, 10, {5, 10});
  for (const ChildResult& r : a) {
    INFO("rank " << r.rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
  }
  const std::string reference = field(a[0].output, "hash");
  REQUIRE(!reference.empty());
  CHECK(field(a[1].output, "hash") == reference);
  std::ifstream manifest(dir + "/model.ckpt-10.manifest");
  CHECK(manifest.good());
  CHECK(std::ifstream(dir + "/model.ckpt-10.ps-0-of-1").good());

  // A new job restores step 10 exactly: the same bits without a step.
  auto b = job(dir, true, 10, {});
  for (const ChildResult& r : b) {
    INFO("rank " << r.rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
  }
  for (int w = 0; w < 2; ++w) {
    CHECK(field(b[w].output, "step") == "10");
    CHECK(field(b[w].output, "hash") == reference);
  }
  CHECK_THAT(b[0].output, Contains("model.ckpt-10.manifest"));

  // The newest shard file damaged: the chief falls back to step 5, and five more steps reach
  // the reference bits again (slots and Adam's t restored, not reset).
  flip_byte(dir + "/model.ckpt-10.ps-0-of-1", 200);
  auto c = job(dir, true, 10, {});
  for (const ChildResult& r : c) {
    INFO("rank " << r.rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
  }
  for (int w = 0; w < 2; ++w) {
    CHECK(field(c[w].output, "step") == "5");
    CHECK(field(c[w].output, "hash") == reference);
  }
  CHECK_THAT(c[0].output, Contains("model.ckpt-5.manifest"));

  // Nothing usable: the chief fails naming the directory and each checkpoint's fault; the
  // others fail naming the chief, never train from scratch.
  flip_byte(dir + "/model.ckpt-5.manifest", 20);
  auto d = job(dir, true, 10, {});
  INFO("chief: " << d[0].output);
  CHECK(d[0].exit_code == 1);
  CHECK_THAT(d[0].output, Contains("no usable checkpoint in " + dir) && Contains("step 10") &&
                              Contains("step 5"));
  CHECK(d[1].exit_code == 1);
  CHECK(std::system(("rm -rf " + dir).c_str()) == 0);
}

TEST_CASE("a ps killed and started again: the session reconnects, restores and finishes",
          "[multiproc][ps][fault]") {
  const std::string dir = make_dir();
  const std::int64_t last_step = 60;
  LaunchOptions opts;
  opts.world_size = 3;
  opts.timeout_seconds = 120;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
    const mwms::ResolvedCluster cluster = mwms::resolve_tf_config(with_ps(tf, rank));
    const mwms::ParameterServerOptions o = options(mwms::OptimizerKind::kMomentum, 4);
    Model m;
    if (cluster.task.type == "ps") {
      // The first incarnation runs in a child that is SIGKILLed once step 20's checkpoint
      // exists; then this process is the ps started again on the same address.
      const pid_t first = ::fork();
      if (first == 0) {
        mwms::ParameterServerSessionCreator c(cluster, o, {});
        c.join(0);
        ::_exit(0);
      }
      for (int i = 0; i < 3000 && mwms::latest_checkpoint(dir).find("ckpt-20.") ==
                                      std::string::npos; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::kill(first, SIGKILL);
      int status = 0;
      ::waitpid(first, &status, 0);
      report("killed_first ");
      mwms::ParameterServerSessionCreator again(cluster, o, {});
      const mwms::ParameterServerStats st = again.join(1);
      report("served_to=" + std::to_string(st.global_step));
      return;
    }
    mwms::ParameterServerSessionCreator creator(
        cluster, o, [&](mwms::ParameterServerStrategy& s) { m.declare(s); });
    mwms::MonitoredTrainingSessionOptions so;
    so.checkpoint_dir = dir;
    so.save_checkpoint_steps = 10;
    so.max_recoveries = 1;
    so.hooks = {std::make_shared<mwms::StopAtStepHook>(0, last_step)};
    mwms::MonitoredTrainingSession session(creator, so);
    std::int64_t restored = -1;
    while (!session.should_stop()) {
      const mwms::SessionRunValues v = session.run([&](std::int64_t step) {
        m.set_gradient(rank, step);
        creator.strategy().apply_gradients();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return 0.0;
      });
      if (v.recovered) restored = v.global_step;
    }
    const std::int64_t end = session.global_step();
    session.close();
    report("recoveries=" + std::to_string(session.recoveries()) + " restored=" +
           std::to_string(restored) + " end=" + std::to_string(end) + " hash=" + m.hash() + " ");
  });
  for (const ChildResult& r : results) {
    INFO("rank " << r.rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
  }
  CHECK_THAT(results[2].output, Contains("killed_first"));
  for (int w = 0; w < 2; ++w) {
    INFO("worker " << w << ": " << results[w].output);
    CHECK(field(results[w].output, "recoveries") == "1");
    // Restored from a checkpoint at or after step 20 (the kill came once it existed).
    CHECK(std::stoll(field(results[w].output, "restored")) >= 20);
    CHECK(field(results[w].output, "end") == std::to_string(last_step));
  }
  CHECK_THAT(results[2].output, Contains("served_to=" + std::to_string(last_step)));
  // The same bits as a job that never failed: the restored step's state was exactly the
  // checkpoint's, and every later step's gradient depends on the step alone.
  const std::string straight = make_dir();
  auto reference = job(straight, false, last_step, {}, mwms::OptimizerKind::kMomentum);
  REQUIRE(reference[0].exit_code == 0);
  CHECK(field(results[0].output, "hash") == field(reference[0].output, "hash"));
  CHECK(field(results[1].output, "hash") == field(reference[0].output, "hash"));
  CHECK(std::system(("rm -rf " + dir + " " + straight).c_str()) == 0);
}
