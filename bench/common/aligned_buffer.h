// Host buffers for the tools that time memory passes (reduce_kernel_perf, mem_bw_perf).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace mwms::bench {

/// `bytes` rounded up to 64, 64-byte aligned (vector loads start on a cache line, as for the
/// page-aligned buffers an all-reduce usually works on) and zeroed, so that no page fault is
/// timed later. @throws std::bad_alloc.
struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t bytes)
      : size((bytes + 63) / 64 * 64),
        data(static_cast<unsigned char*>(std::aligned_alloc(64, size)), &std::free) {
    if (!data) throw std::bad_alloc();
    std::memset(data.get(), 0, size);
  }
  std::size_t size;
  std::unique_ptr<unsigned char, decltype(&std::free)> data;
};

}  // namespace mwms::bench
