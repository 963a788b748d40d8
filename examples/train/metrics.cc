#include "metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace mwms::train {
namespace {

nlohmann::json to_json(const EpochStats& e) {
  return {{"epoch", e.epoch},
          {"steps", e.steps},
          {"train_loss", e.train_loss},
          {"test_accuracy", e.test_accuracy},
          {"seconds", e.seconds},
          {"images_per_sec", e.images_per_sec},
          {"allreduce_seconds", e.allreduce_seconds},
          {"allreduce_share", e.allreduce_share},
          {"exposed_allreduce_seconds", e.exposed_allreduce_seconds}};
}

}  // namespace

double mean_images_per_sec(const RunSummary& summary) {
  if (summary.per_epoch.empty()) return 0;
  double total = 0;
  for (const auto& e : summary.per_epoch) total += e.images_per_sec;
  return total / static_cast<double>(summary.per_epoch.size());
}

namespace {

// Writes `j` to `path` through a temporary file and rename(2), so that a reader never sees a
// half-written file. @throws std::runtime_error naming the file.
void write_json_atomically(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) {
      throw std::runtime_error("cannot create metrics file " + tmp + ": " + std::strerror(errno));
    }
    out << j.dump(2) << '\n';
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error("cannot write metrics file " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + why);
  }
}

// What a ps task served (RunSummary::ps_task): the job's settings and its counters only.
nlohmann::json ps_task_json(const RunSummary& s) {
  nlohmann::json j = {{"task", s.task},
                      {"mode", s.mode},
                      {"num_ps", s.num_ps},
                      {"world_size", s.world_size},
                      {"source", s.source},
                      {"model", s.model},
                      {"global_batch_size", s.global_batch_size},
                      {"learning_rate", s.learning_rate},
                      {"seed", s.seed},
                      {"global_step", s.global_step},
                      {"pushes", s.pushes},
                      {"applied", s.applied},
                      {"dropped_stale", s.dropped_stale},
                      {"after_end", s.after_end},
                      {"bytes_pushed_per_ps", s.bytes_pushed},
                      {"bytes_pulled_per_ps", s.bytes_pulled}};
  if (!s.staleness_histogram.empty()) j["staleness_histogram"] = s.staleness_histogram;
  if (!s.lost_workers.empty()) j["lost_workers"] = s.lost_workers;
  return j;
}

}  // namespace

void write_metrics(const std::string& path, const RunSummary& s) {
  if (s.ps_task) {
    write_json_atomically(path, ps_task_json(s));
    return;
  }
  nlohmann::json j = {{"test_accuracy", s.test_accuracy},
                      {"epochs", s.epochs},
                      {"num_replicas_in_sync", s.num_replicas_in_sync},
                      {"world_size", s.world_size},
                      {"images_per_sec", mean_images_per_sec(s)},
                      {"allreduce_seconds", s.allreduce_seconds},
                      {"exposed_allreduce_seconds", s.exposed_allreduce_seconds},
                      {"global_batch_size", s.global_batch_size},
                      {"learning_rate", s.learning_rate},
                      {"seed", s.seed},
                      {"final_train_loss", s.final_train_loss},
                      {"source", s.source},
                      {"task", s.task},
                      {"model", s.model},
                      {"local_replicas", s.local_replicas},
                      {"device", s.device}};
  if (s.mode != "all-reduce") {
    j["mode"] = s.mode;
    j["num_ps"] = s.num_ps;
    j["global_step"] = s.global_step;
    j["pushes"] = s.pushes;
    j["dropped_stale"] = s.dropped_stale;
    j["bytes_pushed_per_ps"] = s.bytes_pushed;
    j["bytes_pulled_per_ps"] = s.bytes_pulled;
    if (!s.staleness_histogram.empty()) j["staleness_histogram"] = s.staleness_histogram;
    if (!s.lost_workers.empty()) j["lost_workers"] = s.lost_workers;
    j["recoveries"] = s.recoveries;
  } else {
    j["mode"] = s.mode;
  }
  j["per_epoch"] = nlohmann::json::array();
  for (const auto& e : s.per_epoch) j["per_epoch"].push_back(to_json(e));

  write_json_atomically(path, j);
}

}  // namespace mwms::train
