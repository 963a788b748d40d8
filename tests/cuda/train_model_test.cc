// gpu:train-model — the train example's GPU models (examples/train/gpu_model.h: cuDNN + cuBLAS)
// against the CPU Eigen models they mirror (Note [gpu model equivalence]): same init, same batch,
// so the first step's loss and gradient must agree within float tolerance, tensor by tensor; the
// SGD-momentum update and the predictions too; a batch of 0 zeroes the gradient. Then one
// DeviceCommunicator all-reduce of the device gradient (a world of one: the sum is itself), as
// the trainer does it. Skipped (exit 77) without a device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cnn.h"
#include "gpu_model.h"
#include "mlp.h"
#include "mwms/device_communicator.h"

namespace {

using mwms::train::GpuModel;
using mwms::train::Model;

struct Batch {
  std::vector<float> x;
  std::vector<std::uint8_t> y;
};

std::unique_ptr<Model> make_model(const std::string& name) {
  if (name == "mlp") return std::make_unique<mwms::train::Mlp>();
  return std::make_unique<mwms::train::Cnn>();
}

// Fashion-MNIST-like inputs: pixels in [0, 1], a third of them 0 (background).
Batch random_batch(int batch, std::size_t pixels, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Batch b;
  b.x.resize(pixels * batch);
  for (float& v : b.x) v = u(rng) < 0.33f ? 0.0f : u(rng);
  b.y.resize(batch);
  for (auto& l : b.y) l = static_cast<std::uint8_t>(rng() % 10);
  return b;
}

// max |gpu - cpu| over a tensor, relative to the tensor's largest |cpu| value.
double relative_error(const float* gpu, const float* cpu, std::size_t n) {
  double diff = 0, scale = 1e-30;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(gpu[i]) - double(cpu[i])));
    scale = std::max(scale, std::fabs(double(cpu[i])));
  }
  return diff / scale;
}

void check_model(const std::string& name) {
  constexpr std::size_t kPixels = 784;
  constexpr int kBatch = 64;
  constexpr float kLr = 0.01f, kMomentum = 0.9f;
  // Float sums in another order (the conv kernel's gradient sums 64 x 676 products): 1e-3 of a
  // tensor's largest value passes them; a wrong layout or index map is off by O(1).
  constexpr double kGradTolerance = 1e-3;
  std::unique_ptr<Model> cpu = make_model(name);
  cpu->init(42);
  cpu->reserve(kBatch);
  std::unique_ptr<Model> ref = make_model(name);
  ref->init(42);
  std::unique_ptr<GpuModel> gpu = mwms::train::make_gpu_model(std::move(ref), 0, kBatch);
  REQUIRE(gpu->size() == cpu->params().size());
  std::vector<float> params(gpu->size()), grads(gpu->size()), velocity(gpu->size());
  gpu->download(params.data(), velocity.data());
  CHECK(std::equal(params.begin(), params.end(), cpu->params().begin()));  // the same init
  CHECK(*std::max_element(velocity.begin(), velocity.end()) == 0.0f);

  mwms::train::SgdMomentum sgd(cpu->params().size(), kLr, kMomentum);
  const float scale = 1.0f / kBatch;
  for (int step = 0; step < 2; ++step) {
    INFO(name << " step " << step);
    const Batch b = random_batch(kBatch, kPixels, 100 + step);
    const double cpu_loss = cpu->forward_backward(b.x.data(), b.y.data(), kBatch, scale, {}, 1);
    const double gpu_loss = gpu->forward_backward(b.x.data(), b.y.data(), kBatch, scale);
    CHECK(gpu_loss == Approx(cpu_loss).epsilon(1e-5));
    gpu->download_gradients(grads.data());
    for (const auto& slot : cpu->slots()) {
      INFO(slot.name);
      CHECK(relative_error(grads.data() + slot.offset, cpu->gradients().data() + slot.offset,
                           slot.count) < kGradTolerance);
    }
    sgd.step(cpu->params(), cpu->gradients());
    gpu->sgd_step(kLr, kMomentum);
    gpu->download(params.data(), velocity.data());
    CHECK(relative_error(params.data(), cpu->params().data(), params.size()) < 1e-5);
    CHECK(relative_error(velocity.data(), sgd.velocity().data(), velocity.size()) <
          kGradTolerance);
  }
  const Batch eval = random_batch(200, kPixels, 7);  // above kBatch: must be refused
  CHECK_THROWS_AS(gpu->count_correct(eval.x.data(), eval.y.data(), 200), std::invalid_argument);
  const std::size_t cpu_correct = cpu->count_correct(eval.x.data(), eval.y.data(), kBatch);
  const std::size_t gpu_correct = gpu->count_correct(eval.x.data(), eval.y.data(), kBatch);
  CHECK(std::abs(static_cast<long>(gpu_correct) - static_cast<long>(cpu_correct)) <= 1);  // ties
  CHECK(gpu->forward_backward(nullptr, nullptr, 0, scale) == 0.0);
  gpu->download_gradients(grads.data());
  CHECK(*std::max_element(grads.begin(), grads.end()) == 0.0f);
  CHECK(*std::min_element(grads.begin(), grads.end()) == 0.0f);
}

}  // namespace

TEST_CASE("train gpu model: the MLP's first steps equal the CPU model's", "[cuda][train]") {
  check_model("mlp");
}

TEST_CASE("train gpu model: the CNN's first steps equal the CPU model's", "[cuda][train]") {
  check_model("cnn");
}

TEST_CASE("train gpu model: the device gradient all-reduces in place through DeviceCommunicator",
          "[cuda][train]") {
  auto comm = mwms::DeviceCommunicator::create(mwms::ResolvedCluster{});
  std::unique_ptr<Model> ref = make_model("cnn");
  ref->init(1);
  std::unique_ptr<GpuModel> gpu = mwms::train::make_gpu_model(std::move(ref), comm->device(), 8);
  const Batch b = random_batch(8, 784, 3);
  gpu->forward_backward(b.x.data(), b.y.data(), 8, 1.0f / 8);
  std::vector<float> before(gpu->size()), after(gpu->size());
  gpu->download_gradients(before.data());
  comm->all_reduce_async(gpu->device_gradients(), gpu->size(), mwms::DataType::kFloat32,
                         mwms::ReduceOp::kSum, mwms::DeviceStream{gpu->stream()})
      ->wait();
  gpu->download_gradients(after.data());
  CHECK(after == before);  // a world of one sums to itself
  CHECK(*std::max_element(before.begin(), before.end()) > 0.0f);
}
