// Parameter-server training with real processes (mwms/parameter_server.h, issue 16): ps and
// worker tasks from one TF_CONFIG, synchronous and asynchronous updates with exact expected
// values, backup workers, the max_staleness bound, a worker whose variables differ from the
// chief's, and the faults: a ps killed (every worker fails naming it), a worker killed in
// asynchronous mode (the others finish, the ps names whom it lost). Over shared memory and TCP.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/launcher.h"
#include "multiproc/ps_test_util.h"
#include "mwms/mwms.h"

namespace {

using Catch::Matchers::Contains;
using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;
using Report = std::function<void(const std::string&)>;
using mwms::testing::ps::Model;
using mwms::testing::ps::name;
using mwms::testing::ps::ps_options;
using mwms::testing::ps::ps_tf_config;
using mwms::testing::ps::seconds_since;
using mwms::testing::ps::stats_text;

}  // namespace

TEST_CASE("synchronous ps: every global step averages every worker's gradient",
          "[multiproc][ps]") {
  for (auto transport : {mwms::TransportChoice::kShm, mwms::TransportChoice::kTcp}) {
    for (auto [workers, num_ps] : {std::pair{2, 1}, std::pair{3, 2}}) {
      INFO(name(transport) << ", " << workers << " workers, " << num_ps << " ps");
      LaunchOptions opts;
      opts.world_size = workers + num_ps;
      opts.timeout_seconds = 90;
      const int steps = 5;
      auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
        mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)),
                                        ps_options(transport, true));
        if (s.is_ps()) {
          report(stats_text(s.join()));
          return;
        }
        Model m;
        m.declare(s);
        if (s.initialize() != 0) throw std::runtime_error("a fresh job starts at step 0");
        std::string why;
        if (!m.equals(0, 0.25f, 0, &why)) throw std::runtime_error("initial values: " + why);
        m.set_gradient(static_cast<float>(rank + 1));
        for (int i = 0; i < steps; ++i) s.apply_gradients();
        // The mean of 1..workers, as the ps computes it: the sum divided by the count.
        float sum = 0;
        for (int w = 0; w < workers; ++w) sum += static_cast<float>(w + 1);
        const float mean = sum / static_cast<float>(workers);
        if (!m.equals(steps, 0.25f, mean, &why)) throw std::runtime_error(why);
        report("step=" + std::to_string(s.global_step()) +
               " dropped=" + std::to_string(s.stats().dropped_stale) +
               " shared=" + std::to_string(s.stats().shared_value_replies));
        s.finalize();
      });
      // Note [ps shared values]: over shared memory each worker's initial pull and 5 replies per
      // ps come through the ps's memory; over TCP none.
      const bool shared = transport == mwms::TransportChoice::kShm;
      const std::string per_worker = std::to_string(shared ? 6 * num_ps : 0);
      const std::string per_ps = std::to_string(shared ? 6 * workers : 0);
      for (const ChildResult& r : results) {
        INFO("rank " << r.rank << ": " << r.output);
        REQUIRE(r.exit_code == 0);
        if (r.rank < workers) {
          CHECK_THAT(r.output, Contains("step=5 dropped=0 shared=" + per_worker));
        } else {
          CHECK_THAT(r.output, Contains("step=5 pushes=" + std::to_string(5 * workers) +
                                        " applied=" + std::to_string(5 * workers) +
                                        " dropped=0"));
          CHECK_THAT(r.output, Contains(" shared=" + per_ps));
        }
      }
    }
  }
}

