// The shared-memory transport (DESIGN "The transport seam"): links between ranks on one host are
// RingLinks over memory both processes map. Each rank owns one segment with its inbound rings
// and its doorbell (shm_segment.h, Note [shm segment]), created in phase 1 (its table entry) and
// published as this rank's "shm" address; connect() maps the segment of every peer it is given
// and pairs the rings: this rank writes the peer's inbound ring indexed by its own rank and reads
// its own inbound ring indexed by the peer. A dead peer is not seen on the rings (no EOF): the
// runner notices it through its closed control link (engine/control_plane.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/transport/shm/shm_segment.h"
#include "collective/transport/transport.h"

namespace mwms::collective {

class ShmTransport final : public Transport {
 public:
  /// Creates this rank's segment with rings of `ring_bytes` (a multiple of 4096).
  /// @throws BackendError when the segment cannot be created.
  ShmTransport(const TransportOptions& options, std::size_t ring_bytes);

  const TransportCaps& caps() const noexcept override { return caps_; }
  /// "pid:fd:bytes:nonce" of this rank's segment.
  std::string local_address() const override { return segment_->address(); }
  /// Maps every peer's segment and allocates the rings used. @throws BootstrapError naming the
  /// peer whose address is missing, malformed, stale or of another job; BackendError naming the
  /// bytes needed when the shared memory is too small.
  std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                             const ConnectContext& ctx) override;

 private:
  TransportOptions options_;
  TransportCaps caps_;
  std::shared_ptr<ShmSegment> segment_;
};

/// This rank's shm transport: nullptr when MWMS_SHM_DISABLE=1 or options.may_share_host is
/// false (every peer is surely on another host: a segment would be made, published and freed
/// unused). The ring size is MWMS_SHM_RING_BYTES, or 4 x chunk_bytes when 0, rounded up to 4096.
/// @throws InvalidArgument for a ring smaller than one chunk; BackendError when the segment
///   cannot be created.
std::unique_ptr<Transport> make_shm_transport(const TransportOptions& options);

/// The table's row (transport/registry.cc): the pairs of one host whose ends both published a
/// segment; above TCP under auto.
extern const TransportEntry kShmTransportEntry;

}  // namespace mwms::collective
