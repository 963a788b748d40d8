// A parameter server's shared values (Note [ps shared values] in ps_shared_values.h).
#include "strategy/ps/ps_shared_values.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "collective/transport/shm/memfd.h"
#include "common/descriptors.h"
#include "mwms/errors.h"

namespace mwms::strategy::ps {

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::uint64_t kMagic = 0x31565350534d574dULL;  // "MWMSPSV1" little endian
// Counts whose buffer stays far below what a size_t or off_t holds (2^40 floats, as the ps
// description bounds its counts).
constexpr std::size_t kMaxCount = std::size_t{1} << 40;

// The control page, at offset 0: what an opener checks (read with pread before mapping), then
// the progress word on a line of its own (the ps writes it per range of an update).
struct ControlHead {
  std::uint64_t magic;
  std::uint64_t count;
  std::uint64_t nonce[2];
};
struct Control {
  ControlHead head;
  alignas(64) std::atomic<std::uint64_t> ready;
};
static_assert(sizeof(Control) <= kPage, "the control page overflows");

std::size_t region_bytes(std::size_t count) {
  return kPage + (count * sizeof(float) + kPage - 1) / kPage * kPage;
}

}  // namespace

std::unique_ptr<SharedValues> SharedValues::create(std::size_t count) {
  if (count > kMaxCount)
    throw InvalidArgument("a ps buffer of " + std::to_string(count) +
                          " floats is larger than 2^40");
  std::unique_ptr<SharedValues> s(new SharedValues());
  s->count_ = count;
  s->bytes_ = region_bytes(count);
  s->fd_ = ::memfd_create("mwms-ps-values", MFD_CLOEXEC);
  if (s->fd_ < 0) collective::throw_shm_error("memfd_create for the ps's values", errno);
  const std::string what = std::to_string(s->bytes_) + " bytes of ps values";
  if (::ftruncate(s->fd_, static_cast<off_t>(s->bytes_)) != 0) {
    collective::throw_shm_error("ftruncate to " + what, errno);
  }
  // Allocated now, so that a /dev/shm too small fails here and not with SIGBUS in an update.
  const int rc = ::posix_fallocate(s->fd_, 0, static_cast<off_t>(s->bytes_));
  if (rc != 0 && rc != EOPNOTSUPP) collective::throw_shm_error("allocating " + what, rc);
  void* p = ::mmap(nullptr, s->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  if (p == MAP_FAILED) collective::throw_shm_error("mmap of " + what, errno);
  s->base_ = static_cast<char*>(p);
  const int pf = collective::prefault(s->base_, s->bytes_);
  if (pf != 0) collective::throw_shm_error("mapping " + what, pf);
  collective::random_nonce(s->nonce_);
  // Nobody maps it before its address is sent, so the control page is constructed in place.
  auto* c = new (s->base_) Control();
  c->head = ControlHead{kMagic, count, {s->nonce_[0], s->nonce_[1]}};
  c->ready.store(count, std::memory_order_release);
  s->ready_ = &c->ready;
  s->values_ = reinterpret_cast<float*>(s->base_ + kPage);
  return s;
}

std::unique_ptr<SharedValues> SharedValues::open(const std::string& address, std::size_t count) {
  collective::MemfdAddress a;
  if (address.size() > kMaxSharedAddressBytes || !collective::parse_memfd_address(address, &a)) {
    throw BootstrapError("its shared values' address is malformed (expected pid:fd:bytes:nonce)");
  }
  const std::string path = "/proc/" + std::to_string(a.pid) + "/fd/" + std::to_string(a.fd);
  std::unique_ptr<SharedValues> s(new SharedValues());
  s->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (s->fd_ < 0) {
    throw BootstrapError("cannot open its shared values " + path + ": " +
                         common::errno_description(errno) +
                         " (set MWMS_PS_SHARED_VALUES=0 for the ps task to send them "
                         "through the link instead)");
  }
  // As ShmSegment::open: everything is checked through fstat and pread before anything is mapped.
  struct stat st;
  ControlHead c;
  const bool sized = count <= kMaxCount && ::fstat(s->fd_, &st) == 0 && S_ISREG(st.st_mode) &&
                     static_cast<std::uint64_t>(st.st_size) == a.bytes &&
                     a.bytes == region_bytes(count);
  if (!sized || ::pread(s->fd_, &c, sizeof(c), 0) != static_cast<ssize_t>(sizeof(c)) ||
      c.magic != kMagic || c.count != count || c.nonce[0] != a.nonce[0] ||
      c.nonce[1] != a.nonce[1]) {
    throw BootstrapError("its shared values at " + path + " are not the " + std::to_string(count) +
                         " floats this worker's layout expects (a "
                         "stale or recycled address, or another layout)");
  }
  s->count_ = count;
  s->bytes_ = region_bytes(count);
  void* p = ::mmap(nullptr, s->bytes_, PROT_READ, MAP_SHARED, s->fd_, 0);
  if (p == MAP_FAILED) collective::throw_shm_error("mmap of the ps's values", errno);
  s->base_ = static_cast<char*>(p);
  s->ready_ = &reinterpret_cast<Control*>(s->base_)->ready;
  s->values_ = reinterpret_cast<float*>(s->base_ + kPage);
  s->nonce_[0] = a.nonce[0];
  s->nonce_[1] = a.nonce[1];
  return s;
}

SharedValues::~SharedValues() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::string SharedValues::address() const {
  return collective::format_memfd_address(fd_, bytes_, nonce_);
}

std::size_t SharedValues::ready() const noexcept {
  const std::uint64_t r = ready_->load(std::memory_order_acquire);
  return r < count_ ? static_cast<std::size_t>(r) : count_;  // never past the mapping
}

void SharedValues::publish(std::size_t n) noexcept {
  if (n > ready_->load(std::memory_order_relaxed)) ready_->store(n, std::memory_order_release);
}

void SharedValues::reset() noexcept { ready_->store(0, std::memory_order_relaxed); }

}  // namespace mwms::strategy::ps