TEST_CASE("asynchronous ps: every push is applied on arrival, staleness counted",
          "[multiproc][ps]") {
  for (auto transport : {mwms::TransportChoice::kShm, mwms::TransportChoice::kTcp}) {
    INFO(name(transport));
    const int workers = 2, num_ps = 2, steps = 6;
    LaunchOptions opts;
    opts.world_size = workers + num_ps;
    opts.timeout_seconds = 90;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
      mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)),
                                      ps_options(transport, false));
      if (s.is_ps()) {
        report(stats_text(s.join()));
        return;
      }
      Model m;
      m.declare(s);
      s.initialize();
      m.set_gradient(1.0f);
      for (int i = 0; i < steps; ++i) s.apply_gradients();
      // Once both workers are done (they push in a few ms), a pull sees all 12 updates on
      // every ps.
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      s.pull();
      std::string why;
      if (!m.equals(workers * steps, 0.25f, 1.0f, &why)) throw std::runtime_error(why);
      report("step=" + std::to_string(s.global_step()));
      // The chief's goodbye ends the job: the other worker has pulled by then.
      if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      s.finalize();
    });
    for (const ChildResult& r : results) {
      INFO("rank " << r.rank << ": " << r.output);
      REQUIRE(r.exit_code == 0);
      if (r.rank >= workers) {
        CHECK_THAT(r.output, Contains("step=12 pushes=12 applied=12 dropped=0 held=0 "
                                      "staleness_total=12"));
      } else {
        CHECK_THAT(r.output, Contains("step=12"));
      }
    }
  }
}

TEST_CASE("synchronous ps with a backup worker: the slowest gradient is dropped, nobody waits",
          "[multiproc][ps]") {
  const int workers = 3, num_ps = 1;
  LaunchOptions opts;
  opts.world_size = workers + num_ps;
  opts.timeout_seconds = 90;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
    auto o = ps_options(mwms::TransportChoice::kShm, true);
    o.replicas_to_aggregate = 2;  // total_num_replicas 3: one backup worker
    mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)), o);
    if (s.is_ps()) {
      report(stats_text(s.join()));
      return;
    }
    Model m;
    m.declare(s);
    s.initialize();
    m.set_gradient(1.0f);
    const auto start = std::chrono::steady_clock::now();
    // Worker 2 is slow: the one gradient it computes (on version 0) arrives after the two others
    // completed several steps, so SyncReplicasOptimizer drops it as stale; the others never
    // wait for it (replicas_to_aggregate 2).
    const int steps = rank == 2 ? 1 : 6;
    for (int i = 0; i < steps && !s.should_stop(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rank == 2 ? 400 : 100));
      s.apply_gradients();
    }
    report("step=" + std::to_string(s.global_step()) +
           " dropped=" + std::to_string(s.stats().dropped_stale) +
           " seconds=" + std::to_string(seconds_since(start)));
    s.finalize();
  });
  for (const ChildResult& r : results) {
    INFO("rank " << r.rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
    if (r.rank == 2) CHECK_THAT(r.output, Contains("dropped=1"));
    if (r.rank < 2) CHECK_THAT(r.output, Contains("dropped=0"));
    if (r.rank == 3) CHECK_THAT(r.output, Contains("step=6 pushes=13 applied=12 dropped=1"));
  }
}

TEST_CASE("asynchronous ps with max_staleness holds back the worker that runs ahead",
          "[multiproc][ps]") {
  const int workers = 2, num_ps = 1;
  LaunchOptions opts;
  opts.world_size = workers + num_ps;
  opts.timeout_seconds = 90;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
    auto o = ps_options(mwms::TransportChoice::kShm, false);
    o.max_staleness = 0;  // no worker more than 0 pushes ahead of the slowest
    mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)), o);
    if (s.is_ps()) {
      report(stats_text(s.join()));
      return;
    }
    Model m;
    m.declare(s);
    s.initialize();
    m.set_gradient(1.0f);
    for (int i = 0; i < 5; ++i) {
      // Far behind the chief, so the chief's push is ahead (and held) even on a loaded machine
      // under ASan, where 100 ms was once not enough.
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      s.apply_gradients();
    }
    report("step=" + std::to_string(s.global_step()));
    s.finalize();
  });
  for (const ChildResult& r : results) {
    INFO("rank " << r.rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
    if (r.rank == 2) {
      CHECK_THAT(r.output, Contains("step=10 pushes=10 applied=10"));
      CHECK_THAT(r.output, !Contains("held=0"));
    }
  }
}

