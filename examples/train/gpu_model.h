/// @file gpu_model.h
/// The train example's models on a GPU (`train --device gpu`): the MLP and the tutorial CNN of
/// mlp.h / cnn.h with cuDNN's legacy convolution, activation and pooling API and cuBLAS sgemm,
/// softmax cross-entropy, ReLU, bias and the SGD-momentum update as small CUDA kernels
/// (gpu_model.cu, built only when CUDA and cuDNN are found; gpu_model_stub.cc otherwise). No CUDA
/// type appears here.
///
/// Note [gpu model equivalence]: a GpuModel is built from its CPU model (the "reference") and
/// takes from it the flat layout (Note [gpu layout] in gpu_ops.h) and the Glorot init, generated
/// on the host with the same RNG and copied up; the trainer feeds it the same batches in the same
/// order. Its first-step loss and gradient therefore equal the CPU model's up to float summation
/// order (cuBLAS and cuDNN sum in another order than Eigen; cuDNN runs without tensor cores,
/// CUDNN_FMA_MATH, and cuBLAS without TF32, so no product loses precision): the gpu:train-model
/// test checks it on a device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model.h"

namespace mwms::train {

/// Whether this train binary can run its models on a GPU.
struct GpuAvailability {
  bool built = false;  ///< the GPU models are compiled in (CUDA and cuDNN were found)
  int devices = 0;     ///< CUDA devices visible (0 without a driver or a GPU)
  std::string reason;  ///< when !built or devices == 0: why, for an error message
};

/// Asks the CUDA runtime for its devices (cudaGetDeviceCount), once per call. Never throws.
GpuAvailability gpu_availability() noexcept;

/// A model whose parameters, gradients and momentum live on one CUDA device, each as ONE flat
/// device buffer laid out as the reference's slots() (Note [gpu model equivalence]). Every call
/// enqueues on the model's own stream and returns when its results are on the host (the loss, the
/// counts, downloads), except sgd_step(), which only enqueues. One thread at a time; the calling
/// thread must have the model's device current (the constructor makes it current).
class GpuModel {
 public:
  virtual ~GpuModel() = default;

  /// The CPU model this one mirrors (layout, shape, init).
  virtual const Model& reference() const noexcept = 0;
  /// Floats in each of params, gradients and velocity (reference().params().size()).
  virtual std::size_t size() const noexcept = 0;
  /// The CUDA device this model runs on.
  virtual int device() const noexcept = 0;

  /// Copies `params` and `velocity` (size() floats each, host memory) to the device. Blocking.
  /// @throws BackendError (CUDA failed: the native code and text).
  virtual void upload(const float* params, const float* velocity) = 0;
  /// Copies the device's parameters and velocity (size() floats each) into host memory; either
  /// may be null to skip it. Blocking. @throws BackendError.
  virtual void download(float* params, float* velocity) const = 0;
  /// Copies the device's gradient (size() floats) into host memory. Blocking. @throws BackendError.
  virtual void download_gradients(float* gradients) const = 0;

  /// Forward and backward pass on `batch` examples of host memory (as Model::forward_backward:
  /// `x` one image after another, `labels` one byte each): overwrites the device gradient with
  /// grad_scale * sum_i d loss_i / d params and returns sum_i loss_i. `batch` in
  /// [0, max_batch] (0: the gradient becomes zero). Waits for the loss, so the gradient is final
  /// on return. @throws std::invalid_argument (batch out of range, a label >= classes),
  /// BackendError (CUDA, cuDNN or cuBLAS failed).
  virtual double forward_backward(const float* x, const std::uint8_t* labels, int batch,
                                  float grad_scale) = 0;

  /// The device gradient (size() floats, the reference's layout): all-reduce it in place, e.g.
  /// DeviceCommunicator::all_reduce on stream().
  virtual float* device_gradients() noexcept = 0;
  /// The model's CUDA stream, as an opaque cudaStream_t (for DeviceStream).
  virtual void* stream() const noexcept = 0;

  /// Enqueues p -= lr * (v = momentum * v + g) on the device (SgdMomentum's rule), after
  /// everything enqueued on stream() before. @throws BackendError.
  virtual void sgd_step(float learning_rate, float momentum) = 0;

  /// Number of the `batch` examples (host memory, batch in [0, max_batch]) whose arg-max
  /// prediction equals the label. Blocking. @throws as forward_backward().
  virtual std::size_t count_correct(const float* x, const std::uint8_t* labels, int batch) = 0;
};

/// The GPU version of `reference` (an Mlp or a Cnn, whose current parameters are uploaded, with
/// zero velocity) on CUDA device `device`, with buffers for `max_batch` examples per pass.
/// Chooses the convolution algorithms with cudnnGet*_v7 under a workspace bound
/// (Note [conv algorithms] in gpu_model.cu). @throws InvalidUsage (this train has no GPU model:
/// gpu_availability().reason), std::invalid_argument (another Model, max_batch < 1),
/// BackendError (no such device, or CUDA/cuDNN/cuBLAS failed).
std::unique_ptr<GpuModel> make_gpu_model(std::unique_ptr<Model> reference, int device,
                                         int max_batch);

}  // namespace mwms::train
