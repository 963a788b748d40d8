#include "input.h"

#include <random>

#include "rng.h"

namespace mwms::train {
namespace {

// Fashion-MNIST's training-set pixel mean and standard deviation (on the [0, 1] scale). Centring
// and scaling the inputs makes the first layer far better conditioned: with SGD at the default
// lr, three epochs reach ~0.87 test accuracy instead of ~0.85.
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

inline void convert_row(const std::uint8_t* src, std::size_t size, float* dst) {
  constexpr float kScale = 1.0f / (255.0f * kPixelStd);
  constexpr float kShift = -kPixelMean / kPixelStd;
  for (std::size_t k = 0; k < size; ++k) dst[k] = static_cast<float>(src[k]) * kScale + kShift;
}

}  // namespace

void epoch_order(std::uint64_t seed, int epoch, std::size_t n, std::vector<std::uint32_t>& out) {
  std::mt19937_64 rng(mix_seed(seed, shuffle_stream(epoch)));
  random_permutation(rng, n, out);
}

void gather_batch(const Dataset& data, const std::uint32_t* indices, std::size_t count, float* x,
                  std::uint8_t* labels) {
  const std::size_t size = data.images.image_size();
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t row = indices[i];
    convert_row(data.images.pixels.data() + row * size, size, x + i * size);
    labels[i] = data.labels[row];
  }
}

void gather_range(const Dataset& data, std::size_t begin, std::size_t count, float* x,
                  std::uint8_t* labels) {
  const std::size_t size = data.images.image_size();
  convert_row(data.images.pixels.data() + begin * size, count * size, x);
  for (std::size_t i = 0; i < count; ++i) labels[i] = data.labels[begin + i];
}

}  // namespace mwms::train