TEST_CASE("a worker whose variables differ from the chief's is refused naming the difference",
          "[multiproc][ps]") {
  const int workers = 2, num_ps = 1;
  LaunchOptions opts;
  opts.world_size = workers + num_ps;
  opts.timeout_seconds = 90;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
    mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)),
                                    ps_options(mwms::TransportChoice::kShm, false));
    if (s.is_ps()) {
      report(stats_text(s.join()));
      return;
    }
    std::vector<float> v(rank == 0 ? 12 : 13), g(v.size());
    s.create_variable({"w", {static_cast<std::int64_t>(v.size())}}, v.data(), g.data());
    try {
      s.initialize();
    } catch (const mwms::CollectiveMismatchError& e) {
      report(std::string("mismatch: ") + e.what());
      return;
    }
    for (int i = 0; i < 3; ++i) s.apply_gradients();
    s.finalize();
    report("trained");
  });
  for (const ChildResult& r : results) {
    INFO("rank " << r.rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
  }
  CHECK_THAT(results[1].output, Contains("mismatch") && Contains("ps 0") &&
                                    Contains("12 elements") && Contains("13 elements"));
  CHECK_THAT(results[0].output, Contains("trained"));
  CHECK_THAT(results[2].output, Contains("lost=worker 1"));
}

TEST_CASE("a ps killed mid-training: every worker fails naming it within the timeout",
          "[multiproc][ps][fault]") {
  for (auto transport : {mwms::TransportChoice::kShm, mwms::TransportChoice::kTcp}) {
    INFO(name(transport));
    const int workers = 2, num_ps = 1;
    const double timeout = 5;
    LaunchOptions opts;
    opts.world_size = workers + num_ps;
    opts.timeout_seconds = 90;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
      mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)),
                                      ps_options(transport, transport == mwms::TransportChoice::kShm, timeout));
      if (s.is_ps()) {
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          ::raise(SIGKILL);
        }).detach();
        s.join();
        return;
      }
      Model m;
      m.declare(s);
      s.initialize();
      m.set_gradient(1.0f);
      const auto start = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 100000; ++i) {
          s.apply_gradients();
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      } catch (const mwms::PeerError& e) {
        report(std::string("failed after ") + std::to_string(seconds_since(start)) + " s: " +
               e.what());
        return;
      }
      report("trained without noticing");
    });
    REQUIRE(results[2].signal == SIGKILL);
    for (int r = 0; r < workers; ++r) {
      INFO("rank " << r << ": " << results[r].output);
      CHECK(results[r].exit_code == 0);
      CHECK_THAT(results[r].output, Contains("failed after") && Contains("ps 0"));
      // The ps dies ~1.5 s after it connected, about when the workers' loops start.
      const std::size_t at = results[r].output.find("failed after ");
      REQUIRE(at != std::string::npos);
      CHECK(std::stod(results[r].output.substr(at + 13)) < 1.5 + timeout + 1);
    }
  }
}

TEST_CASE("a worker killed in asynchronous mode: the others finish, the ps names whom it lost",
          "[multiproc][ps][fault]") {
  const int workers = 3, num_ps = 1;
  LaunchOptions opts;
  opts.world_size = workers + num_ps;
  opts.timeout_seconds = 90;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
    mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)),
                                    ps_options(mwms::TransportChoice::kShm, false, 10));
    if (s.is_ps()) {
      report(stats_text(s.join()));
      return;
    }
    Model m;
    m.declare(s);
    s.initialize();
    m.set_gradient(1.0f);
    for (int i = 0; i < 30; ++i) {
      if (rank == 1 && i == 3) ::raise(SIGKILL);
      s.apply_gradients();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // The chief's finalize() ends the job (should_stop on the others): on a loaded machine the
    // other survivor may still be training, so the chief waits until every push of the survivors
    // (30 + 30) and of the killed worker (3) has been applied before it says goodbye.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (s.is_chief() && s.pull() < 63 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    report("step=" + std::to_string(s.global_step()));
    s.finalize();
  });
  CHECK(results[1].signal == SIGKILL);
  for (int r : {0, 2, 3}) {
    INFO("rank " << r << ": " << results[r].output);
    CHECK(results[r].exit_code == 0);
  }
  CHECK_THAT(results[3].output, Contains("pushes=63") && Contains("lost=worker 1"));
}

