#include "collective/backend/engine_backend.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "collective/algorithms/algorithms.h"
#include "common/logging.h"

namespace mwms::collective {

std::vector<Link*> EngineBackend::raw(const std::vector<std::unique_ptr<Link>>& links) {
  std::vector<Link*> out;
  for (const auto& l : links) out.push_back(l.get());
  return out;
}

EngineBackend::EngineBackend(int rank, std::vector<std::unique_ptr<Link>> links,
                             std::unique_ptr<ControlPlane> control, EngineOptions options)
    : rank_(rank),
      links_(std::move(links)),
      control_(std::move(control)),
      options_(std::move(options)),
      runner_(raw(links_), control_.get(), options_.runner) {}

std::string EngineBackend::describe() const {
  std::map<std::string, int> count;
  std::map<std::string, int> streams;         // connections per peer, by transport
  std::map<std::string, std::size_t> pieces;  // links that cut messages otherwise than the plan
  for (const auto& l : links_) {
    if (!l) continue;
    ++count[l->caps().name];
    streams[l->caps().name] = std::max(streams[l->caps().name], l->caps().streams);
    if (l->caps().chunk_bytes != options_.runner.chunk_bytes) {
      pieces[l->caps().name] = l->caps().chunk_bytes;
    }
  }
  std::string out = "engine backend, links:";
  for (const auto& [name, n] : count) {
    out += " " + std::to_string(n) + " " + name;
    if (const int k = streams[name]; k > 0) {  // TCP: MWMS_NSOCKS_PERPEER
      out += " (" + std::to_string(k) + (k == 1 ? " stream" : " streams") + " per peer)";
    }
  }
  if (count.empty()) out += " none";
  out += ", chunk " + std::to_string(options_.runner.chunk_bytes) + " bytes";
  for (const auto& [name, bytes] : pieces) {
    out += ", " + name + " pieces " + std::to_string(bytes) + " bytes";
  }
  if (options_.runner.yield_while_spinning) out += ", yielding (more ranks than cores)";
  return out;
}

char* EngineBackend::grow_scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) {
    MWMS_LOG_DEBUG(kAlloc, "growing scratch from " << scratch_.size() << " to " << bytes
                                                   << " bytes");
    scratch_.assign(bytes, 0);  // touched once here, reused by every later collective
  }
  return scratch_.data();
}

void EngineBackend::run(const CollectiveArgs& args, const ErrorContext& ctx) {
  // Note [heartbeat]: the control links are this thread's for the whole collective; what the
  // heartbeat thread found between collectives fails this one at once.
  std::unique_lock<ReaderLock> hold;
  if (control_) {
    hold = control_->hold();
    control_->throw_if_failed(ctx);
  }
  CollectiveCall call = args.call;
  call.hosts = &options_.hosts;
  Buffers b = args.buffers;
  const std::size_t esize = dtype_size(call.dtype);
  const int n = call.world_size;
  // All-gather's own block goes into place after the run, so that a refused call leaves the
  // output as it was (Note [accept before landing], link.h); the ring sends it from the input.
  auto place_own_block = [&] {
    if (call.kind != CollectiveKind::kAllGather) return;
    const std::size_t block = call.count / static_cast<std::size_t>(n) * esize;
    char* own = b.recv + static_cast<std::size_t>(call.rank) * block;
    if (own != b.send && block > 0) std::memmove(own, b.send, block);
  };
  last_algorithm_ = 0xff;
  if (n == 1) {
    place_own_block();
    if (call.kind == CollectiveKind::kReduceScatter && b.recv != b.send && call.count > 0) {
      std::memmove(b.recv, b.send, call.count * esize);
    }
    return;
  }
  SelectionInput in;
  in.kind = call.kind;
  in.bytes = call.count * esize;
  in.dtype = call.dtype;
  in.op = call.op;
  in.topology = options_.topology;
  Selection sel = select_algorithm(in, options_.selector);
  call.algorithm = static_cast<std::uint8_t>(sel.algorithm->id());
  last_algorithm_ = call.algorithm;
  MWMS_LOG_DEBUG(kColl, kind_name(call.kind) << " seq " << call.seq << " " << in.bytes
                                             << " bytes: " << sel.algorithm->name() << " ("
                                             << sel.reason << ")");
  if (sel.algorithm->flat()) {  // Note [flat all-reduce]: no plan, the links' flat slots
    runner_.run_flat(call, b.recv, options_.timeout_seconds, ctx);
    return;
  }
  char* scratch = grow_scratch(sel.algorithm->scratch_bytes(call));
  // Note [plan cache]: training repeats the same calls on the same buffers (one all-reduce per
  // bucket per step); a plan depends only on the call's identity and pointers, so a repeat
  // reuses it and only renumbers its envelopes.
  PlanKey key{sel.algorithm, call.kind, call.dtype, call.op, call.count, call.root,
              b.send, b.recv, scratch};
  if (!(key == plan_key_)) {
    sel.algorithm->plan(call, b, scratch, &plan_);
    plan_key_ = key;
  } else {
    for (Transfer& t : plan_.transfers) {
      t.send_header.seq = call.seq;
      t.expect_header.seq = call.seq;
    }
  }
  sel.algorithm->stage(call, b, scratch);
  runner_.run(plan_, call.dtype, call.op, n, options_.timeout_seconds, ctx);
  place_own_block();
  sel.algorithm->finish(call, b, scratch);
}

void EngineBackend::abort(int failed_rank, const std::string& reason, AbortCause cause,
                          FailureCause why) noexcept {
  if (control_) control_->send_abort(failed_rank, reason, cause, why);
}

void EngineBackend::finalize(std::uint64_t collectives) noexcept {
  if (control_) control_->send_finalized(collectives);
}

}  // namespace mwms::collective
