// strategy::plan_buckets: how gradients are cut into packs (Note [solo tensors]).
#include <catch2/catch.hpp>

#include <vector>

#include "mwms/mwms.h"
#include "strategy/buckets.h"

namespace {

using mwms::DataType;
using mwms::TensorRef;
using mwms::strategy::plan_buckets;

// Tensors of `sizes` float32 elements, each in its own allocation unless `flat`.
struct Tensors {
  std::vector<std::vector<float>> own;
  std::vector<float> flat_buffer;
  std::vector<TensorRef> refs;
  Tensors(const std::vector<std::size_t>& sizes, bool flat) {
    std::size_t total = 0;
    for (std::size_t n : sizes) total += n;
    flat_buffer.resize(total + 1);
    std::size_t offset = 0;
    for (std::size_t n : sizes) {
      float* p;
      if (flat) {
        p = flat_buffer.data() + offset;
        offset += n;
      } else {
        own.emplace_back(n + 16);  // never adjacent to the next one
        p = own.back().data();
      }
      refs.push_back({p, n, DataType::kFloat32});
    }
  }
};

std::vector<std::size_t> firsts(const std::vector<mwms::strategy::BucketSpan>& b) {
  std::vector<std::size_t> out;
  for (const auto& s : b) out.push_back(s.first);
  return out;
}

}  // namespace

TEST_CASE("plan_buckets packs small tensors and keeps large ones solo", "[unit][strategy]") {
  const std::size_t k = 1024 / 4;  // floats per KiB
  // 4 KiB, 4 KiB, 512 KiB (solo), 4 KiB, 300 KiB (solo), 4 KiB, 4 KiB
  Tensors t({4 * k, 4 * k, 512 * k, 4 * k, 300 * k, 4 * k, 4 * k}, false);
  const auto b = plan_buckets(t.refs, 4 << 20, mwms::strategy::kSoloBytes);
  CHECK(firsts(b) == std::vector<std::size_t>{0, 2, 3, 4, 5});
  CHECK(b[0].last == 2);
  CHECK(b[0].bytes == 8 << 10);
  CHECK(b[1].last == 3);
  CHECK(b[1].bytes == 512 << 10);
  CHECK(b.back().last == 7);

  SECTION("without the solo rule everything fits one pack") {
    const auto one = plan_buckets(t.refs, 4 << 20, static_cast<std::size_t>(-1));
    REQUIRE(one.size() == 1);
    CHECK(one[0].last == 7);
    CHECK(one[0].bytes == (4 + 4 + 512 + 4 + 300 + 4 + 4) << 10);
  }
  SECTION("a flat buffer stays one in-place bucket: no copy to save") {
    Tensors f({4 * k, 4 * k, 512 * k, 4 * k, 300 * k, 4 * k, 4 * k}, true);
    const auto flat = plan_buckets(f.refs, 4 << 20, mwms::strategy::kSoloBytes);
    REQUIRE(flat.size() == 1);
    CHECK(flat[0].last == 7);
  }
  SECTION("the pack size still bounds a run") {
    const auto small = plan_buckets(t.refs, 6 << 10, static_cast<std::size_t>(-1));
    CHECK(firsts(small) == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6});
  }
}

TEST_CASE("plan_buckets splits at a dtype change and handles empty lists", "[unit][strategy]") {
  std::vector<double> d(8);
  std::vector<float> f(8);
  std::vector<TensorRef> refs{{f.data(), 4, DataType::kFloat32},
                              {d.data(), 4, DataType::kFloat64},
                              {f.data() + 4, 4, DataType::kFloat32}};
  CHECK(firsts(plan_buckets(refs, 1 << 20, 1 << 18)) == std::vector<std::size_t>{0, 1, 2});
  CHECK(plan_buckets({}, 1 << 20, 1 << 18).empty());
}

TEST_CASE("all_reduce_gradients in a world of one leaves scattered tensors as they are and still checks the communicator",
          "[unit][strategy]") {
  // One worker: every all-reduce is the identity, so buckets of separate allocations are reduced
  // tensor by tensor in place rather than packed; the values (sum and mean) must not move and the
  // communicator's own checks still apply.
  mwms::CommunicationOptions copts;
  copts.bytes_per_pack = 4096;
  mwms::MultiWorkerMirroredStrategy strategy(mwms::ResolvedCluster{}, copts);
  Tensors t({3, 1, 700, 5000, 2}, false);
  for (std::size_t k = 0; k < t.refs.size(); ++k) {
    auto* p = static_cast<float*>(t.refs[k].data);
    for (std::size_t i = 0; i < t.refs[k].count; ++i) p[i] = 0.1f * static_cast<float>(i + k) - 7.0f;
  }
  const Tensors before = t;
  for (mwms::ReduceOp op : {mwms::ReduceOp::kSum, mwms::ReduceOp::kMean}) {
    strategy.all_reduce_gradients(t.refs, op);
    for (std::size_t k = 0; k < t.refs.size(); ++k) {
      CHECK(t.own[k] == before.own[k]);
    }
  }
  strategy.finalize();
  CHECK_THROWS_AS(strategy.all_reduce_gradients(t.refs, mwms::ReduceOp::kSum), mwms::InvalidUsage);
}