TEST_CASE("ps-sync with replicas_to_aggregate == workers gives the all-reduce strategy's weights",
          "[multiproc][ps]") {
  // Least squares on fixed data, momentum 0.9: each worker's gradient over its half of every
  // global batch. The all-reduce strategy sums the workers' gradients (each scaled by 1 / global
  // batch) and applies the library's momentum update on every worker; the ps mean of the same
  // gradients scaled by workers / global batch is the same sum (scaling by 2 is exact), and the
  // ps applies the same update: the weights must agree bit for bit.
  // Both with the ps's values in shared memory (Note [ps shared values]) and through the links.
  const int workers = 2, num_ps = 1, features = 64, outputs = 8, global = 32, steps = 20;
  for (const std::string shared : {"1", "0"}) {
    INFO("MWMS_PS_SHARED_VALUES=" << shared);
    LaunchOptions opts;
    opts.world_size = workers + num_ps;
    opts.timeout_seconds = 90;
    opts.extra_ports = workers;  // the all-reduce job's own cluster
    auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
      ::setenv("MWMS_PS_SHARED_VALUES", shared.c_str(), 1);
      auto data = [](int row, int col) {
        return static_cast<float>((row * 7 + col * 3) % 11) / 11.0f - 0.5f;
      };
      mwms::OptimizerOptions opt;
      opt.kind = mwms::OptimizerKind::kMomentum;
      opt.learning_rate = 0.05;
      opt.momentum = 0.9;
      std::vector<float> w(features * outputs, 0.0f), g(w.size());
      // Sum over rows [begin, end) of the batch of step s of d/dw 0.5 |x w - y|^2, times scale.
      auto gradient = [&](int step, int begin, int end, float scale) {
        std::fill(g.begin(), g.end(), 0.0f);
        for (int r = begin; r < end; ++r) {
          const int row = step * global + r;
          for (int o = 0; o < outputs; ++o) {
            float pred = 0;
            for (int f = 0; f < features; ++f) pred += data(row, f) * w[f * outputs + o];
            const float err = pred - data(row, features + o);
            for (int f = 0; f < features; ++f) g[f * outputs + o] += data(row, f) * err;
          }
        }
        for (float& x : g) x *= scale;
      };
      const int begin = rank * global / workers, end = (rank + 1) * global / workers;
      std::vector<float> reference;
      if (rank < workers) {
        mwms::MultiWorkerMirroredStrategy mwms_strategy(mwms::resolve_tf_config(
            mwms::testing::make_tf_config(mwms::testing::extra_ports(), rank, false)));
        std::vector<float> velocity(w.size(), 0.0f);
        float* slots[] = {velocity.data()};
        for (int s = 0; s < steps; ++s) {
          gradient(s, begin, end, 1.0f / global);
          mwms_strategy.all_reduce_gradients({{g.data(), g.size(), mwms::DataType::kFloat32}});
          mwms::apply_gradient(opt, w.data(), g.data(), slots, w.size(), s + 1);
        }
        mwms_strategy.finalize();
        reference = w;
        std::fill(w.begin(), w.end(), 0.0f);
      }
      auto o = ps_options(mwms::TransportChoice::kShm, true);
      o.optimizer = opt;
      mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)), o);
      if (s.is_ps()) {
        report(stats_text(s.join()));
        return;
      }
      s.create_variable({"dense/kernel", {features, outputs}}, w.data(), g.data());
      s.initialize();
      for (int step = 0; step < steps; ++step) {
        gradient(step, begin, end, static_cast<float>(workers) / global);
        s.apply_gradients();
      }
      s.finalize();
      std::size_t differ = 0;
      for (std::size_t i = 0; i < w.size(); ++i) differ += w[i] != reference[i];
      report("differ=" + std::to_string(differ) + " w0=" + std::to_string(w[0]) +
             " ref0=" + std::to_string(reference[0]) +
             " shared=" + std::to_string(s.stats().shared_value_replies));
    });
    for (const ChildResult& r : results) {
      INFO("rank " << r.rank << ": " << r.output);
      REQUIRE(r.exit_code == 0);
      // The initial pull and one reply per step.
      const std::string replies = shared == "1" ? std::to_string(steps + 1) : "0";
      if (r.rank < workers)
        CHECK_THAT(r.output, Contains("differ=0 ") && Contains("shared=" + replies));
    }
  }
}

