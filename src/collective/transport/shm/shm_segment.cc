#include "collective/transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <string>

#include "collective/transport/shm/memfd.h"
#include "common/descriptors.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

constexpr std::uint64_t kMagic = 0x314d4853534d574dULL;  // "MWMSSHM1" little endian
constexpr std::uint32_t kVersion = 2;                    // 2: the flat area after the header page
constexpr std::size_t kPage = 4096;
constexpr std::size_t kDoorbellOffset = 1024;  // past the header, on a 64-byte line of its own
constexpr std::size_t kMaxAddressBytes = kMaxMemfdAddressBytes;  // off the wire: bounded
// Bounds on ring and world size, checked before total_bytes() multiplies them: 2^20 slots of
// 2^32 + 4 KiB bytes stay below 2^53, so neither a size nor a slot offset can wrap.
constexpr std::uint64_t kMaxRingBytes = 1ULL << 32;
constexpr long long kMaxWorld = 1 << 20;

// At offset 0 of every segment (Note [shm segment]).
struct SegmentHeader {
  std::uint64_t magic;
  std::uint32_t version;
  std::int32_t rank;
  std::int32_t world_size;
  std::int32_t pid;
  std::uint64_t ring_bytes;
  std::uint64_t total_bytes;
  std::uint64_t fingerprint;
  std::uint64_t nonce[2];
};
static_assert(sizeof(SegmentHeader) <= kDoorbellOffset, "header overlaps the doorbell");
static_assert(sizeof(ByteRingControl) <= kPage, "ring control exceeds its page");

// Tells another job's segment apart; not a secret (only the owner's user can open its
// /proc/<pid>/fd), so a fixed-size hash in the header is enough.
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The header page and the flat area (Note [flat slots]): allocated and mapped at creation.
constexpr std::size_t kFrontBytes = kPage + kFlatAreaBytes + kFlatStageAreaBytes;
static_assert(kFlatAreaBytes % kPage == 0 && kFlatStageAreaBytes % kPage == 0,
              "the rings' slots must stay page aligned");

std::size_t total_bytes(int world_size, std::size_t ring_bytes) {
  return kFrontBytes + static_cast<std::size_t>(world_size) * shm_slot_bytes(ring_bytes);
}

std::string errno_text(int err) { return common::errno_description(err); }

}  // namespace

std::size_t shm_slot_bytes(std::size_t ring_bytes) noexcept {
  // Page granularity: each slot is fallocated and prefaulted on its own, and its data starts page
  // (hence 64-byte) aligned, as Note [ring link layout] needs.
  return kPage + (ring_bytes + kPage - 1) / kPage * kPage;
}

std::size_t ShmSegment::slot_offset(int sender) const noexcept {
  return kFrontBytes + static_cast<std::size_t>(sender) * shm_slot_bytes(ring_bytes_);
}

namespace {
std::atomic<std::uint64_t> segments_created{0};
}  // namespace

std::uint64_t ShmSegment::created_count() noexcept {
  // Relaxed: a counter for tests, it orders no other memory.
  return segments_created.load(std::memory_order_relaxed);
}

