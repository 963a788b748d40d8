// A parameter server's job and checkpoints: the chief's init (its description becomes the ps's
// optimizer, layout and buffers, then its initial values arrive), the workers' joins (checked
// against the chief's description; a join before the init waits for it), and the chief's save
// and restore of this ps's shard file (Note [ps checkpoint files] in ps_checkpoint.h). The state
// is ps_server_state.h; the loop that calls these is ps_server.cc (Note [ps serving] in
// ps_server.h).
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "mwms/optimizer.h"
#include "strategy/ps/ps_checkpoint.h"
#include "strategy/ps/ps_server_state.h"

namespace mwms::strategy::ps {

namespace {

using collective::FrameHeader;
using detail::Worker;

}  // namespace

void PsServer::State::on_description_request(Worker& w, const FrameHeader& h,
                                              const ErrorContext& c) {
  if (h.count > kMaxDescriptionBytes) {
    throw PeerError("a description of " + std::to_string(h.count) + " bytes (at most " +
                    std::to_string(kMaxDescriptionBytes) + ")", c);
  }
  if (w.request == PsKind::kInit && w.rank != cfg.chief) {
    refuse(w, "only the chief initializes the variables");
    return;
  }
  if (w.request == PsKind::kInit && initialized) {
    refuse(w, "the variables are already initialized (a restarted chief must restart the "
              "whole job)");
    return;
  }
  w.blob.assign(static_cast<std::size_t>(h.count), '\0');
  w.phase = Phase::kDescription;
  ch.start_recv(w.rank, w.blob.data(), w.blob.size());
}

void PsServer::State::on_checkpoint_request(Worker& w, const FrameHeader& h,
                                             const ErrorContext& c) {
  const bool save = w.request == PsKind::kSave;
  const std::size_t bound = save ? kMaxDirectoryBytes : kMaxRestoreBytes;
  if (h.count > bound) {
    throw PeerError(std::string("a ") + kind_name(w.request) + " request of " +
                    std::to_string(h.count) + " bytes (at most " + std::to_string(bound) +
                    ")", c);
  }
  if (w.rank != cfg.chief) {
    refuse(w, std::string("only the chief may ") + kind_name(w.request) + " a checkpoint");
    return;
  }
  if (save != initialized) {
    refuse(w, save ? "save before the variables were initialized"
                   : "restore after the variables were initialized (restore only starts a "
                     "job)");
    return;
  }
  w.step = h.seq;
  w.blob.assign(static_cast<std::size_t>(h.count), '\0');
  w.phase = Phase::kDescription;
  ch.start_recv(w.rank, w.blob.data(), w.blob.size());
}

void PsServer::State::on_description(Worker& w) {
  if (w.request == PsKind::kInit) {
    on_init_description(w);
    return;
  }
  if (w.request == PsKind::kRestore) {
    on_restore(w);
    return;
  }
  if (w.request == PsKind::kSave) {
    if (values_changing()) {  // Note [ps streamed apply]: a checkpoint of whole updates
      w.save_deferred = true;
      w.phase = Phase::kHeld;
      return;
    }
    on_save(w);
    return;
  }
  if (!initialized) {
    w.join_waits = true;  // answered once the chief initialized
    w.phase = Phase::kHeld;
    return;
  }
  on_join_description(w);
}

// The chief's description becomes this ps's job: optimizer, layout, buffers.
void PsServer::State::setup(JobDescription d, Worker& w, const char* op) {
  job = std::move(d);
  optimizer.kind = static_cast<OptimizerKind>(job.optimizer);
  optimizer.learning_rate = job.learning_rate;
  optimizer.momentum = job.momentum;
  optimizer.use_nesterov = job.use_nesterov != 0;
  optimizer.beta1 = job.beta1;
  optimizer.beta2 = job.beta2;
  optimizer.epsilon = job.epsilon;
  try {
    validate(optimizer);
  } catch (const InvalidArgument& e) {
    throw PeerError("the chief's optimizer is invalid: " + e.message(), peer_ctx(w, op));
  }
  layout = ps_layout(job.shards);
  begin_update();  // nothing reads the values it replaces (Note [ps shared values])
  bool share = false;
  // Synchronous mode only: there a step's update starts once its gradients are in, so its
  // workers have copied the last values already; asynchronous updates follow each other, and
  // waiting for the last reader's copy cost more than the ps's copy into its ring (ps_perf with
  // 2 workers, async: 272-305 -> 345-364 us; sync: 388-508 -> 380-422 us).
  for (const Worker& x : workers) {
    share = share || (cfg.shared_values && x.shm && job.sync_replicas);
  }
  values.assign(layout.total, share);
  slots.assign(static_cast<std::size_t>(num_slots(optimizer.kind)),
               std::vector<float>(layout.total, 0.0f));
  slot_ptrs.assign(slots.size(), nullptr);
  if (job.sync_replicas) accum.assign(layout.total, 0.0f);
  for (Worker& x : workers) {
    x.grad.assign(layout.total, 0.0f);
    x.tickets.assign(layout.segments.size(), 0);
  }
  MWMS_LOG_INFO(
      kStrat, "ps " << cfg.ps_index << ": " << job.shards.size() << " shards, " << layout.total
                    << " elements, " << layout.segments.size() << " segments, "
                    << (job.sync_replicas ? "sync" : "async")
                    << (values.shared != nullptr ? ", values shared with the workers on this host "
                                                   "(Note [ps shared values])"
                                                 : ""));
}

void PsServer::State::on_init_description(Worker& w) {
  setup(decode(w.blob.data(), w.blob.size(), peer_ctx(w, "ps init")), w, "ps init");
  w.segment = 0;
  if (layout.segments.empty()) {
    initialized = true;
    send_ready(w);
    expect_request(w);
    return;
  }
  w.phase = Phase::kInitValues;
  expect_segment(w, values.data());
}

void PsServer::State::answer_waiting_joins() {
  for (Worker& x : workers) {
    if (!x.join_waits || x.lost) continue;
    x.join_waits = false;
    on_join_description(x);
  }
}

// Note [ps checkpoint files]: the chief verified the manifest and every shard file before asking;
// this ps reads its own file again (it may be on another host's view of a shared directory) and
// takes nothing that does not match the chief's description exactly.
void PsServer::State::on_restore(Worker& w) {
  const ErrorContext c = peer_ctx(w, "ps restore");
  RestoreRequest q = decode_restore(w.blob.data(), w.blob.size(), c);
  setup(decode(q.description.data(), q.description.size(), c), w, "ps restore");
  const std::string path =
      shard_file_path(q.directory, w.step, static_cast<std::uint32_t>(cfg.ps_index),
                      static_cast<std::uint32_t>(job.num_ps));
  try {
    ManifestEntry want;
    want.version = q.expected.version;
    want.file_bytes = q.expected.file_bytes;
    want.file_crc32 = q.expected.file_crc32;
    ShardFile f = read_shard_file(path, &want);
    std::string why;
    if (f.ps_index != static_cast<std::uint32_t>(cfg.ps_index) ||
        f.num_ps != static_cast<std::uint32_t>(job.num_ps)) {
      why = "it is ps " + std::to_string(f.ps_index) + " of " + std::to_string(f.num_ps) +
            "'s file, this is ps " + std::to_string(cfg.ps_index) + " of " +
            std::to_string(job.num_ps);
    } else if (f.optimizer != job.optimizer) {
      why = "it holds " + std::string(to_string(static_cast<OptimizerKind>(f.optimizer))) +
            " slots, the job runs " + std::string(to_string(optimizer.kind));
    } else if (f.shards != job.shards) {
      why = "its shards differ from the variables the chief declared";
    } else if (f.values.size() != values.size() || f.slots.size() != slots.size()) {
      why = "its sizes differ from the layout";
    }
    if (!why.empty()) throw CheckpointError("checkpoint " + path + ": " + why, path);
    std::copy(f.values.begin(), f.values.end(), values.data());
    for (std::size_t k = 0; k < slots.size(); ++k) slots[k] = std::move(f.slots[k]);
    version = f.version;
    stats.global_step = static_cast<std::int64_t>(version);
  } catch (const CheckpointError& e) {
    job = JobDescription{};
    fail_request(w, e.message());
    return;
  }
  MWMS_LOG_INFO(kStrat, "ps " << cfg.ps_index << ": restored " << path << " (global step "
                              << version << ")");
  initialized = true;
  send_ready(w);
  expect_request(w);
  answer_waiting_joins();
}

void PsServer::State::on_save(Worker& w) {
  ShardFileView v;
  v.ps_index = static_cast<std::uint32_t>(cfg.ps_index);
  v.num_ps = static_cast<std::uint32_t>(job.num_ps);
  v.checkpoint_step = w.step;
  v.version = version;
  v.optimizer = job.optimizer;
  v.shards = &job.shards;
  v.values = values.data();
  for (const std::vector<float>& slot : slots) v.slots.push_back(slot.data());
  v.total = layout.total;
  ManifestEntry e;
  try {
    e = write_shard_file(w.blob, v);
  } catch (const CheckpointError& x) {
    fail_request(w, x.message());
    return;
  }
  w.saved = encode_saved(ShardFileStamp{e.version, e.file_bytes, e.file_crc32});
  ch.queue_send(w.rank, envelope(PsKind::kSaved, version, w.saved.size(), cfg.ps_index), nullptr,
                0);
  ch.queue_send(w.rank, envelope(PsKind::kData, version, w.saved.size(), cfg.ps_index),
                w.saved.data(), w.saved.size());
  expect_request(w);
}

void PsServer::State::on_join_description(Worker& w) {
  JobDescription d = decode(w.blob.data(), w.blob.size(), peer_ctx(w, "ps join"));
  std::string diff = first_difference(job, d);
  if (!diff.empty()) {
    refuse(w, w.name + " does not match the chief: " + diff);
    return;
  }
  send_ready(w);
  expect_request(w);
}

}  // namespace mwms::strategy::ps