// Worker 1 of a synchronous 2-worker, 1-ps job pushes 32 MiB gradients of `grad1` (worker 0's
// are 1.0) a few ms after worker 0, so its push is a step's second, and kills itself after
// `kill_ms`: most such points fall in the middle of a push. Worker 0 then pulls and runs `check`
// on the values (it throws to fail). rank 0's output says "consistent ..." when check passed.
std::vector<ChildResult> kill_worker_mid_push(
    int kill_ms, float grad1,
    const std::function<std::string(const std::vector<float>&, std::int64_t)>& check) {
  const int workers = 2, num_ps = 1;
  const std::size_t n = std::size_t{8} << 20;
  LaunchOptions opts;
  opts.world_size = workers + num_ps;
  opts.timeout_seconds = 90;
  auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
    mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)),
                                    ps_options(mwms::TransportChoice::kShm, true, 10));
    if (s.is_ps()) {
      report(stats_text(s.join()));
      return;
    }
    std::vector<float> value(n, 0.0f), grad(n, rank == 1 ? grad1 : 1.0f);
    s.create_variable({"big", {static_cast<std::int64_t>(n)}}, value.data(), grad.data(),
                      [](float* v, std::size_t count) { std::fill(v, v + count, 0.0f); });
    s.initialize();
    if (rank == 1) {
      std::thread([kill_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(kill_ms));
        ::raise(SIGKILL);
      }).detach();
    }
    for (int i = 0; i < 25; ++i) {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      s.apply_gradients();
    }
    s.pull();
    report("consistent " + check(value, s.global_step()));
    s.finalize();
  });
  CHECK(results[1].signal == SIGKILL);
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << results[r].output);
    CHECK(results[r].exit_code == 0);
  }
  CHECK_THAT(results[0].output, Contains("consistent at step"));
  CHECK_THAT(results[2].output, Contains("lost=worker 1"));
  return results;
}

TEST_CASE("a worker killed in the middle of a synchronous push: its partial sum is never applied",
          "[multiproc][ps][fault]") {
  // Note [ps streamed apply], Note [ps fused step]: pushes are summed straight from the link, and
  // the one that completes a step is applied as it arrives. Every gradient is 1.0, so every
  // applied step moves every element by exactly lr (each element gets the mean of the gradients
  // that reached it), and a partial sum applied as if whole (divided by 2 where only one
  // gradient arrived) would leave elements that disagree.
  for (int kill_ms : {20, 45, 80, 120}) {
    INFO("worker 1 killed after " << kill_ms << " ms");
    kill_worker_mid_push(kill_ms, 1.0f, [](const std::vector<float>& value, std::int64_t step) {
      const float want = -0.25f * static_cast<float>(step);
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (value[i] != want) {
          throw std::runtime_error("element " + std::to_string(i) + " is " +
                                   std::to_string(value[i]) + " after " + std::to_string(step) +
                                   " steps, expected " + std::to_string(want));
        }
      }
      return "at step " + std::to_string(step);
    });
  }
}

