// kernels::copy_streaming (Note [streaming copy-out]): byte-exact at every alignment and length,
// including the cached head and tail around the streamed lines.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/copy.h"

namespace {

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) % 251);
  return v;
}

}  // namespace

TEST_CASE("copy_streaming copies every byte and nothing outside, at every alignment",
          "[unit][kernels]") {
  const std::vector<unsigned char> src = pattern(4096 + 128, 7);
  for (std::size_t dst_off = 0; dst_off < 64; dst_off += 5) {
    for (std::size_t src_off = 0; src_off < 64; src_off += 9) {
      for (std::size_t n : {0u, 1u, 15u, 63u, 64u, 65u, 127u, 200u, 1000u, 4096u}) {
        std::vector<unsigned char> dst(4096 + 256, 0xEE);
        mwms::kernels::copy_streaming(dst.data() + 64 + dst_off, src.data() + src_off, n);
        INFO("dst offset " << dst_off << ", src offset " << src_off << ", " << n << " bytes");
        CHECK(std::memcmp(dst.data() + 64 + dst_off, src.data() + src_off, n) == 0);
        bool untouched = true;
        for (std::size_t i = 0; i < 64 + dst_off; ++i) untouched = untouched && dst[i] == 0xEE;
        for (std::size_t i = 64 + dst_off + n; i < dst.size(); ++i) {
          untouched = untouched && dst[i] == 0xEE;
        }
        CHECK(untouched);
      }
    }
  }
}

TEST_CASE("copy_streaming copies a buffer larger than the caches exactly", "[unit][kernels]") {
  const std::size_t n = (std::size_t{8} << 20) + 13;
  const std::vector<unsigned char> src = pattern(n, 3);
  std::vector<unsigned char> dst(n + 3, 0);
  mwms::kernels::copy_streaming(dst.data() + 3, src.data(), n);
  CHECK(std::memcmp(dst.data() + 3, src.data(), n) == 0);
}

TEST_CASE("streaming_copy_min_bytes is the setting or a cache size", "[unit][kernels]") {
  // MWMS_STREAMING_COPY_MIN_BYTES is unset in the unit tests: a cache's size, at least 256 KiB
  // on any CPU this runs on, and the same on every call.
  const std::size_t b = mwms::kernels::streaming_copy_min_bytes();
  CHECK(b >= (std::size_t{256} << 10));
  CHECK(b == mwms::kernels::streaming_copy_min_bytes());
}
