// The NCCL replica group's Work (Note [nccl deadlines] in nccl_group.h), its shared state's
// failure path and the one conversion of NCCL and CUDA codes (to_error).
#include "collective/backend/nccl_work.h"

#include "common/logging.h"

namespace mwms::collective {

namespace {

using common::Clock;
using common::Deadline;

const char* or_empty(const char* s) { return s ? s : ""; }

// A Work over the K events of one launch.
class NcclWork final : public PolledDeviceWork {
 public:
  NcclWork(std::shared_ptr<NcclGroupShared> shared, std::vector<NcclEvent> events,
           Deadline deadline, ErrorContext ctx, double timeout)
      : PolledDeviceWork(role_text(shared->options.role).label, std::move(ctx), timeout),
        shared_(std::move(shared)),
        events_(std::move(events)),
        pending_(events_.size(), true),
        deadline_(deadline),
        what_("nccl " + ctx_.op) {}

  ~NcclWork() override {
    for (NcclEvent e : events_) {
      if (e != nullptr) shared_->api->event_destroy(e);
    }
  }

 private:
  // One look at the K events and communicators; true once all completed or one failed.
  bool poll() noexcept override {
    const NcclApi& api = *shared_->api;
    if (std::exception_ptr cause = shared_->failure()) return finish(cause);
    bool all = true;
    for (std::size_t r = 0; r < events_.size(); ++r) {
      if (!pending_[r]) continue;
      const int q = api.event_query(events_[r]);
      if (q == kCudaSuccess) {
        pending_[r] = false;
        continue;
      }
      all = false;
      if (q != kCudaErrorNotReady) {
        return fail(to_error(api, NativeSource::kCuda, q, "cudaEventQuery" + shared_->where(r),
                             nullptr, ctx_));
      }
    }
    if (all) return finish(nullptr);
    for (std::size_t r = 0; r < shared_->comms.size(); ++r) {
      bool in_progress = false;
      if (std::exception_ptr e = shared_->async_failure(r, what_, ctx_, &in_progress)) {
        return fail(e);
      }
    }
    return Clock::now() > deadline_ ? fail(timeout_error()) : false;
  }

  std::exception_ptr timeout_error() noexcept {
    const NcclRoleText& words = role_text(shared_->options.role);
    try {
      ErrorContext ctx = timeout_context();
      ctx.elapsed_seconds = timeout_ - common::seconds_left(deadline_);
      return std::make_exception_ptr(
          TimeoutError(std::string(words.label) + " " + ctx_.op + " seq " +
                           std::to_string(ctx_.seq) + " did not complete within " +
                           seconds_text(timeout_) + on_replicas(shared_->options.role, pending_) +
                           ": a peer is dead, stalled or never called it; " + words.aborted,
                       ctx));
    } catch (...) {
      return std::current_exception();  // std::bad_alloc
    }
  }

  bool fail(std::exception_ptr cause) noexcept {
    shared_->fail(cause);
    return finish(shared_->failure());
  }

  std::shared_ptr<NcclGroupShared> shared_;
  std::vector<NcclEvent> events_;
  std::vector<bool> pending_;
  Deadline deadline_;
  const std::string what_;  // "nccl all_reduce": names the collective in NCCL's errors
};

}  // namespace

const NcclRoleText& role_text(NcclGroupRole role) noexcept {
  static const NcclRoleText kReplicas{"nccl replica group", "the NCCL replica group",
                                      "all local NCCL communicators were aborted", "worker"};
  static const NcclRoleText kRank{"nccl", "the NCCL communicator",
                                  "the NCCL communicator was aborted", "rank"};
  return role == NcclGroupRole::kRank ? kRank : kReplicas;
}

std::string replica_text(int r) { return "local replica " + std::to_string(r); }

std::string on_replicas(NcclGroupRole role, const std::vector<bool>& pending) {
  if (role == NcclGroupRole::kRank) return "";
  std::string list;
  for (std::size_t r = 0; r < pending.size(); ++r) {
    if (pending[r]) list += (list.empty() ? "" : ", ") + std::to_string(r);
  }
  return " on local replica(s) " + list;
}

void abort_comm(const NcclApi& api, NcclComm comm) noexcept {
  const int r = api.comm_abort(comm);
  if (r != kNcclSuccess) {
    MWMS_LOG_WARN(kColl,
                  "ncclCommAbort returned " << r << " (" << or_empty(api.error_string(r)) << ")");
  }
}

std::shared_ptr<Work> make_nccl_work(std::shared_ptr<NcclGroupShared> shared,
                                     std::vector<NcclEvent> events, Deadline deadline,
                                     ErrorContext ctx, double timeout) {
  return std::make_shared<NcclWork>(std::move(shared), std::move(events), deadline, std::move(ctx),
                                    timeout);
}

std::exception_ptr to_error(const NcclApi& api, NativeSource source, int code,
                            const std::string& call, NcclComm comm, ErrorContext ctx) noexcept {
  try {
    ctx.transport = "nccl";
    if (source == NativeSource::kCuda) {
      return cuda_error(code, api.cuda_error_string(code), call, ctx);
    }
    std::string text = call + " failed: NCCL error " + std::to_string(code) + " (" +
                       or_empty(api.error_string(code)) + ")";
    const char* last = comm != nullptr ? api.last_error(comm) : nullptr;
    if (last != nullptr && *last != '\0') text += ": " + std::string(last);
    if (code == kNcclRemoteError || code == kNcclSystemError) {
      return std::make_exception_ptr(PeerError(
          text + " (a peer or its connection failed; the NCCL communicator was aborted)", ctx));
    }
    return std::make_exception_ptr(BackendError(text, code, ctx));
  } catch (...) {
    return std::current_exception();  // std::bad_alloc
  }
}

void NcclGroupShared::fail(std::exception_ptr cause) noexcept {
  std::lock_guard<std::mutex> lock(mutex);
  if (!poison) poison = cause;
  if (aborted || destroyed) return;
  aborted = true;
  for (NcclComm comm : comms) {
    if (comm != nullptr) abort_comm(*api, comm);
  }
}

std::exception_ptr NcclGroupShared::failure() {
  std::lock_guard<std::mutex> lock(mutex);
  return poison;
}

std::exception_ptr NcclGroupShared::async_failure(std::size_t r, const std::string& what,
                                                  const ErrorContext& ctx,
                                                  bool* in_progress) noexcept {
  *in_progress = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (poison) return poison;
  NcclComm comm = comms[r];
  if (aborted || destroyed || comm == nullptr) {
    try {
      return std::make_exception_ptr(InvalidUsage(what + where(r) + ": the NCCL communicator was " +
                                                      (aborted ? "aborted" : "destroyed") +
                                                      " before the collective completed",
                                                  ctx));
    } catch (...) {
      return std::current_exception();  // std::bad_alloc
    }
  }
  int async = kNcclSuccess;
  const int c = api->comm_get_async_error(comm, &async);
  if (c != kNcclSuccess) {
    return to_error(*api, NativeSource::kNccl, c, "ncclCommGetAsyncError" + where(r), comm, ctx);
  }
  if (async != kNcclSuccess && async != kNcclInProgress) {
    return to_error(*api, NativeSource::kNccl, async, what + where(r), comm, ctx);
  }
  *in_progress = async == kNcclInProgress;
  return nullptr;
}

std::string NcclGroupShared::where(std::size_t r) const {
  if (options.role == NcclGroupRole::kRank) return "";
  return " (" + replica_text(static_cast<int>(r)) + ")";
}

}  // namespace mwms::collective
