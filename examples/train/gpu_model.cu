// The train example's MLP and CNN on a CUDA device: cuDNN's legacy convolution, activation and
// pooling API, cuBLAS sgemm for the dense layers, and small kernels applying gpu_ops.h
// (Note [gpu layout] there, Note [gpu model equivalence] in gpu_model.h). Built only when CUDA and
// cuDNN are found (examples/CMakeLists.txt); gpu_model_stub.cc stands in otherwise.
#include "gpu_model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "mwms/errors.h"

#include "cnn.h"
#include "gpu_ops.h"
#include "mlp.h"

namespace mwms::train {
namespace {

std::string where(int device) { return "train gpu model (device " + std::to_string(device) + "): "; }

void check_cuda(cudaError_t e, const char* call, int device) {
  if (e == cudaSuccess) return;
  throw BackendError(where(device) + call + " failed: " + cudaGetErrorName(e) + " (" +
                         cudaGetErrorString(e) + ")",
                     static_cast<int>(e));
}

void check_cudnn(cudnnStatus_t s, const char* call, int device) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  throw BackendError(where(device) + call + " failed: " + cudnnGetErrorString(s),
                     static_cast<int>(s));
}

void check_cublas(cublasStatus_t s, const char* call, int device) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw BackendError(where(device) + call + " failed: " + cublasGetStatusName(s) + " (" +
                         cublasGetStatusString(s) + ")",
                     static_cast<int>(s));
}

constexpr int kThreads = 256;
constexpr int kTaps = 9;  // 3x3 kernel, one input channel (cnn.cc)
// Note [conv algorithms]: the convolution is tiny (9 taps, one channel), so any algorithm is
// fast; cudnnGetConvolution*Algorithm_v7 ranks them by cuDNN's heuristics without running
// anything, and we take the first that (1) succeeds for these descriptors, (2) needs at most
// kWorkspaceBound bytes of workspace and (3) uses FMA math (no TF32 tensor cores: Note [gpu model
// equivalence]) and, for BackwardFilter, is deterministic (no atomics: a rerun gives the same
// gradient). Failing (3), any algorithm meeting (1) and (2) is taken; failing those, a
// BackendError names the batch size. The choice is cached per batch size (training and
// evaluation use two).
constexpr std::size_t kWorkspaceBound = std::size_t{64} << 20;

unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void gather_kcrs(const float* cpu, float* kcrs, int filters) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < std::size_t(filters) * kTaps) kcrs[gpu_ops::kernel_kcrs_index(i, filters, kTaps)] = cpu[i];
}

__global__ void scatter_kcrs(const float* kcrs, float* cpu, int filters) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < std::size_t(filters) * kTaps) cpu[i] = kcrs[gpu_ops::kernel_kcrs_index(i, filters, kTaps)];
}

__global__ void nchw_to_features(const float* nchw, float* features, std::size_t n, int filters,
                                 int side) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < n) features[gpu_ops::pooled_nhwc_index(i, filters, side)] = nchw[i];
}

__global__ void features_to_nchw(const float* features, float* nchw, std::size_t n, int filters,
                                 int side) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < n) nchw[i] = features[gpu_ops::pooled_nhwc_index(i, filters, side)];
}

__global__ void bias_act(float* z, const float* bias, int rows, std::size_t n, bool relu) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < n) z[i] = gpu_ops::bias_activation(z[i], bias[i % rows], relu);
}

__global__ void relu_back(float* d, const float* y, std::size_t n) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < n) d[i] = gpu_ops::relu_backward(d[i], y[i]);
}

// out[r] = sum over the `cols` columns of row r of a rows x cols column-major matrix.
__global__ void row_sums(const float* m, float* out, int rows, int cols) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float sum = 0.0f;
  for (int c = 0; c < cols; ++c) sum += m[std::size_t(c) * rows + r];
  out[r] = sum;
}

__global__ void softmax_xent(float* logits, const std::uint8_t* labels, double* losses,
                             int classes, int batch, float grad_scale) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < batch) {
    losses[j] = gpu_ops::softmax_xent_column(logits + std::size_t(j) * classes, labels[j],
                                             classes, grad_scale);
  }
}

