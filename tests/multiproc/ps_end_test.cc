// How a parameter-server job ends (mwms/parameter_server.h): the chief's goodbye stops every
// other worker (should_stop), and the ps accounts for every gradient it received.
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "multiproc/launcher.h"
#include "multiproc/ps_test_util.h"
#include "mwms/mwms.h"

namespace {

using Catch::Matchers::Contains;
using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;
using mwms::testing::ps::Model;
using mwms::testing::ps::name;
using mwms::testing::ps::ps_options;
using mwms::testing::ps::ps_tf_config;
using mwms::testing::ps::stats_text;
using Report = std::function<void(const std::string&)>;

// The integer after "key=" in `text`; -1 when absent.
long long field(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(" " + key + "=");
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + key.size() + 2));
}

}  // namespace

TEST_CASE(
    "the chief ending an asynchronous job stops the other worker, and the ps accounts for "
    "every push",
    "[multiproc][ps]") {
  for (auto transport : {mwms::TransportChoice::kShm, mwms::TransportChoice::kTcp}) {
    INFO(name(transport));
    const int workers = 2, num_ps = 1;
    LaunchOptions opts;
    opts.world_size = workers + num_ps;
    opts.timeout_seconds = 90;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
      mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)),
                                      ps_options(transport, false));
      if (s.is_ps()) {
        report("ps " + stats_text(s.join()));
        return;
      }
      Model m;
      m.declare(s);
      s.initialize();
      m.set_gradient(1.0f);
      if (rank == 0) {  // the chief: 3 pushes, then its goodbye ends the job
        for (int i = 0; i < 3; ++i) s.apply_gradients();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        report("chief pushes=" + std::to_string(s.stats().pushes));
        s.finalize();
        return;
      }
      // The other worker pushes until a reply says the job ended (it never pulls).
      int pushes = 0;
      while (!s.should_stop() && pushes < 20000) {
        s.apply_gradients();
        ++pushes;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      bool refused = false;
      try {
        s.apply_gradients();
      } catch (const mwms::InvalidUsage&) {
        refused = true;  // after the end, a push is a caller's error, not a hang
      }
      report("worker stopped=" + std::to_string(s.should_stop() ? 1 : 0) +
             " pushes=" + std::to_string(pushes) + " refused=" + std::to_string(refused ? 1 : 0));
      s.finalize();
    });
    for (const ChildResult& r : results) {
      INFO("rank " << r.rank << ": " << r.output);
      REQUIRE(r.exit_code == 0);
    }
    const std::string& worker = results[1].output;
    const std::string& ps = results[2].output;
    INFO("worker: " << worker << "; ps: " << ps);
    CHECK_THAT(worker, Contains("stopped=1") && Contains("refused=1"));
    const long long worker_pushes = field(worker, "pushes");
    CHECK(worker_pushes < 20000);
    // Every push the ps received: the chief's 3 and every one of the worker's; each applied, or
    // (the one that learned of the end, at least) after the end.
    CHECK(field(ps, "pushes") == 3 + worker_pushes);
    CHECK(field(ps, "pushes") == field(ps, "applied") + field(ps, "after_end"));
    CHECK(field(ps, "after_end") >= 1);
    CHECK(field(ps, "dropped") == 0);
    CHECK(field(ps, "step") == field(ps, "applied"));
  }
}
