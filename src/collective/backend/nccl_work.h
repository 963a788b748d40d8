// The pieces of the NCCL replica group (nccl_group.h) shared by its two files: the Work over the
// K completion events (Note [nccl deadlines]) and the words each role's messages use.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/backend/nccl_group.h"

namespace mwms::collective {

/// The words of a role's messages (NcclGroupRole).
struct NcclRoleText {
  const char* label;    ///< "nccl" | "nccl replica group": Work messages and log lines
  const char* subject;  ///< "the NCCL communicator" | "the NCCL replica group"
  const char* aborted;  ///< "the NCCL communicator was aborted" | "all local ... were aborted"
  const char* peers;    ///< "rank" | "worker": who must call finalize
};
const NcclRoleText& role_text(NcclGroupRole role) noexcept;

/// "local replica r".
std::string replica_text(int r);
/// kReplicas: " on local replica(s) 0, 2" (those with pending[r]); kRank: "".
std::string on_replicas(NcclGroupRole role, const std::vector<bool>& pending);
/// ncclCommAbort, with a warning when it fails. Never throws.
void abort_comm(const NcclApi& api, NcclComm comm) noexcept;

/// The Work of one launch: completes when all `events` (one per local replica, owned by the Work
/// from now on) completed, fails on a CUDA or asynchronous NCCL error or once `deadline` passed
/// (Note [nccl deadlines]: the group is then aborted and poisoned).
std::shared_ptr<Work> make_nccl_work(std::shared_ptr<NcclGroupShared> shared,
                                     std::vector<NcclEvent> events, common::Deadline deadline,
                                     ErrorContext ctx, double timeout);

}  // namespace mwms::collective