std::shared_ptr<ShmSegment> ShmSegment::create(int rank, int world_size, std::size_t ring_bytes,
                                               const std::string& job_fingerprint) {
  if (ring_bytes % kPage != 0 || ring_bytes == 0 || ring_bytes > kMaxRingBytes) {
    throw InvalidArgument("shared-memory ring size " + std::to_string(ring_bytes) +
                          " must be a positive multiple of 4096 of at most 4 GiB");
  }
  std::shared_ptr<ShmSegment> s(new ShmSegment());
  s->ring_bytes_ = ring_bytes;
  s->world_size_ = world_size;
  s->size_ = total_bytes(world_size, ring_bytes);
  // CLOEXEC: a program the caller execs must not inherit (and keep alive) the segment; peers
  // reach it through /proc/<pid>/fd, which needs only this process to hold the fd.
  s->fd_ = ::memfd_create("mwms-shm", MFD_CLOEXEC);
  if (s->fd_ < 0) throw_shm_error("memfd_create", errno);
  segments_created.fetch_add(1, std::memory_order_relaxed);
  // Sized for every possible sender but sparse: only reserve()d slots ever get pages.
  if (::ftruncate(s->fd_, static_cast<off_t>(s->size_)) != 0) {
    throw_shm_error("ftruncate to " + std::to_string(s->size_) + " bytes", errno);
  }
  // The header page and the flat area are written from now on: allocate them first, so a full
  // shm fails here, not with SIGBUS.
  int rc = ::posix_fallocate(s->fd_, 0, static_cast<off_t>(kFrontBytes));
  // EOPNOTSUPP: a file system without fallocate; go on without the early check.
  if (rc != 0 && rc != EOPNOTSUPP) throw_shm_error("allocating the header page and flat area", rc);
  void* p = ::mmap(nullptr, s->size_, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  if (p == MAP_FAILED) throw_shm_error("mmap of " + std::to_string(s->size_) + " bytes", errno);
  s->base_ = static_cast<char*>(p);
  // Note [shm prefault]: the flat all-reduce's first calls must not take page faults.
  rc = prefault(s->base_, kFrontBytes);
  if (rc != 0) throw_shm_error("mapping the header page and flat area", rc);
  random_nonce(s->nonce_);
  auto* h = reinterpret_cast<SegmentHeader*>(s->base_);
  h->version = kVersion;
  h->rank = rank;
  h->world_size = world_size;
  h->pid = static_cast<std::int32_t>(::getpid());
  h->ring_bytes = ring_bytes;
  h->total_bytes = s->size_;
  h->fingerprint = fnv1a(job_fingerprint);
  h->nonce[0] = s->nonce_[0];
  h->nonce[1] = s->nonce_[1];
  // No peer can reach the segment before its address is published, so the owner may construct
  // the doorbell in place; the rings are never constructed (see the end of reserve()).
  new (s->base_ + kDoorbellOffset) Doorbell();
  // Peers read the header only after the peer-info exchange (a TCP round trip) that follows.
  reinterpret_cast<std::atomic<std::uint64_t>*>(&h->magic)->store(kMagic,
                                                                  std::memory_order_release);
  return s;
}

std::shared_ptr<ShmSegment> ShmSegment::open(const std::string& address, int owner, int world_size,
                                             const std::string& job_fingerprint) {
  MemfdAddress a;
  if (!parse_memfd_address(address, &a)) {
    throw BootstrapError("its shared-memory address \"" + address.substr(0, kMaxAddressBytes) +
                         "\" is malformed (expected pid:fd:bytes:nonce)");
  }
  // Opening the owner's fd through /proc gives this process its own descriptor of the same memfd;
  // the kernel allows it to the owner's user, and the pid names the owner only in its own pid
  // namespace.
  const std::string path = "/proc/" + std::to_string(a.pid) + "/fd/" + std::to_string(a.fd);
  std::shared_ptr<ShmSegment> s(new ShmSegment());
  s->fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (s->fd_ < 0) {
    const int err = errno;
    throw BootstrapError("cannot open its shared-memory segment " + path + ": " + errno_text(err) +
                         " (the process is gone, runs as another user or in another pid "
                         "namespace; set MWMS_SHM_DISABLE=1 to use TCP between ranks on this "
                         "host)");
  }
  // Everything is checked through fstat and pread before anything is mapped: a recycled pid or fd
  // may now name a socket, a pipe or another file, which must not be mapped, let alone written.
  struct stat st;
  SegmentHeader h;
  const bool sized = ::fstat(s->fd_, &st) == 0 && S_ISREG(st.st_mode) &&
                     static_cast<std::uint64_t>(st.st_size) == a.bytes && a.bytes >= kPage;
  if (!sized || ::pread(s->fd_, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h)) ||
      h.magic != kMagic || h.nonce[0] != a.nonce[0] || h.nonce[1] != a.nonce[1]) {
    throw BootstrapError("its shared-memory address " + path +
                         " does not lead to its segment (a stale or recycled address: the "
                         "nonce, magic or size does not match)");
  }
  // The address's size must also be the one this rank computes from the header: every slot offset
  // below is computed locally and must stay inside the mapping.
  if (h.version != kVersion || h.rank != owner || h.world_size != world_size ||
      h.fingerprint != fnv1a(job_fingerprint) || h.ring_bytes == 0 || h.ring_bytes % kPage != 0 ||
      h.ring_bytes > kMaxRingBytes || world_size > kMaxWorld || h.total_bytes != a.bytes ||
      total_bytes(world_size, h.ring_bytes) != a.bytes) {
    throw BootstrapError("its shared-memory segment belongs to another job or version (rank " +
                         std::to_string(h.rank) + " of " + std::to_string(h.world_size) +
                         ", version " + std::to_string(h.version) + ")");
  }
  s->size_ = static_cast<std::size_t>(a.bytes);
  s->ring_bytes_ = static_cast<std::size_t>(h.ring_bytes);  // the owner sizes its inbound rings
  s->world_size_ = world_size;
  s->nonce_[0] = h.nonce[0];
  s->nonce_[1] = h.nonce[1];
  void* p = ::mmap(nullptr, s->size_, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  if (p == MAP_FAILED) throw_shm_error("mmap of " + std::to_string(s->size_) + " bytes", errno);
  s->base_ = static_cast<char*>(p);
  // Note [shm prefault]: this rank reads the owner's flat area (Note [flat slots]) from its first
  // small all-reduce on.
  const int rc = prefault(s->base_ + kPage, kFlatAreaBytes + kFlatStageAreaBytes);
  if (rc != 0) throw_shm_error("mapping the peer's flat and staging areas", rc);
  return s;
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

std::string ShmSegment::address() const { return format_memfd_address(fd_, size_, nonce_); }

ByteRing ShmSegment::inbound(int sender) const {
  char* slot = base_ + slot_offset(sender);
  return ByteRing{reinterpret_cast<ByteRingControl*>(slot), slot + kPage, ring_bytes_};
}

Doorbell* ShmSegment::doorbell() const {
  return reinterpret_cast<Doorbell*>(base_ + kDoorbellOffset);
}

char* ShmSegment::flat_area() const { return base_ + kPage; }
char* ShmSegment::stage_area() const { return base_ + kPage + kFlatAreaBytes; }

// Memory this host can give shared memory: MemAvailable, capped by the memory cgroup's headroom
// (cgroup v2) when there is one. 0 when unknown.
static std::uint64_t available_memory_bytes() {
  std::uint64_t avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      avail = kib * 1024;
      break;
    }
  }
  // Shared-memory pages are charged to the memory cgroup of the process that allocates them, so a
  // container's limit binds before the host's MemAvailable does.
  std::ifstream max_file("/sys/fs/cgroup/memory.max");
  std::ifstream cur_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  std::uint64_t current = 0;
  if (max_file >> max_text && max_text != "max" && cur_file >> current) {
    std::uint64_t limit = std::strtoull(max_text.c_str(), nullptr, 10);
    std::uint64_t headroom = limit > current ? limit - current : 0;
    avail = avail == 0 ? headroom : std::min(avail, headroom);
  }
  return avail;
}

