// Streaming copies (Note [streaming copy-out] in copy.h).
#include "kernels/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "common/env.h"

namespace mwms::kernels {

void copy_streaming(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__x86_64__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Cached stores up to dst's next 64-byte boundary, so that every streamed line is whole.
  const std::size_t head =
      std::min<std::size_t>(n, (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const std::size_t lines = n / 64;
  // Only dst was aligned: src keeps whatever offset it had, hence unaligned loads. Four 16-byte
  // stores fill one line, so the write-combining buffer goes out whole, without a read.
  for (std::size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n % 64);  // a partial line: a cached store, as for the head
  // The streamed lines are weakly ordered: visible before any later store (a completion flag).
  _mm_sfence();
#else
  std::memcpy(dst, src, n);  // no portable non-temporal store: correct, only not streaming
#endif
}

namespace {

// The size of the last-level cache instance cpu0 shares (sysfs: the per-instance size, where
// sysconf(_SC_LEVEL3_CACHE_SIZE) may report a whole socket's); 0 when unknown.
std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  int best_level = 0;
  // x86 CPUs list about 4 indices (L1d, L1i, L2, L3); 16 only bounds the scan (gaps skipped).
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size"), type_file(dir + "type");
    int level = 0;
    std::string size, type;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    type_file >> type;
    // The copy's lines land in a data or unified cache; the highest such level is the one a
    // result larger than itself spills out of.
    if (type == "Instruction" || level < best_level) continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(size.c_str(), &end, 10);
    // sysfs writes sizes with a unit suffix ("48K", "32768K").
    const std::size_t scale = (*end == 'K') ? 1024 : (*end == 'M') ? (1u << 20) : 1;
    if (v == 0 || v > (1ull << 40) / scale) continue;  // bounded: a size file we cannot read
    best = static_cast<std::size_t>(v) * scale;
    best_level = level;
  }
  return best;
}

}  // namespace

std::size_t streaming_copy_min_bytes() noexcept {
  // Read once: the scan opens sysfs files, and the engine asks once per collective. The value is
  // a rank-local choice (copy.h): no peer needs to see the same one.
  static const std::size_t bytes = [] {
    long long set = -1;
    try {
      set = common::env_int("MWMS_STREAMING_COPY_MIN_BYTES");
    } catch (...) {  // a bad value: the error is reported where the environment is checked
      set = -1;
    }
    if (set >= 0) return static_cast<std::size_t>(set);  // 0: the caller's "never stream"
    std::size_t cache = 0;
    try {
      cache = last_level_cache_bytes();
    } catch (...) {  // noexcept: an unreadable sysfs (a container) only loses the tuning
      cache = 0;
    }
    return cache > 0 ? cache : std::size_t{32} << 20;
  }();
  return bytes;
}

}  // namespace mwms::kernels
