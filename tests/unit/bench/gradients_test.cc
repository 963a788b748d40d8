// bucket_perf's gradient tensors (bench/common/gradients.cc): exactly the asked total, every
// tensor non-empty, sizes spread like a CNN's; and the bucket count follows the strategy's rule.
#include "common/gradients.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "mwms/errors.h"

TEST_CASE("bucket_perf gradients: 200 varied tensors of exactly 25 MiB", "[unit][bench]") {
  const auto counts = mwms::bench::model_like_counts(200, std::size_t{25} << 20, 4);
  REQUIRE(counts.size() == 200);
  CHECK(std::accumulate(counts.begin(), counts.end(), std::size_t{0}) ==
        (std::size_t{25} << 20) / 4);
  const auto [smallest, largest] = std::minmax_element(counts.begin(), counts.end());
  CHECK(*smallest >= 64);                        // biases: 64 channels and up
  CHECK(*largest > 1000 * *smallest);            // three orders of magnitude, as a model's
  CHECK(*largest * 4 < (std::size_t{4} << 20));  // no tensor alone fills a default bucket
  // Odd tensors are biases: far smaller than the weight beside them.
  for (std::size_t t = 1; t < counts.size(); t += 2) CHECK(counts[t] < counts[t - 1]);
  CHECK(counts == mwms::bench::model_like_counts(200, std::size_t{25} << 20, 4));  // deterministic
}

TEST_CASE("bucket_perf gradients: odd counts and tiny totals and refusals", "[unit][bench]") {
  for (std::size_t tensors : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{50}}) {
    for (std::size_t total : {std::size_t{4} * tensors, std::size_t{1000}, std::size_t{1} << 20}) {
      if (total < 4 * tensors) continue;
      INFO(tensors << " tensors, " << total << " B");
      const auto counts = mwms::bench::model_like_counts(tensors, total, 4);
      REQUIRE(counts.size() == tensors);
      CHECK(std::accumulate(counts.begin(), counts.end(), std::size_t{0}) == total / 4);
      CHECK(*std::min_element(counts.begin(), counts.end()) >= 1);
    }
  }
  CHECK_THROWS_AS(mwms::bench::model_like_counts(0, 1024, 4), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::bench::model_like_counts(10, 39, 4), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::bench::model_like_counts(10, 1024, 0), mwms::InvalidArgument);
}

TEST_CASE("bucket_perf buckets: greedy packing with a large tensor alone", "[unit][bench]") {
  using mwms::bench::count_buckets;
  CHECK(count_buckets({}, 100) == 0);
  CHECK(count_buckets({10, 20, 30}, 100) == 1);
  CHECK(count_buckets({60, 50, 40}, 100) == 2);       // 60 | 50+40
  CHECK(count_buckets({30, 200, 30, 30}, 100) == 3);  // 30 | 200 alone | 30+30
  CHECK(count_buckets({100, 1}, 100) == 2);
  const auto counts = mwms::bench::model_like_counts(200, std::size_t{25} << 20, 4);
  std::vector<std::size_t> bytes;
  for (std::size_t c : counts) bytes.push_back(c * 4);
  CHECK(count_buckets(bytes, std::size_t{4} << 20) >= 7);  // 25 MiB in 4 MiB buckets
}