__global__ void count_argmax(const float* logits, const std::uint8_t* labels, unsigned* correct,
                             int classes, int batch) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < batch && gpu_ops::argmax_column(logits + std::size_t(j) * classes, classes) == labels[j]) {
    atomicAdd(correct, 1u);
  }
}

__global__ void sgd(float* p, float* v, const float* g, std::size_t n, float lr, float momentum) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < n) gpu_ops::sgd_momentum(p[i], v[i], g[i], lr, momentum);
}

/// Device memory of `count` T, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }
  void allocate(std::size_t count, int device) {
    if (data_ != nullptr) {
      check_cuda(cudaFree(data_), "cudaFree", device);
      data_ = nullptr;
    }
    count_ = count;
    if (count == 0) return;
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)), "cudaMalloc",
               device);
  }
  T* get() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t forward{};
  cudnnConvolutionBwdFilterAlgo_t backward_filter{};
  std::size_t workspace = 0;
};

class CudaModel final : public GpuModel {
 public:
  CudaModel(std::unique_ptr<Model> reference, int device, int max_batch);
  ~CudaModel() override;

  const Model& reference() const noexcept override { return *reference_; }
  std::size_t size() const noexcept override { return n_; }
  int device() const noexcept override { return device_; }
  void upload(const float* params, const float* velocity) override;
  void download(float* params, float* velocity) const override;
  void download_gradients(float* gradients) const override;
  double forward_backward(const float* x, const std::uint8_t* labels, int batch,
                          float grad_scale) override;
  float* device_gradients() noexcept override { return grads_; }
  void* stream() const noexcept override { return stream_; }
  void sgd_step(float learning_rate, float momentum) override;
  std::size_t count_correct(const float* x, const std::uint8_t* labels, int batch) override;

 private:
  void cuda(cudaError_t e, const char* call) const { check_cuda(e, call, device_); }
  void dnn(cudnnStatus_t s, const char* call) const { check_cudnn(s, call, device_); }
  void blas(cublasStatus_t s, const char* call) const { check_cublas(s, call, device_); }
  void launched(const char* kernel) const { cuda(cudaGetLastError(), kernel); }
  void setup();
  void release() noexcept;
  void sync() const { cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void input(const float* x, const std::uint8_t* labels, int batch);
  void forward(int batch);
  void set_batch(int batch);
  // C (m x n) = op(A) op(B), column-major, alpha 1, beta 0 (Note [gpu layout]).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a,
            int lda, const float* b, int ldb, float* c, int ldc);

  std::unique_ptr<Model> reference_;
  int device_;
  int max_batch_;
  std::size_t n_;
  bool cnn_;
  int inputs_;   // pixels per image
  int features_; // inputs of dense_1: pixels (MLP) or pooled features (CNN)
  int hidden_units_;
  int classes_;
  std::size_t dense_slot_;  // index of dense_1/kernel in the slots
  const TensorSlot* slot_ = nullptr;  // reference_->slots().data()
  // CNN sizes.
  int side_ = 0, filters_ = 0, conv_side_ = 0, pool_side_ = 0;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  cudnnTensorDescriptor_t x_desc_ = nullptr, conv_desc_t_ = nullptr, pool_desc_t_ = nullptr,
                          bias_desc_ = nullptr;
  cudnnFilterDescriptor_t filter_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_ = nullptr;
  cudnnPoolingDescriptor_t pool_desc_ = nullptr;
  cudnnActivationDescriptor_t act_desc_ = nullptr;
  std::map<int, ConvAlgos> algos_;  // by batch size, Note [conv algorithms]
  ConvAlgos current_;
  int described_batch_ = -1;

