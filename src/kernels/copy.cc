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
  std::memcpy(d, s, n % 64);
  // The streamed lines are weakly ordered: visible before any later store (a completion flag).
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

namespace {

// The size of the last-level cache instance cpu0 shares (sysfs: the per-instance size, where
// sysconf(_SC_LEVEL3_CACHE_SIZE) may report a whole socket's); 0 when unknown.
std::size_t last_level_cache_bytes() {
  std::size_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size"), type_file(dir + "type");
    int level = 0;
    std::string size, type;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    type_file >> type;
    if (type == "Instruction" || level < best_level) continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(size.c_str(), &end, 10);
    const std::size_t scale = (*end == 'K') ? 1024 : (*end == 'M') ? (1u << 20) : 1;
    if (v == 0 || v > (1ull << 40) / scale) continue;  // bounded: a size file we cannot read
    best = static_cast<std::size_t>(v) * scale;
    best_level = level;
  }
  return best;
}

}  // namespace

std::size_t streaming_copy_min_bytes() noexcept {
  static const std::size_t bytes = [] {
    long long set = -1;
    try {
      set = common::env_int("MWMS_STREAMING_COPY_MIN_BYTES");
    } catch (...) {  // a bad value: the error is reported where the environment is checked
      set = -1;
    }
    if (set >= 0) return static_cast<std::size_t>(set);
    std::size_t cache = 0;
    try {
      cache = last_level_cache_bytes();
    } catch (...) {
      cache = 0;
    }
    return cache > 0 ? cache : std::size_t{32} << 20;
  }();
  return bytes;
}

}  // namespace mwms::kernels
