// The shared-memory segment of one rank (DESIGN "The transport seam"): its inbound byte rings,
// one per possible sender, and its doorbell (ring_link.h). Every rank creates its segment before
// the peer-info exchange and publishes an address; its peers on the same host map it when they
// connect and write their messages for this rank into the ring indexed by their own rank.
//
// Note [shm segment]: the segment is an anonymous memfd (memfd_create), so nothing has a name
// that a killed job could leave behind or a new job could trip over: the memory goes away with
// the last process that maps it. Its address is "pid:fd:bytes:nonce" and a peer opens it through
// /proc/<pid>/fd/<fd> (same user, same pid namespace). The segment starts with a header page
// (magic, version, owner rank, world size, ring capacity, a hash of the job fingerprint and a
// 128-bit random nonce) that the opener checks against the address and its own job, so a stale
// or recycled address (another process at that pid, another file at that fd, another job)
// is refused with BootstrapError instead of being written into. Layout, every part page aligned:
//
//   [header page: SegmentHeader, Doorbell at kDoorbellOffset]
//   [flat area: kFlatAreaBytes, written by the owner only (Note [flat slots], link.h)]
//   [staging area: kFlatStageAreaBytes, written by the owner only (Note [flat staging])]
//   [slot 0: ByteRingControl page | data, ring_bytes] ... [slot world_size - 1]
//
// The file is sized (ftruncate) for world_size slots but is sparse: only the slots of senders on
// this host are ever touched, and those are allocated up front (reserve(), fallocate: by the
// owner for its inbound rings and by each sender for the ring it writes, whichever connects
// first) so that a shared memory that is too small fails at setup with BackendError instead of
// SIGBUS later.
//
// Note [shm prefault]: fallocate gives the rings their pages, but each process still takes a
// page fault at its first touch of each 4 KiB of its mapping: the sender on writing, the owner
// on reading, 2 x 256 faults per 1 MiB ring. A job's first collectives then ran until the ring
// had wrapped once: measured with all_reduce_perf -b 8 -e 128K -f 4 -n 20 -w 5, n = 2 over shm,
// 32 KiB took 27-30 us (Open MPI 21 us) but 4.5 us once the ring was warm, and 128 KiB 18 us.
// reserve() therefore also populates this process's page tables for those rings
// (madvise(MADV_POPULATE_WRITE), Linux 5.14; older kernels: one read per page), which changes no
// byte (the sender may already be writing) and turns a failed allocation into an error there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective/transport/ring_link.h"

namespace mwms::collective {

class ShmSegment {
 public:
  /// Creates the segment of `rank` (Note [shm segment]) with inbound rings of `ring_bytes` (a
  /// multiple of 4096) from each of `world_size` ranks. @throws BackendError naming the call.
  static std::shared_ptr<ShmSegment> create(int rank, int world_size, std::size_t ring_bytes,
                                            const std::string& job_fingerprint);
  /// Maps the segment that rank `owner` published as `address`, checking it against the
  /// address, `world_size` and `job_fingerprint`. @throws BootstrapError (the message says what
  /// did not match; the caller adds the peer).
  static std::shared_ptr<ShmSegment> open(const std::string& address, int owner, int world_size,
                                          const std::string& job_fingerprint);
  /// Segments this process has created so far (for tests: a job whose links all use another
  /// transport creates none). Thread-safe.
  static std::uint64_t created_count() noexcept;
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  /// "pid:fd:bytes:nonce" (Note [shm segment]); valid while this segment exists.
  std::string address() const;
  /// The ring of this segment that rank `sender` writes.
  ByteRing inbound(int sender) const;
  /// The owner's doorbell.
  Doorbell* doorbell() const;
  /// The owner's flat area (Note [flat slots], link.h): kFlatAreaBytes, page aligned, allocated
  /// and mapped with the header page.
  char* flat_area() const;
  /// The owner's staging area (Note [flat staging], engine/flat_runner.cc): kFlatStageAreaBytes
  /// after the flat area, allocated and mapped with it.
  char* stage_area() const;
  /// Capacity of each inbound ring.
  std::size_t ring_bytes() const noexcept { return ring_bytes_; }
  /// Bytes of the whole (sparse) segment.
  std::size_t size() const noexcept { return size_; }
  /// Allocates the memory of the rings written by `senders` now and maps it into this process
  /// (Note [shm prefault]). @throws BackendError naming the bytes needed and MWMS_SHM_DISABLE
  /// when the shared memory is too small.
  void reserve(const std::vector<int>& senders);

 private:
  ShmSegment() = default;
  std::size_t slot_offset(int sender) const noexcept;

  int fd_ = -1;
  char* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t ring_bytes_ = 0;
  int world_size_ = 0;
  std::uint64_t nonce_[2] = {0, 0};
};

/// Bytes of one sender's slot for rings of `ring_bytes` (control page + data).
std::size_t shm_slot_bytes(std::size_t ring_bytes) noexcept;

}  // namespace mwms::collective