  DeviceArray<float> flat_;  // params | gradients | velocity, each n_ floats (Note [gpu layout])
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* velocity_ = nullptr;
  DeviceArray<float> x_, hidden_, d_hidden_, logits_, d_features_;
  DeviceArray<std::uint8_t> labels_;
  DeviceArray<double> losses_;
  DeviceArray<unsigned> correct_;
  // CNN only: NCHW activations (Note [gpu layout]), the KCRS kernel and its gradient.
  DeviceArray<float> conv_pre_, conv_, d_conv_, d_conv_pre_, pooled_nchw_, d_pooled_nchw_,
      features_buf_, w_kcrs_, dw_kcrs_;
  DeviceArray<unsigned char> workspace_;
  std::vector<double> host_losses_;
};

CudaModel::CudaModel(std::unique_ptr<Model> reference, int device, int max_batch)
    : reference_(std::move(reference)), device_(device), max_batch_(max_batch) {
  if (max_batch < 1) throw std::invalid_argument("gpu model: max_batch must be >= 1");
  n_ = reference_->params().size();
  slot_ = reference_->slots().data();
  if (const auto* cnn = dynamic_cast<const Cnn*>(reference_.get())) {
    cnn_ = true;
    const CnnShape& s = cnn->shape();
    side_ = s.side;
    filters_ = s.filters;
    conv_side_ = s.side - 2;
    pool_side_ = conv_side_ / 2;
    inputs_ = s.side * s.side;
    features_ = cnn->features();
    hidden_units_ = s.dense;
    classes_ = s.classes;
    dense_slot_ = 2;
  } else if (const auto* mlp = dynamic_cast<const Mlp*>(reference_.get())) {
    cnn_ = false;
    inputs_ = features_ = mlp->shape().inputs;
    hidden_units_ = mlp->shape().hidden;
    classes_ = mlp->shape().classes;
    dense_slot_ = 0;
  } else {
    throw std::invalid_argument("gpu model: the reference must be an Mlp or a Cnn");
  }
  try {
    setup();
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void CudaModel::setup() {
  const int device = device_;
  const int max_batch = max_batch_;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || device < 0 || device >= count) {
    throw BackendError(where(device) + "no such CUDA device (cudaGetDeviceCount: " +
                           (e == cudaSuccess ? std::to_string(count) + " device(s)"
                                             : std::string(cudaGetErrorName(e))) +
                           ")",
                       static_cast<int>(e));
  }
  cuda(cudaSetDevice(device), "cudaSetDevice");
  cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  blas(cublasCreate(&blas_), "cublasCreate");
  blas(cublasSetStream(blas_, stream_), "cublasSetStream");
  blas(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // no TF32
  const std::size_t b = static_cast<std::size_t>(max_batch);
  flat_.allocate(3 * n_, device_);
  params_ = flat_.get();
  grads_ = params_ + n_;
  velocity_ = grads_ + n_;
  x_.allocate(b * inputs_, device_);
  labels_.allocate(b, device_);
  losses_.allocate(b, device_);
  correct_.allocate(1, device_);
  hidden_.allocate(b * hidden_units_, device_);
  d_hidden_.allocate(b * hidden_units_, device_);
  logits_.allocate(b * classes_, device_);
  host_losses_.resize(b);
  if (cnn_) {
    d_features_.allocate(b * features_, device_);
    const std::size_t conv = b * filters_ * conv_side_ * conv_side_;
    conv_pre_.allocate(conv, device_);
    conv_.allocate(conv, device_);
    d_conv_.allocate(conv, device_);
    d_conv_pre_.allocate(conv, device_);
    pooled_nchw_.allocate(b * features_, device_);
    d_pooled_nchw_.allocate(b * features_, device_);
    features_buf_.allocate(b * features_, device_);
    w_kcrs_.allocate(std::size_t(filters_) * kTaps, device_);
    dw_kcrs_.allocate(std::size_t(filters_) * kTaps, device_);
    dnn(cudnnCreate(&dnn_), "cudnnCreate");
    dnn(cudnnSetStream(dnn_, stream_), "cudnnSetStream");
    dnn(cudnnCreateTensorDescriptor(&x_desc_), "cudnnCreateTensorDescriptor");
    dnn(cudnnCreateTensorDescriptor(&conv_desc_t_), "cudnnCreateTensorDescriptor");
    dnn(cudnnCreateTensorDescriptor(&pool_desc_t_), "cudnnCreateTensorDescriptor");
    dnn(cudnnCreateTensorDescriptor(&bias_desc_), "cudnnCreateTensorDescriptor");
    dnn(cudnnSetTensor4dDescriptor(bias_desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, filters_, 1,
                                   1),
        "cudnnSetTensor4dDescriptor(bias)");
    dnn(cudnnCreateFilterDescriptor(&filter_desc_), "cudnnCreateFilterDescriptor");
    dnn(cudnnSetFilter4dDescriptor(filter_desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, filters_, 1,
                                   3, 3),
        "cudnnSetFilter4dDescriptor");
    dnn(cudnnCreateConvolutionDescriptor(&conv_desc_), "cudnnCreateConvolutionDescriptor");
    // Valid 3x3, stride 1: cross-correlation, as cnn.cc's im2col (tap ky*3+kx of output (oy, ox)
    // is pixel (oy+ky, ox+kx)) and every DL framework's "convolution".
    dnn(cudnnSetConvolution2dDescriptor(conv_desc_, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT),
        "cudnnSetConvolution2dDescriptor");
    dnn(cudnnSetConvolutionMathType(conv_desc_, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
    dnn(cudnnCreatePoolingDescriptor(&pool_desc_), "cudnnCreatePoolingDescriptor");
    // Deterministic max: each window's gradient goes to one maximum, as cnn.cc's argmax does.
    dnn(cudnnSetPooling2dDescriptor(pool_desc_, CUDNN_POOLING_MAX_DETERMINISTIC,
                                    CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2),
        "cudnnSetPooling2dDescriptor");
    dnn(cudnnCreateActivationDescriptor(&act_desc_), "cudnnCreateActivationDescriptor");
    dnn(cudnnSetActivationDescriptor(act_desc_, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0),
        "cudnnSetActivationDescriptor");
  }
  std::vector<float> zero(n_, 0.0f);
  upload(reference_->params().data(), zero.data());
}

CudaModel::~CudaModel() { release(); }

void CudaModel::release() noexcept {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (act_desc_ != nullptr) cudnnDestroyActivationDescriptor(act_desc_);
  if (pool_desc_ != nullptr) cudnnDestroyPoolingDescriptor(pool_desc_);
  if (conv_desc_ != nullptr) cudnnDestroyConvolutionDescriptor(conv_desc_);
  if (filter_desc_ != nullptr) cudnnDestroyFilterDescriptor(filter_desc_);
  for (cudnnTensorDescriptor_t d : {x_desc_, conv_desc_t_, pool_desc_t_, bias_desc_}) {
    if (d != nullptr) cudnnDestroyTensorDescriptor(d);
  }
  if (dnn_ != nullptr) cudnnDestroy(dnn_);
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  act_desc_ = nullptr;
  pool_desc_ = nullptr;
  conv_desc_ = nullptr;
  filter_desc_ = nullptr;
  x_desc_ = conv_desc_t_ = pool_desc_t_ = bias_desc_ = nullptr;
  dnn_ = nullptr;
  blas_ = nullptr;
  stream_ = nullptr;
}

void CudaModel::upload(const float* params, const float* velocity) {
  cuda(cudaMemcpyAsync(params_, params, n_ * sizeof(float), cudaMemcpyHostToDevice, stream_),
       "cudaMemcpyAsync(params)");
  cuda(cudaMemcpyAsync(velocity_, velocity, n_ * sizeof(float), cudaMemcpyHostToDevice, stream_),
       "cudaMemcpyAsync(velocity)");
  sync();
}

void CudaModel::download(float* params, float* velocity) const {
  if (params != nullptr) {
    cuda(cudaMemcpyAsync(params, params_, n_ * sizeof(float), cudaMemcpyDeviceToHost, stream_),
         "cudaMemcpyAsync(params)");
  }
  if (velocity != nullptr) {
    cuda(cudaMemcpyAsync(velocity, velocity_, n_ * sizeof(float), cudaMemcpyDeviceToHost, stream_),
         "cudaMemcpyAsync(velocity)");
  }
  sync();
}

void CudaModel::download_gradients(float* gradients) const {
  cuda(cudaMemcpyAsync(gradients, grads_, n_ * sizeof(float), cudaMemcpyDeviceToHost, stream_),
       "cudaMemcpyAsync(gradients)");
  sync();
}

void CudaModel::gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                     const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  blas(cublasSgemm(blas_, ta, tb, m, n, k, &one, a, lda, b, ldb, &zero, c, ldc), "cublasSgemm");
}

void CudaModel::input(const float* x, const std::uint8_t* labels, int batch) {
  if (batch < 0 || batch > max_batch_) {
    throw std::invalid_argument("gpu model: batch " + std::to_string(batch) + " outside [0, " +
                                std::to_string(max_batch_) + "]");
  }
  for (int j = 0; j < batch; ++j) {
    if (labels[j] >= classes_) {
      throw std::invalid_argument("gpu model: label " + std::to_string(labels[j]) +
                                  " of example " + std::to_string(j) + " is not below " +
                                  std::to_string(classes_) + " classes");
    }
  }
  if (batch == 0) return;
  cuda(cudaMemcpyAsync(x_.get(), x, std::size_t(batch) * inputs_ * sizeof(float),
                       cudaMemcpyHostToDevice, stream_),
       "cudaMemcpyAsync(x)");
  cuda(cudaMemcpyAsync(labels_.get(), labels, std::size_t(batch), cudaMemcpyHostToDevice, stream_),
       "cudaMemcpyAsync(labels)");
}

void CudaModel::set_batch(int batch) {
  if (batch == described_batch_) return;
  dnn(cudnnSetTensor4dDescriptor(x_desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, batch, 1, side_,
                                 side_),
      "cudnnSetTensor4dDescriptor(x)");
  dnn(cudnnSetTensor4dDescriptor(conv_desc_t_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, batch,
                                 filters_, conv_side_, conv_side_),
      "cudnnSetTensor4dDescriptor(conv)");
  dnn(cudnnSetTensor4dDescriptor(pool_desc_t_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, batch,
                                 filters_, pool_side_, pool_side_),
      "cudnnSetTensor4dDescriptor(pool)");
  int n = 0, c = 0, h = 0, w = 0;
  dnn(cudnnGetConvolution2dForwardOutputDim(conv_desc_, x_desc_, filter_desc_, &n, &c, &h, &w),
      "cudnnGetConvolution2dForwardOutputDim");
  if (n != batch || c != filters_ || h != conv_side_ || w != conv_side_) {
    throw InternalError(where(device_) + "cuDNN's convolution output is " + std::to_string(n) +
                        "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
                        std::to_string(w) + ", expected " + std::to_string(batch) + "x" +
                        std::to_string(filters_) + "x" + std::to_string(conv_side_) + "x" +
                        std::to_string(conv_side_));
  }
  auto cached = algos_.find(batch);
  if (cached == algos_.end()) {
    // Note [conv algorithms]
    ConvAlgos a;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    dnn(cudnnGetConvolutionForwardAlgorithm_v7(dnn_, x_desc_, filter_desc_, conv_desc_,
                                               conv_desc_t_, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                               &returned, fwd),
        "cudnnGetConvolutionForwardAlgorithm_v7");
    int pick = -1;
    for (int pass = 0; pass < 2 && pick < 0; ++pass) {
      for (int i = 0; i < returned && pick < 0; ++i) {
        if (fwd[i].status == CUDNN_STATUS_SUCCESS && fwd[i].memory <= kWorkspaceBound &&
            (pass == 1 || fwd[i].mathType == CUDNN_FMA_MATH)) {
          pick = i;
        }
      }
    }
    if (pick < 0) {
      throw BackendError(where(device_) + "cuDNN offers no forward convolution algorithm for a "
                             "batch of " + std::to_string(batch) + " within " +
                             std::to_string(kWorkspaceBound >> 20) + " MiB of workspace",
                         static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED));
    }
    a.forward = fwd[pick].algo;
    std::size_t fwd_bytes = 0;
    dnn(cudnnGetConvolutionForwardWorkspaceSize(dnn_, x_desc_, filter_desc_, conv_desc_,
                                                conv_desc_t_, a.forward, &fwd_bytes),
        "cudnnGetConvolutionForwardWorkspaceSize");
    cudnnConvolutionBwdFilterAlgoPerf_t bwd[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    returned = 0;
    dnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            dnn_, x_desc_, conv_desc_t_, conv_desc_, filter_desc_,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, bwd),
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    pick = -1;
    for (int pass = 0; pass < 2 && pick < 0; ++pass) {
      for (int i = 0; i < returned && pick < 0; ++i) {
        if (bwd[i].status == CUDNN_STATUS_SUCCESS && bwd[i].memory <= kWorkspaceBound &&
            (pass == 1 ||
             (bwd[i].mathType == CUDNN_FMA_MATH && bwd[i].determinism == CUDNN_DETERMINISTIC))) {
          pick = i;
        }
      }
    }
    if (pick < 0) {
      throw BackendError(where(device_) + "cuDNN offers no backward-filter algorithm for a "
                             "batch of " + std::to_string(batch) + " within " +
                             std::to_string(kWorkspaceBound >> 20) + " MiB of workspace",
                         static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED));
    }
    a.backward_filter = bwd[pick].algo;
    std::size_t bwd_bytes = 0;
    dnn(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, x_desc_, conv_desc_t_, conv_desc_,
                                                       filter_desc_, a.backward_filter,
                                                       &bwd_bytes),
        "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    a.workspace = std::max(fwd_bytes, bwd_bytes);
    cached = algos_.emplace(batch, a).first;
  }
  current_ = cached->second;
  if (current_.workspace > workspace_.size()) {
    sync();  // the old workspace may still be in use by enqueued work
    workspace_.allocate(current_.workspace, device_);
  }
  described_batch_ = batch;
}

void CudaModel::forward(int batch) {
  const float one = 1.0f, zero = 0.0f;
  const float* p = params_;
  const float* dense_in = x_.get();
  if (cnn_) {
    set_batch(batch);
    gather_kcrs<<<blocks_for(std::size_t(filters_) * kTaps), kThreads, 0, stream_>>>(
        p + slot_[0].offset, w_kcrs_.get(), filters_);
    launched("gather_kcrs");
    dnn(cudnnConvolutionForward(dnn_, &one, x_desc_, x_.get(), filter_desc_, w_kcrs_.get(),
                                conv_desc_, current_.forward, workspace_.get(), current_.workspace,
                                &zero, conv_desc_t_, conv_pre_.get()),
        "cudnnConvolutionForward");
    dnn(cudnnAddTensor(dnn_, &one, bias_desc_, p + slot_[1].offset, &one, conv_desc_t_,
                       conv_pre_.get()),
        "cudnnAddTensor(conv2d/bias)");
    dnn(cudnnActivationForward(dnn_, act_desc_, &one, conv_desc_t_, conv_pre_.get(), &zero,
                               conv_desc_t_, conv_.get()),
        "cudnnActivationForward");
    dnn(cudnnPoolingForward(dnn_, pool_desc_, &one, conv_desc_t_, conv_.get(), &zero,
                            pool_desc_t_, pooled_nchw_.get()),
        "cudnnPoolingForward");
    const std::size_t pooled = std::size_t(batch) * features_;
    nchw_to_features<<<blocks_for(pooled), kThreads, 0, stream_>>>(
        pooled_nchw_.get(), features_buf_.get(), pooled, filters_, pool_side_);
    launched("nchw_to_features");
    dense_in = features_buf_.get();
  }
  const TensorSlot& w1 = slot_[dense_slot_];
  const TensorSlot& b1 = slot_[dense_slot_ + 1];
  const TensorSlot& w2 = slot_[dense_slot_ + 2];
  const TensorSlot& b2 = slot_[dense_slot_ + 3];
  // hidden (units x batch) = W1 (units x features) * in (features x batch), + b1, ReLU.
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, hidden_units_, batch, features_, p + w1.offset, hidden_units_,
       dense_in, features_, hidden_.get(), hidden_units_);
  const std::size_t h = std::size_t(batch) * hidden_units_;
  bias_act<<<blocks_for(h), kThreads, 0, stream_>>>(hidden_.get(), p + b1.offset, hidden_units_,
                                                    h, true);
  launched("bias_act(dense_1)");
  // logits (classes x batch) = W2 (classes x units) * hidden, + b2.
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, classes_, batch, hidden_units_, p + w2.offset, classes_,
       hidden_.get(), hidden_units_, logits_.get(), classes_);
  const std::size_t l = std::size_t(batch) * classes_;
  bias_act<<<blocks_for(l), kThreads, 0, stream_>>>(logits_.get(), p + b2.offset, classes_, l,
                                                    false);
  launched("bias_act(dense_2)");
}

