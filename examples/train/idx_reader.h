/// @file idx_reader.h
/// Reader for the IDX files of MNIST / Fashion-MNIST (gzip-compressed or plain), through zlib.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mwms::train {

/// Images of one IDX3 file: `count` images of rows x cols bytes, row-major, one after another.
struct IdxImages {
  std::size_t count = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint8_t> pixels;  ///< count * rows * cols bytes
  /// Bytes (and features) per image.
  std::size_t image_size() const noexcept { return rows * cols; }
};

/// One split of the dataset: images and their labels, same count.
struct Dataset {
  IdxImages images;
  std::vector<std::uint8_t> labels;  ///< one label in [0, num_classes) per image
  std::size_t size() const noexcept { return labels.size(); }
};

/// Reads an IDX3 image file (magic 0x00000803). gzip or plain (zlib reads both).
/// @throws std::runtime_error naming the file: cannot open, bad magic, zero dimensions, truncated.
IdxImages read_idx_images(const std::string& path);

/// Reads an IDX1 label file (magic 0x00000801); every label must be < `num_classes`.
/// @throws std::runtime_error naming the file.
std::vector<std::uint8_t> read_idx_labels(const std::string& path, int num_classes);

/// Loads split "train" or "t10k" from `dir` (`<split>-images-idx3-ubyte[.gz]` and
/// `<split>-labels-idx1-ubyte[.gz]`) and checks that both files hold the same number of items.
/// @throws std::runtime_error naming the directory and files.
Dataset load_split(const std::string& dir, const std::string& split, int num_classes);

}  // namespace mwms::train
