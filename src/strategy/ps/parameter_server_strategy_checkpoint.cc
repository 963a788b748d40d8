// ParameterServerStrategy's checkpoints (Note [ps checkpoint files] in ps_checkpoint.h): the
// chief's save_checkpoint() has every ps write its shard file and then writes the manifest; at
// initialize() the chief finds the newest checkpoint whose manifest and shard files verify and
// match this job's placement (older ones tried in turn) and has every ps restore its shard from
// it. The ps side is ps_server_admin.cc; the state is parameter_server_strategy_impl.h.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collective/engine/message_channel.h"
#include "common/logging.h"
#include "mwms/parameter_server.h"
#include "strategy/ps/parameter_server_strategy_impl.h"
#include "strategy/ps/ps_checkpoint.h"
#include "strategy/ps/ps_protocol.h"

namespace mwms {

namespace {

using strategy::ps::JobDescription;
using strategy::ps::PsKind;
using strategy::ps::detail::PsLink;

}  // namespace

std::string ParameterServerStrategy::Impl::failures() const {
  std::string text;
  for (const PsLink& l : links) {
    if (!l.failed) continue;
    text += (text.empty() ? "" : "; ") + l.name + ": " + l.reason;
  }
  return text;
}

std::optional<std::pair<std::uint64_t, strategy::ps::Manifest>>
ParameterServerStrategy::Impl::find_checkpoint(const std::string& dir) const {
  namespace sp = strategy::ps;
  const std::vector<std::uint64_t> steps = sp::list_checkpoints(dir);
  std::string skipped;
  const auto n = static_cast<std::uint32_t>(links.size());
  for (std::uint64_t step : steps) {
    try {
      sp::Manifest mf = sp::read_manifest(sp::manifest_path(dir, step));
      if (mf.entries.size() != n) {
        throw CheckpointError("written by a job of " + std::to_string(mf.entries.size()) +
                                  " ps, this one has " + std::to_string(n),
                              sp::manifest_path(dir, step));
      }
      for (std::uint32_t p = 0; p < n; ++p) {
        const std::string path = sp::shard_file_path(dir, step, p, n);
        const sp::ShardFile f = sp::read_shard_file(path, &mf.entries[p]);
        const JobDescription& d = links[p].description;
        if (f.optimizer != d.optimizer) {
          throw CheckpointError(
              path + ": holds " +
                  std::string(to_string(static_cast<OptimizerKind>(f.optimizer))) +
                  " slots, this job runs " +
                  std::string(to_string(static_cast<OptimizerKind>(d.optimizer))),
              path);
        }
        if (f.shards != d.shards) {
          throw CheckpointError(path + ": written for other variables (names, shapes, "
                                "placement or partitioning) than this job declares", path);
        }
      }
      if (!skipped.empty()) {
        MWMS_LOG_WARN(kStrat, "restoring the checkpoint of step " << step << " in " << dir
                              << "; newer ones are unusable: " << skipped);
      }
      return std::make_pair(step, std::move(mf));
    } catch (const CheckpointError& e) {
      skipped += (skipped.empty() ? "" : "; ") + ("step " + std::to_string(step) + ": ") +
                 e.message();
    }
  }
  if (steps.empty()) return std::nullopt;
  throw CheckpointError("no usable checkpoint in " + dir + " (" + skipped + ")", dir);
}

bool ParameterServerStrategy::Impl::restore(const std::string& dir) {
  auto found = find_checkpoint(dir);
  if (!found) return false;
  const auto& [step, mf] = *found;
  for (std::size_t p = 0; p < links.size(); ++p) {
    PsLink& l = links[p];
    strategy::ps::RestoreRequest q;
    q.description = l.blob;
    q.expected = {mf.entries[p].version, mf.entries[p].file_bytes, mf.entries[p].file_crc32};
    q.directory = dir;
    l.request = strategy::ps::encode_restore(q);
    channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kRestore, step, l.request.size()),
                        nullptr, 0);
    channel->queue_send(l.rank, strategy::ps::envelope(PsKind::kData, step, l.request.size()),
                        l.request.data(), l.request.size());
    expect(l, PsKind::kReady);
  }
  run("ps restore", "the ps reads its shard file");
  if (const std::string why = failures(); !why.empty()) {
    throw CheckpointError("restoring the checkpoint of step " + std::to_string(step) + " in " +
                              dir + " failed: " + why,
                          strategy::ps::manifest_path(dir, step));
  }
  restored_from = strategy::ps::manifest_path(dir, step);
  MWMS_LOG_INFO(kStrat, "restored " << restored_from << " (global step " << links[0].version
                                    << ")");
  initialized = true;
  return true;
}

const std::string& ParameterServerStrategy::restored_from() const noexcept {
  return impl_->restored_from;
}

std::string ParameterServerStrategy::save_checkpoint(const std::string& dir, int max_to_keep) {
  namespace sp = strategy::ps;
  Impl& m = *impl_;
  if (m.ps || !m.cluster.is_chief) {
    throw InvalidUsage("save_checkpoint on " + m.cluster.task_name() + ": only the chief saves");
  }
  if (!m.initialized || m.finalized) {
    throw InvalidUsage("save_checkpoint() before initialize() or after finalize()");
  }
  if (dir.empty() || dir.size() > sp::kMaxDirectoryBytes) {
    throw InvalidArgument("save_checkpoint: the directory must be 1 to " +
                          std::to_string(sp::kMaxDirectoryBytes) + " bytes long");
  }
  if (max_to_keep < 1) throw InvalidArgument("save_checkpoint: max_to_keep must be >= 1");
  const auto step = static_cast<std::uint64_t>(m.global_step);
  for (PsLink& l : m.links) {
    l.request = dir;
    m.channel->queue_send(l.rank, sp::envelope(PsKind::kSave, step, l.request.size()), nullptr,
                          0);
    m.channel->queue_send(l.rank, sp::envelope(PsKind::kData, step, l.request.size()),
                          l.request.data(), l.request.size());
    m.expect(l, PsKind::kSaved);
  }
  m.run("ps save", "the ps writes its shard file");
  if (const std::string why = m.failures(); !why.empty()) {
    throw CheckpointError("the checkpoint of step " + std::to_string(step) + " in " + dir +
                              " was not written: " + why,
                          sp::manifest_path(dir, step));
  }
  sp::Manifest mf;
  mf.checkpoint_step = step;
  for (PsLink& l : m.links) {
    const sp::ShardFileStamp st =
        sp::decode_saved(l.saved.data(), l.saved.size(), m.channel->with_peer(m.ctx("ps save"), l.rank));
    mf.entries.push_back({st.version, st.file_bytes, st.file_crc32});
  }
  sp::write_manifest(dir, mf);
  sp::remove_old_checkpoints(dir, static_cast<std::size_t>(max_to_keep));
  return sp::manifest_path(dir, step);
}

}  // namespace mwms
