// Backends (DESIGN "The transport seam", c10d's Backend): what runs a collective once the
// front-end Communicator has checked its arguments, numbered it and made sure the communicator
// is usable. The engine backend runs our algorithms over per-peer links; a native backend (NCCL)
// hands the whole collective to a library.
#pragma once

#include <cstdint>
#include <string>

#include "collective/algorithms/algorithm.h"
#include "collective/engine/control_plane.h"
#include "mwms/errors.h"

namespace mwms::collective {

/// One checked call: identity (kind, dtype, op, count, root, seq) and buffers.
struct CollectiveArgs {
  CollectiveCall call;
  Buffers buffers;
};

class Backend {
 public:
  virtual ~Backend() = default;
  /// "engine", "nccl".
  virtual const char* name() const noexcept = 0;
  /// One line for the start-up log: transports per peer, algorithms, chunk size.
  virtual std::string describe() const = 0;
  /// Runs `args` to completion on this rank. Blocking; one call at a time. @throws the mwms
  /// errors of the collective (TimeoutError, PeerError, CollectiveMismatchError, ...) with
  /// `ctx` filled in.
  virtual void run(const CollectiveArgs& args, const ErrorContext& ctx) = 0;
  /// AlgorithmId of the last collective run() started (0xff: none or not applicable), for the
  /// trace (trace.h).
  virtual std::uint8_t last_algorithm() const noexcept { return 0xff; }
  /// Tells every peer that `failed_rank` failed (best effort, never throws); `why` is the
  /// FailureCause of this rank's error, which the peers' relayed errors carry.
  virtual void abort(int failed_rank, const std::string& reason, AbortCause cause,
                     FailureCause why) noexcept = 0;
  /// Tells every peer that this rank finalized after `collectives` collectives (Note [finalize]
  /// in control_plane.h; best effort, bounded, never throws). The front end destroys the backend
  /// right after, which closes the links.
  virtual void finalize(std::uint64_t collectives) noexcept = 0;
};

}  // namespace mwms::collective