double CudaModel::forward_backward(const float* x, const std::uint8_t* labels, int batch,
                                   float grad_scale) {
  input(x, labels, batch);
  if (batch == 0) {
    cuda(cudaMemsetAsync(grads_, 0, n_ * sizeof(float), stream_), "cudaMemsetAsync(gradients)");
    sync();
    return 0.0;
  }
  forward(batch);
  float* g = grads_;
  const float* p = params_;
  const TensorSlot& w1 = slot_[dense_slot_];
  const TensorSlot& b1 = slot_[dense_slot_ + 1];
  const TensorSlot& w2 = slot_[dense_slot_ + 2];
  const TensorSlot& b2 = slot_[dense_slot_ + 3];
  const float* dense_in = cnn_ ? features_buf_.get() : x_.get();
  // logits become d loss / d logits = grad_scale * (softmax - one_hot), as on the CPU.
  softmax_xent<<<blocks_for(std::size_t(batch)), kThreads, 0, stream_>>>(
      logits_.get(), labels_.get(), losses_.get(), classes_, batch, grad_scale);
  launched("softmax_xent");
  // dW2 = d_logits * hidden^T, db2 = row sums of d_logits.
  gemm(CUBLAS_OP_N, CUBLAS_OP_T, classes_, hidden_units_, batch, logits_.get(), classes_,
       hidden_.get(), hidden_units_, g + w2.offset, classes_);
  row_sums<<<blocks_for(std::size_t(classes_)), kThreads, 0, stream_>>>(logits_.get(),
                                                                        g + b2.offset, classes_,
                                                                        batch);
  launched("row_sums(dense_2/bias)");
  // d_hidden = W2^T * d_logits, through ReLU (active where hidden > 0).
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, hidden_units_, batch, classes_, p + w2.offset, classes_,
       logits_.get(), classes_, d_hidden_.get(), hidden_units_);
  const std::size_t h = std::size_t(batch) * hidden_units_;
  relu_back<<<blocks_for(h), kThreads, 0, stream_>>>(d_hidden_.get(), hidden_.get(), h);
  launched("relu_back(dense_1)");
  // dW1 = d_hidden * in^T, db1 = row sums of d_hidden.
  gemm(CUBLAS_OP_N, CUBLAS_OP_T, hidden_units_, features_, batch, d_hidden_.get(), hidden_units_,
       dense_in, features_, g + w1.offset, hidden_units_);
  row_sums<<<blocks_for(std::size_t(hidden_units_)), kThreads, 0, stream_>>>(
      d_hidden_.get(), g + b1.offset, hidden_units_, batch);
  launched("row_sums(dense_1/bias)");
  if (cnn_) {
    const float one = 1.0f, zero = 0.0f;
    // d_features = W1^T * d_hidden, back to NCHW, through the pool and the conv's ReLU.
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, features_, batch, hidden_units_, p + w1.offset, hidden_units_,
         d_hidden_.get(), hidden_units_, d_features_.get(), features_);
    const std::size_t pooled = std::size_t(batch) * features_;
    features_to_nchw<<<blocks_for(pooled), kThreads, 0, stream_>>>(
        d_features_.get(), d_pooled_nchw_.get(), pooled, filters_, pool_side_);
    launched("features_to_nchw");
    dnn(cudnnPoolingBackward(dnn_, pool_desc_, &one, pool_desc_t_, pooled_nchw_.get(),
                             pool_desc_t_, d_pooled_nchw_.get(), conv_desc_t_, conv_.get(), &zero,
                             conv_desc_t_, d_conv_.get()),
        "cudnnPoolingBackward");
    dnn(cudnnActivationBackward(dnn_, act_desc_, &one, conv_desc_t_, conv_.get(), conv_desc_t_,
                                d_conv_.get(), conv_desc_t_, conv_pre_.get(), &zero,
                                conv_desc_t_, d_conv_pre_.get()),
        "cudnnActivationBackward");
    dnn(cudnnConvolutionBackwardBias(dnn_, &one, conv_desc_t_, d_conv_pre_.get(), &zero,
                                     bias_desc_, g + slot_[1].offset),
        "cudnnConvolutionBackwardBias");
    dnn(cudnnConvolutionBackwardFilter(dnn_, &one, x_desc_, x_.get(), conv_desc_t_,
                                       d_conv_pre_.get(), conv_desc_, current_.backward_filter,
                                       workspace_.get(), current_.workspace, &zero, filter_desc_,
                                       dw_kcrs_.get()),
        "cudnnConvolutionBackwardFilter");
    scatter_kcrs<<<blocks_for(std::size_t(filters_) * kTaps), kThreads, 0, stream_>>>(
        dw_kcrs_.get(), g + slot_[0].offset, filters_);
    launched("scatter_kcrs");
  }
  cuda(cudaMemcpyAsync(host_losses_.data(), losses_.get(), std::size_t(batch) * sizeof(double),
                       cudaMemcpyDeviceToHost, stream_),
       "cudaMemcpyAsync(losses)");
  sync();
  double loss = 0.0;
  for (int j = 0; j < batch; ++j) loss += host_losses_[static_cast<std::size_t>(j)];
  return loss;
}

