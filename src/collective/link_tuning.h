// What the algorithm selector reads of a communicator's links (Note [transport table]): each
// transport states, in its table entry, where the selector's size thresholds lie over its
// links, so that the selector never asks which transport a link is. Measured per transport with
// all_reduce_perf (docs/algorithms.md, Note [selector thresholds] in selector.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mwms::collective {

/// Size thresholds of the all-reduce selector over one kind of link. The defaults are the
/// selector's own (TCP's links keep them).
struct LinkTuning {
  /// Recursive doubling takes messages up to min(MWMS_SMALL_MESSAGE_BYTES, this): over links
  /// where a latency costs little and bytes are cheap to copy (shared memory) its whole-buffer
  /// exchanges stop paying off much earlier. SIZE_MAX: no cap.
  std::size_t small_message_max_bytes = SIZE_MAX;
  /// Rabenseifner takes medium messages up to this; 0: the selector's default (4 MiB for a
  /// power-of-two world, 1 MiB otherwise).
  std::size_t rabenseifner_max_bytes = 0;
  /// Two ranks: one whole-buffer exchange (recursive doubling) beats two half steps up to this
  /// (links that pay a rendezvous per message, MPI); 0: never.
  std::size_t pair_exchange_max_bytes = 0;
  /// Two ranks above the small messages: the ring, which reduces chunks as they land (true), or
  /// Rabenseifner's halves up to rabenseifner_max_bytes (false: MPI, whose single-copy path
  /// pulls each piece on the receiver).
  bool two_rank_ring = true;
  /// Note [flat slots] (transport/link.h): every link of this transport offers flat_slots(), so
  /// the flat all-reduce (algorithms/flat_all_reduce.cc) may run over it.
  bool flat_slots = false;
  /// All-reduces up to min(MWMS_SMALL_MESSAGE_BYTES, this) take the flat all-reduce when
  /// flat_slots holds; 0: only when MWMS_ALGO=flat forces it.
  std::size_t flat_max_bytes = 0;
  /// With flat_slots, when ranks outnumber cores (Topology::ranks_exceed_cores): all-reduces up
  /// to this take the flat all-reduce, staged above its lines (Note [flat staging]); 0: never.
  std::size_t flat_oversubscribed_max_bytes = 0;
};

}  // namespace mwms::collective
