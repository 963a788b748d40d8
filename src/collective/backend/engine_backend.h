// The engine backend: our algorithms (algorithms/, chosen per call by selector.cc) run by the
// PlanRunner over one link per peer, whatever transport each link uses. Scratch memory and plan
// storage grow to the largest collective and are reused, so steady-state calls allocate nothing.
#pragma once

#include <memory>
#include <vector>

#include "collective/backend/backend.h"
#include "collective/engine/plan_runner.h"
#include "collective/selector.h"
#include "collective/transport/link.h"

namespace mwms::collective {

struct EngineOptions {
  RunnerOptions runner;
  SelectorOptions selector;
  Topology topology;
  HostLayout hosts;  // which ranks share a host (hierarchical algorithms)
  double timeout_seconds = 300;
};

class EngineBackend final : public Backend {
 public:
  /// `links` by rank (nullptr at this rank); `control` may be null (threaded tests).
  EngineBackend(int rank, std::vector<std::unique_ptr<Link>> links,
                std::unique_ptr<ControlPlane> control, EngineOptions options);
  const char* name() const noexcept override { return "engine"; }
  std::string describe() const override;
  void run(const CollectiveArgs& args, const ErrorContext& ctx) override;
  std::uint8_t last_algorithm() const noexcept override { return last_algorithm_; }
  void abort(int failed_rank, const std::string& reason, AbortCause cause,
             FailureCause why) noexcept override;
  void finalize(std::uint64_t collectives) noexcept override;

 private:
  static std::vector<Link*> raw(const std::vector<std::unique_ptr<Link>>& links);
  char* grow_scratch(std::size_t bytes);

  int rank_;
  std::vector<std::unique_ptr<Link>> links_;
  std::unique_ptr<ControlPlane> control_;
  EngineOptions options_;
  PlanRunner runner_;
  struct PlanKey {
    const Algorithm* algorithm = nullptr;
    CollectiveKind kind = CollectiveKind::kAllReduce;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    std::size_t count = 0;
    int root = -1;
    const char* send = nullptr;
    char* recv = nullptr;
    char* scratch = nullptr;
    bool operator==(const PlanKey& o) const {
      return algorithm == o.algorithm && kind == o.kind && dtype == o.dtype && op == o.op &&
             count == o.count && root == o.root && send == o.send && recv == o.recv &&
             scratch == o.scratch;
    }
  };
  Plan plan_;
  PlanKey plan_key_;  // what plan_ was built for (Note [plan cache])
  std::uint8_t last_algorithm_ = 0xff;
  std::vector<char> scratch_;
};

}  // namespace mwms::collective