void CudaModel::sgd_step(float learning_rate, float momentum) {
  sgd<<<blocks_for(n_), kThreads, 0, stream_>>>(params_, velocity_, grads_, n_, learning_rate,
                                                 momentum);
  launched("sgd");
}

std::size_t CudaModel::count_correct(const float* x, const std::uint8_t* labels, int batch) {
  input(x, labels, batch);
  if (batch == 0) return 0;
  forward(batch);
  cuda(cudaMemsetAsync(correct_.get(), 0, sizeof(unsigned), stream_), "cudaMemsetAsync(correct)");
  count_argmax<<<blocks_for(std::size_t(batch)), kThreads, 0, stream_>>>(
      logits_.get(), labels_.get(), correct_.get(), classes_, batch);
  launched("count_argmax");
  unsigned correct = 0;
  cuda(cudaMemcpyAsync(&correct, correct_.get(), sizeof(unsigned), cudaMemcpyDeviceToHost,
                       stream_),
       "cudaMemcpyAsync(correct)");
  sync();
  return correct;
}

}  // namespace

GpuAvailability gpu_availability() noexcept {
  GpuAvailability a;
  a.built = true;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    a.reason = std::string("no usable CUDA device: cudaGetDeviceCount returned ") +
               cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    return a;
  }
  a.devices = count;
  if (count == 0) a.reason = "no CUDA device: cudaGetDeviceCount found 0";
  return a;
}

std::unique_ptr<GpuModel> make_gpu_model(std::unique_ptr<Model> reference, int device,
                                         int max_batch) {
  if (!reference) throw std::invalid_argument("gpu model: no reference model");
  return std::make_unique<CudaModel>(std::move(reference), device, max_batch);
}

}  // namespace mwms::train
