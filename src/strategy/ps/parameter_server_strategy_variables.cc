// ParameterServerStrategy's variables: create_variable() declares them on a worker (float32,
// the caller's value and gradient buffers), and initialize() places them on the ps tasks (round-
// robin or greedy, partitioned: placement.cc), describes each ps's shards and layout, and then has
// the chief restore the newest checkpoint or store the initial values on every ps (init) while
// the other workers join (the ps checks their description against the chief's and answers once
// the chief initialized). Note [ps messages] in ps_protocol.h; the state is
// parameter_server_strategy_impl.h.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "collective/engine/message_channel.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/parameter_server_strategy_impl.h"
#include "strategy/ps/ps_protocol.h"

namespace mwms {

namespace {

using strategy::ps::JobDescription;
using strategy::ps::PsKind;
using strategy::ps::ShardDescription;
using strategy::ps::detail::PsLink;
using strategy::ps::detail::Variable;

}  // namespace

float* ParameterServerStrategy::value(int index) const {
  if (index < 0 || index >= static_cast<int>(impl_->variables.size())) {
    throw InvalidArgument("no variable " + std::to_string(index));
  }
  return impl_->variables[static_cast<std::size_t>(index)].value;
}

int ParameterServerStrategy::create_variable(
    const VariableSpec& spec, float* value, float* gradient,
    std::function<void(float* value, std::size_t count)> initializer) {
  Impl& m = *impl_;
  if (m.ps) throw InvalidUsage("create_variable on " + m.cluster.task_name() + ", a ps task");
  if (m.initialized) throw InvalidUsage("create_variable after initialize()");
  if (spec.dtype != DataType::kFloat32) {
    throw InvalidArgument("variable " + spec.name + ": parameter servers hold float32 variables "
                          "(got " + std::string(to_string(spec.dtype)) + ")");
  }
  std::size_t count = 1;
  for (std::int64_t d : spec.shape) {
    if (d < 0) throw InvalidArgument("variable " + spec.name + " has a negative dimension");
    count *= static_cast<std::size_t>(d);
  }
  if (count > 0 && (value == nullptr || gradient == nullptr)) {
    throw InvalidArgument("variable " + spec.name + ": value and gradient must not be null");
  }
  for (const Variable& v : m.variables) {
    if (v.spec.name == spec.name) {
      throw InvalidArgument("variable " + spec.name + " is declared twice");
    }
  }
  Variable v;
  v.spec = spec;
  v.count = count;
  v.value = value;
  v.gradient = gradient;
  v.initializer = std::move(initializer);
  m.variables.push_back(std::move(v));
  return static_cast<int>(m.variables.size()) - 1;
}

void ParameterServerStrategy::Impl::describe_job() {
  std::vector<VariableSpec> specs;
  for (const Variable& v : variables) specs.push_back(v.spec);
  placement = place_variables(specs, cluster.num_ps, options.placement, options.partitioner);
  JobDescription common;
  common.sync_replicas = options.sync_replicas ? 1 : 0;
  common.replicas_to_aggregate = options.replicas_to_aggregate;
  common.total_num_replicas = options.total_num_replicas;
  common.max_staleness = options.max_staleness;
  const OptimizerOptions& o = options.optimizer;
  common.optimizer = static_cast<std::uint8_t>(o.kind);
  common.learning_rate = o.learning_rate;
  common.momentum = o.momentum;
  common.use_nesterov = o.use_nesterov ? 1 : 0;
  common.beta1 = o.beta1;
  common.beta2 = o.beta2;
  common.epsilon = o.epsilon;
  common.num_workers = cluster.num_workers;
  common.num_ps = cluster.num_ps;
  links.assign(static_cast<std::size_t>(cluster.num_ps), PsLink{});
  for (int p = 0; p < cluster.num_ps; ++p) {
    PsLink& l = links[static_cast<std::size_t>(p)];
    l.rank = cluster.num_workers + p;
    l.name = job.cluster.task_name_of_rank(l.rank) + " at " +
             job.cluster.ring[static_cast<std::size_t>(l.rank)];
    l.description = common;
    for (const VariableShard& s : placement) {
      if (s.ps_task != p) continue;
      l.shards.push_back(&s);
      ShardDescription d;
      d.name = s.name;
      d.variable = static_cast<std::uint32_t>(s.variable);
      d.shard = static_cast<std::uint32_t>(s.shard);
      d.element_offset = s.element_offset;
      d.count = s.count;
      l.description.shards.push_back(std::move(d));
    }
    l.layout = strategy::ps::ps_layout(l.description.shards);
    const std::size_t packed =
        !l.layout.segments.empty() && l.layout.segments[0].pack ? l.layout.segments[0].count : 0;
    l.push_pack.assign(packed, 0.0f);
    l.pull_pack.assign(packed, 0.0f);
    l.blob = strategy::ps::encode(l.description);
  }
}

std::int64_t ParameterServerStrategy::initialize(const std::string& checkpoint_dir) {
  Impl& m = *impl_;
  if (m.ps) throw InvalidUsage("initialize on " + m.cluster.task_name() + ", a ps task");
  if (m.initialized) throw InvalidUsage("initialize() called twice");
  m.describe_job();
  const bool chief = m.cluster.is_chief;
  if (chief && !checkpoint_dir.empty() && m.restore(checkpoint_dir)) return pull();
  if (chief) {
    for (Variable& v : m.variables) {
      if (v.initializer) v.initializer(v.value, v.count);
    }
  }
  for (PsLink& l : m.links) {
    m.channel->queue_send(l.rank,
                          strategy::ps::envelope(chief ? PsKind::kInit : PsKind::kJoin, 0,
                                                 l.blob.size()),
                          nullptr, 0);
    m.channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kData, 0, l.blob.size()),
                          l.blob.data(), l.blob.size());
    if (chief) m.queue_segments(l, 0, false);
    m.expect(l, PsKind::kReady);
  }
  m.run(chief ? "ps init" : "ps join",
        chief ? "the ps stores the initial values" : "the ps waits for the chief to initialize "
                                                     "the variables");
  m.initialized = true;
  return pull();
}

}  // namespace mwms
