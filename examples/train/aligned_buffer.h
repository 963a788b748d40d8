/// @file aligned_buffer.h
/// FloatBuffer: a std::vector<float> whose storage starts on a 64-byte boundary.
///
/// Why: Eigen's vectorised loops peel a different number of leading elements depending on where
/// a buffer starts, which changes the order of float additions. Two workers (or two runs) whose
/// heaps happen to be laid out differently then compute gradients that differ in the last bit,
/// and a run stops being reproducible. With every buffer on a cache-line boundary (the widest
/// vector register, AVX-512, is 64 bytes) the arithmetic is the same every time.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace mwms::train {

inline constexpr std::size_t kBufferAlignment = 64;

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() noexcept = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kBufferAlignment}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete(p, std::align_val_t{kBufferAlignment});
  }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept { return false; }
};

using FloatBuffer = std::vector<float, AlignedAllocator<float>>;

}  // namespace mwms::train