TEST_CASE("a worker killed in the middle of the push that completes a synchronous step: each "
          "element gets the mean of the gradients that reached it",
          "[multiproc][ps][fault]") {
  // Note [ps fused step]: worker 1's push (gradients 3.0) is applied as it arrives onto worker
  // 0's (1.0). Killed in the middle, the elements it reached get the mean 2.0 and the rest worker
  // 0's 1.0; a partial sum divided by the full count would give 0.5 there. With lr 0.25 every
  // element is then -0.25 * (2 * both + alone), a multiple of 0.25, and no element behind the
  // push's front moved more than one ahead of it.
  for (int kill_ms : {45, 80}) {
    INFO("worker 1 killed after " << kill_ms << " ms");
    kill_worker_mid_push(kill_ms, 3.0f, [](const std::vector<float>& value, std::int64_t step) {
      for (std::size_t i = 0; i < value.size(); ++i) {
        const float quarters = value[i] / -0.25f;
        if (quarters != static_cast<float>(static_cast<long>(quarters)) ||
            (i > 0 && value[i] < value[i - 1])) {
          throw std::runtime_error("element " + std::to_string(i) + " is " +
                                   std::to_string(value[i]) + " after element " +
                                   std::to_string(i > 0 ? value[i - 1] : 0.0f));
        }
      }
      return "at step " + std::to_string(step) + " first " + std::to_string(value.front()) +
             " last " + std::to_string(value.back());
    });
  }
}

// A synchronous push made stale by a completed step is received whole (not streamed); it may
// complete while the next push streams and must not end that stream (it once did: the ps then
// let the held replies out half-updated and crashed on the stream's next bytes). Worker 1 is
// slow (replicas_to_aggregate = 1), so most of its pushes are stale; every reply must hold
// exactly -lr x g x step, both with the ps's values shared and through the links.
TEST_CASE("a stale push received whole while the next push streams leaves that stream alone",
          "[multiproc][ps]") {
  const int workers = 2, num_ps = 1;
  for (const std::string shared : {"1", "0"}) {
    INFO("MWMS_PS_SHARED_VALUES=" << shared);
    LaunchOptions opts;
    opts.world_size = workers + num_ps;
    opts.timeout_seconds = 120;
    auto results = run_ranks(opts, [&](int rank, const std::string& tf, const Report& report) {
      ::setenv("MWMS_PS_SHARED_VALUES", shared.c_str(), 1);
      auto o = ps_options(mwms::TransportChoice::kShm, true, 30);
      o.replicas_to_aggregate = 1;
      mwms::ParameterServerStrategy s(mwms::resolve_tf_config(ps_tf_config(tf, rank, num_ps)), o);
      if (s.is_ps()) {
        report(stats_text(s.join()));
        return;
      }
      const std::size_t n = std::size_t{1} << 22;  // 16 MB: a push takes milliseconds
      std::vector<float> v(n), g(n, 1.0f);
      s.create_variable({"big", {static_cast<std::int64_t>(n)}}, v.data(), g.data(),
                        [](float* p, std::size_t k) { std::fill(p, p + k, 0.0f); });
      s.initialize();
      int bad = 0;
      const int steps = rank == 0 ? 60 : 15;
      for (int i = 0; i < steps && !s.should_stop(); ++i) {
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const std::int64_t step = s.apply_gradients();
        float want = 0;  // as the ps computes it: one SGD step of lr 0.25 per global step
        for (std::int64_t k = 0; k < step; ++k) want -= 0.25f;
        for (std::size_t k = 0; k < n; k += 4093) bad += v[k] != want;
      }
      report("bad=" + std::to_string(bad) + " dropped=" + std::to_string(s.stats().dropped_stale));
      if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      s.finalize();
    });
    for (const ChildResult& r : results) {
      INFO("rank " << r.rank << ": " << r.output);
      REQUIRE(r.exit_code == 0);
      if (r.rank < workers) CHECK_THAT(r.output, Contains("bad=0 "));
    }
    CHECK_THAT(results[1].output, !Contains("dropped=0"));  // the case happened
  }
}
