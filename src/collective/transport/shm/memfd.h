// What a shared memfd needs on both sides (Note [shm segment] in shm_segment.h): its address
// "pid:fd:bytes:nonce" (formatted by the owner, parsed bounded by the opener, since it comes off
// the wire), the random nonce that tells a recycled pid:fd apart, page prefaulting (Note [shm
// prefault]) and the error every failed call raises. Used by ShmSegment and by a parameter
// server's shared values (strategy/ps/ps_shared_values.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mwms::collective {

/// The longest address parse_memfd_address accepts.
inline constexpr std::size_t kMaxMemfdAddressBytes = 128;

struct MemfdAddress {
  std::uint64_t pid = 0;
  std::uint64_t fd = 0;
  std::uint64_t bytes = 0;
  std::uint64_t nonce[2] = {0, 0};
};

/// "pid:fd:bytes:nonce" of this process's descriptor `fd` (32 hex digits of nonce).
std::string format_memfd_address(int fd, std::size_t bytes, const std::uint64_t nonce[2]);
/// Bounded total parse of format_memfd_address's output (at most kMaxMemfdAddressBytes; pid and
/// fd below 2^30); false for anything else.
bool parse_memfd_address(const std::string& text, MemfdAddress* out);
/// 128 random bits (getrandom, else std::random_device): they only have to differ per file.
void random_nonce(std::uint64_t out[2]);
/// Maps the pages of [p, p + bytes) (page aligned) into this process without changing a byte;
/// returns 0 or the errno of a failed allocation (Note [shm prefault]).
int prefault(char* p, std::size_t bytes);
/// @throws BackendError "shared memory: <what> failed: <errno text> (set MWMS_SHM_DISABLE=1 ...)"
[[noreturn]] void throw_shm_error(const std::string& what, int err);

}  // namespace mwms::collective
