// Helpers of the multi-process parameter-server tests (ps_test.cc, ps_end_test.cc): a TF_CONFIG
// with a ps job, the options, a small model with exact expected values, and the ps's counters
// as text.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mwms/mwms.h"

namespace mwms::testing::ps {

// The TF_CONFIG of run_ranks (N workers) with its last `num_ps` tasks made the ps job.
inline std::string ps_tf_config(const std::string& tf_config, int rank, int num_ps) {
  nlohmann::json j = nlohmann::json::parse(tf_config);
  std::vector<std::string> all = j["cluster"]["worker"].get<std::vector<std::string>>();
  const int workers = static_cast<int>(all.size()) - num_ps;
  nlohmann::json cluster;
  cluster["worker"] = std::vector<std::string>(all.begin(), all.begin() + workers);
  cluster["ps"] = std::vector<std::string>(all.begin() + workers, all.end());
  nlohmann::json task;
  task["type"] = rank < workers ? "worker" : "ps";
  task["index"] = rank < workers ? rank : rank - workers;
  return nlohmann::json{{"cluster", cluster}, {"task", task}}.dump();
}

inline mwms::ParameterServerOptions ps_options(mwms::TransportChoice transport, bool sync,
                                               double timeout = 20) {
  mwms::ParameterServerOptions o;
  o.sync_replicas = sync;
  o.optimizer.kind = mwms::OptimizerKind::kSgd;
  o.optimizer.learning_rate = 0.25;  // a power of two: the expected values are exact
  o.timeout_seconds = timeout;
  o.connect_timeout_seconds = 20;
  o.transport = transport;
  return o;
}

inline const char* name(mwms::TransportChoice t) {
  return t == mwms::TransportChoice::kShm ? "shm" : "tcp";
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A small model: two small variables (the pack) and one large one (sent alone, Note [ps
// segments]); initial values i * 0.25 on the chief, garbage elsewhere (the pull overwrites it).
struct Model {
  std::vector<float> kernel = std::vector<float>(15), bias = std::vector<float>(7),
                     big = std::vector<float>(70000);
  std::vector<float> dk = std::vector<float>(15), db = std::vector<float>(7),
                     dbig = std::vector<float>(70000);
  void declare(mwms::ParameterServerStrategy& s) {
    auto init = [](float* v, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.25f;
    };
    for (auto* v : {&kernel, &bias, &big}) std::fill(v->begin(), v->end(), -7.0f);
    s.create_variable({"dense/kernel", {5, 3}}, kernel.data(), dk.data(), init);
    s.create_variable({"dense/bias", {7}}, bias.data(), db.data(), init);
    s.create_variable({"big", {70000}}, big.data(), dbig.data(), init);
  }
  void set_gradient(float g) {
    for (auto* v : {&dk, &db, &dbig}) std::fill(v->begin(), v->end(), g);
  }
  // Every element equals i * 0.25 - steps * lr * g, computed as the ps does (float32).
  bool equals(int steps, float lr, float g, std::string* why) const {
    const std::vector<const std::vector<float>*> vars = {&kernel, &bias, &big};
    for (const auto* v : vars) {
      for (std::size_t i = 0; i < v->size(); ++i) {
        float want = static_cast<float>(i) * 0.25f;
        for (int s = 0; s < steps; ++s) want -= lr * g;
        if ((*v)[i] != want) {
          *why = "element " + std::to_string(i) + " is " + std::to_string((*v)[i]) + ", expected " +
                 std::to_string(want);
          return false;
        }
      }
    }
    return true;
  }
};

inline std::string stats_text(const mwms::ParameterServerStats& s) {
  long long hist = 0;
  for (auto c : s.staleness_histogram) hist += c;
  std::string lost;
  for (const auto& w : s.lost_workers) lost += " lost=" + w;
  return "step=" + std::to_string(s.global_step) + " pushes=" + std::to_string(s.pushes) +
         " applied=" + std::to_string(s.applied) + " dropped=" + std::to_string(s.dropped_stale) +
         " held=" + std::to_string(s.held_back) + " staleness_total=" + std::to_string(hist) +
         lost + " shared=" + std::to_string(s.shared_value_replies) +
         " after_end=" + std::to_string(s.after_end);
}

}  // namespace mwms::testing::ps
