/// @file rng.h
/// Portable random numbers for the train program. std::uniform_*_distribution and std::shuffle
/// are implementation-defined, so two workers built against different standard libraries could
/// disagree; std::mt19937_64's output sequence is fixed by the standard, and everything here is
/// derived from it with our own arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace mwms::train {

/// splitmix64 finaliser: turns (seed, stream) pairs into well-spread generator seeds, so the
/// epoch-e shuffle and the initial weights draw from unrelated sequences.
inline std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Uniform integer in [0, n), n > 0, without modulo bias (rejects the top partial range).
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
  std::uint64_t r;
  do {
    r = rng();
  } while (r >= limit);
  return r % n;
}

/// Uniform float in [-bound, bound) from the top 24 bits (exact in float32).
inline float uniform_symmetric(std::mt19937_64& rng, float bound) {
  const float u = static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * u - 1.0f) * bound;
}

/// Fisher-Yates: a uniformly random permutation of 0..n-1 written into `out` (resized to n).
inline void random_permutation(std::mt19937_64& rng, std::size_t n,
                               std::vector<std::uint32_t>& out) {
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(i);
  for (std::size_t i = n; i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(uniform_below(rng, i));
    std::swap(out[i - 1], out[j]);
  }
}

/// Stream ids for mix_seed: one for initial weights, one per epoch's shuffle.
inline constexpr std::uint64_t kInitStream = 0;
inline std::uint64_t shuffle_stream(int epoch) { return 1 + static_cast<std::uint64_t>(epoch); }

}  // namespace mwms::train
