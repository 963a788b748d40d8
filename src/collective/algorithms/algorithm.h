// The algorithm interface (STYLE items 30-33, mscclpp algorithm.hpp): one collective for a class of
// problems, self-describing (name, collective, when it applies) and expressed as a Plan that the
// engine runs over whatever links connect the ranks. Algorithms see ranks, buffers and the
// reducer (kernels/), never a socket, a segment or an MPI call.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "collective/link_tuning.h"
#include "collective/plan.h"

namespace mwms::collective {

/// Carried in every frame header (FrameHeader::algorithm): ranks must run the same plan.
enum class AlgorithmId : std::uint8_t {
  kRing = 0,
  kGather = 1,
  kRecursiveDoubling = 2,
  kRabenseifner = 3,
  kHierarchical = 4,
  kFlat = 5,
};

/// What the selector knows about the ranks (from the peer-info exchange). Identical on every rank,
/// so every rank chooses alike.
struct Topology {
  int world_size = 1;
  int num_hosts = 1;
  int max_ranks_per_host = 1;
  bool uniform_hosts = true;    // every host has the same number of ranks
  // A host runs more ranks than it has online cores (as its ranks published them, PeerInfo), so
  // every hand-off between ranks may wait for the scheduler.
  bool ranks_exceed_cores = false;
  // The selector's thresholds over the communicator's links: their transport's when every link
  // has the same, the defaults when they differ (shared memory inside hosts, TCP between them).
  LinkTuning links;
};

/// One collective call, as the selector sees it.
struct SelectionInput {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::size_t bytes = 0;        // of the whole buffer (all-reduce, broadcast) or of recv/send
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Topology topology;
};

/// Buffers of a call. All-reduce and broadcast are in place: send == recv == the buffer.
/// Reduce-scatter: send holds world_size blocks, recv one. All-gather: recv holds world_size
/// blocks and this rank's block is already in place.
struct Buffers {
  const char* send = nullptr;
  char* recv = nullptr;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  /// Short name, as MWMS_ALGO spells it: "ring", "gather", "rd", "rhd".
  virtual std::string_view name() const noexcept = 0;
  virtual AlgorithmId id() const noexcept = 0;
  virtual CollectiveKind collective() const noexcept = 0;
  /// True when the algorithm is correct for `in`; otherwise false with the reason in *why.
  virtual bool supports(const SelectionInput& in, std::string* why) const = 0;
  /// Scratch bytes the plan of `call` needs (the engine grows one buffer to the largest).
  virtual std::size_t scratch_bytes(const CollectiveCall& call) const = 0;
  /// Builds the plan of `call` into *plan. Pure structure: it depends only on the call's identity
  /// (kind, dtype, op, count, root, rank, world size) and the three pointers, so the engine reuses
  /// it for a repeated call (Note [plan cache] in engine_backend.cc) and only renumbers its
  /// envelopes. Never allocates once *plan has grown.
  virtual void plan(const CollectiveCall& call, Buffers buffers, char* scratch,
                    Plan* plan) const = 0;
  /// Local work before every run of the plan (e.g. copy this rank's input into scratch).
  virtual void stage(const CollectiveCall& call, Buffers buffers, char* scratch) const;
  /// Local work after the plan ran (e.g. the gather variant reduces its slots in rank order).
  virtual void finish(const CollectiveCall& call, Buffers buffers, char* scratch) const;
  /// True for the one algorithm that is not a plan (Note [flat all-reduce]): the engine runs it
  /// through PlanRunner::run_flat over the links' flat slots instead of plan().
  virtual bool flat() const noexcept { return false; }
};

/// Every algorithm of this build, in no particular order (registry.cc).
const std::vector<const Algorithm*>& all_algorithms();
/// The algorithm with this id for `kind`, or nullptr.
const Algorithm* find_algorithm(CollectiveKind kind, AlgorithmId id);
/// Name of an algorithm id ("ring", ...), "unknown" otherwise.
const char* algorithm_name(std::uint8_t id) noexcept;

}  // namespace mwms::collective
