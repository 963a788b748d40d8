// The memfd helpers of memfd.h (Note [shm segment] in shm_segment.h).
#include "collective/transport/shm/memfd.h"

#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <string>

#include "common/descriptors.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

constexpr std::size_t kPage = 4096;

// Parses a non-negative decimal of at most 19 digits; false for anything else. 19 digits stay
// below 2^64, so the accumulation below cannot wrap.
bool parse_decimal(const std::string& s, std::uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

bool parse_hex64(const std::string& s, std::uint64_t* out) {
  if (s.size() != 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace

[[noreturn]] void throw_shm_error(const std::string& what, int err) {
  throw BackendError("shared memory: " + what + " failed: " + common::errno_description(err) +
                         " (set MWMS_SHM_DISABLE=1 to use TCP between ranks on this host)",
                     err);
}

// The nonce only has to differ between segments (a recycled pid:fd names another file), not to
// be secret: where getrandom is missing (ENOSYS before Linux 3.17, a seccomp filter),
// std::random_device does.
void random_nonce(std::uint64_t out[2]) {
  if (::getrandom(out, 2 * sizeof(std::uint64_t), 0) == 2 * sizeof(std::uint64_t)) return;
  std::random_device rd;
  for (int i = 0; i < 2; ++i) {
    out[i] = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }
}

// "pid:fd:bytes:nonce" with a 32-hex-digit nonce; the address came off the wire: bound it all.
bool parse_memfd_address(const std::string& text, MemfdAddress* a) {
  if (text.size() > kMaxMemfdAddressBytes) return false;
  std::string parts[4];
  std::size_t at = 0;
  for (int i = 0; i < 4; ++i) {
    std::size_t end = i < 3 ? text.find(':', at) : text.size();
    if (end == std::string::npos) return false;
    parts[i] = text.substr(at, end - at);
    at = end + 1;
  }
  // pid and fd must fit an int (Linux's pid_max is at most 2^22); the nonce is 2 x 64 bits.
  return parse_decimal(parts[0], &a->pid) && a->pid > 0 && a->pid < (1u << 30) &&
         parse_decimal(parts[1], &a->fd) && a->fd < (1u << 30) &&
         parse_decimal(parts[2], &a->bytes) && parts[3].size() == 32 &&
         parse_hex64(parts[3].substr(0, 16), &a->nonce[0]) &&
         parse_hex64(parts[3].substr(16), &a->nonce[1]);
}

// Note [shm prefault]: maps the pages of [p, p + bytes) (page aligned) into this process without
// changing a byte; returns 0 or the errno of a failed allocation.
int prefault(char* p, std::size_t bytes) {
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return 0;
  // EINVAL: this kernel does not know MADV_POPULATE_WRITE; every other errno is a real failure.
  if (errno != EINVAL) return errno;  // ENOMEM, EFAULT: the pages could not be allocated
  // A kernel before 5.14: a read maps a page of a shared mapping (with its write permission).
  for (std::size_t off = 0; off < bytes; off += kPage) {
    (void)*static_cast<volatile char*>(p + off);  // volatile: the compiler must keep the read
  }
  return 0;
}

std::string format_memfd_address(int fd, std::size_t bytes, const std::uint64_t nonce[2]) {
  char buf[kMaxMemfdAddressBytes];
  std::snprintf(buf, sizeof(buf), "%d:%d:%zu:%016llx%016llx", static_cast<int>(::getpid()), fd,
                bytes, static_cast<unsigned long long>(nonce[0]),
                static_cast<unsigned long long>(nonce[1]));
  return buf;
}

}  // namespace mwms::collective