void ShmSegment::reserve(const std::vector<int>& senders) {
  std::size_t needed = senders.size() * shm_slot_bytes(ring_bytes_);
  // Shared memory is memory: rings that would take more than half of what the host has left (for
  // all of its ranks together) fail here with a clear error instead of waking the OOM killer.
  const std::uint64_t available = available_memory_bytes();
  // `senders` are this rank's peers on the host: each of the senders.size() + 1 ranks here
  // reserves as many rings, so the host needs that many times this rank's share.
  const std::uint64_t host_total = static_cast<std::uint64_t>(needed) * (senders.size() + 1);
  if (available > 0 && host_total > available / 2) {
    throw BackendError("shared memory is too small: the rings need " + std::to_string(needed) +
                           " bytes per rank (" + std::to_string(host_total) + " for the " +
                           std::to_string(senders.size() + 1) + " ranks of this host), more than "
                           "half of the " + std::to_string(available) + " bytes of memory "
                           "available; lower MWMS_SHM_RING_BYTES or set MWMS_SHM_DISABLE=1 to "
                           "use TCP between ranks on this host",
                       ENOMEM);
  }
  for (int sender : senders) {
    // Both ends of a ring reserve it (whoever connects first allocates); a second fallocate of
    // allocated pages changes nothing. Without fallocate support, prefault's populating write is
    // what allocates, so a full shared memory still fails here rather than with SIGBUS.
    int rc = ::posix_fallocate(fd_, static_cast<off_t>(slot_offset(sender)),
                               static_cast<off_t>(shm_slot_bytes(ring_bytes_)));
    if (rc == EOPNOTSUPP || rc == 0) rc = prefault(base_ + slot_offset(sender), shm_slot_bytes(ring_bytes_));
    if (rc == 0) continue;
    throw BackendError("shared memory is too small: the rings need " + std::to_string(needed) +
                           " bytes (" + std::to_string(senders.size()) + " peers x " +
                           std::to_string(shm_slot_bytes(ring_bytes_)) +
                           " bytes) and allocating them failed: " + errno_text(rc) +
                           "; free memory, lower MWMS_SHM_RING_BYTES, or set "
                           "MWMS_SHM_DISABLE=1 to use TCP between ranks on this host",
                       rc);
  }
  // No construction: a fresh memfd reads as zeros, which is an empty ByteRingControl, and the
  // sender may already be writing (it reserves the ring too, Note [shm segment]).
}

}  // namespace mwms::collective
