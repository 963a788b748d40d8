// gpu:staged2 / gpu:auto1 — DeviceCommunicator on a real GPU, one process per rank under any
// launcher (mwmsrun, TF_CONFIG; a world of one without one):
//   --implementation ring --expect host-staged: every collective, dtype and op (counts 0, 1,
//     prime, MiB) through the host-staged path, checked against the CPU result (the CPU kernels
//     over every rank's input, which each rank can compute: exact small-integer inputs); two
//     processes on ONE GPU work here, which NCCL refuses; then a 64 MiB float32 all-reduce timed;
//   --implementation auto --expect nccl: kAuto on a world of one with a GPU picks NCCL.
// Exits 0 when every check passed, 1 on a failure, 77 (skipped) without a usable device.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/reduce.h"
#include "mwms/device_communicator.h"
#include "mwms/mwms.h"
#include "support/values.h"

namespace {

using mwms::DataType;
using mwms::ReduceOp;

constexpr int kSkipReturnCode = 77;

void cuda_check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorName(e) + " " +
                             cudaGetErrorString(e));
  }
}

struct Device {
  void* p = nullptr;
  explicit Device(std::size_t bytes) { cuda_check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc"); }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
};

std::vector<unsigned char> input(int rank, DataType t, ReduceOp op, std::size_t count) {
  std::vector<unsigned char> v(count * mwms::dtype_size(t));
  for (std::size_t i = 0; i < count; ++i) {
    mwms::testing::store(t, v.data(), i, mwms::testing::input_value(rank, i, op));
  }
  return v;
}

// The CPU result of an all-reduce of every rank's input (exact inputs: order-independent).
std::vector<unsigned char> reduced(int n, DataType t, ReduceOp op, std::size_t count) {
  std::vector<unsigned char> acc = input(0, t, op, count);
  for (int r = 1; r < n; ++r) {
    std::vector<unsigned char> x = input(r, t, op, count);
    mwms::kernels::reduce(acc.data(), x.data(), count, t, op);
  }
  if (op == ReduceOp::kMean) mwms::kernels::scale_divide(acc.data(), count, t, n);
  return acc;
}

std::vector<unsigned char> to_host(const void* d, std::size_t bytes) {
  std::vector<unsigned char> h(bytes);
  if (bytes > 0) cuda_check(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

void to_device(void* d, const std::vector<unsigned char>& h) {
  if (!h.empty()) cuda_check(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
}

void expect(bool ok, const std::string& what, int* failures) {
  if (ok) return;
  std::printf("FAIL: %s\n", what.c_str());
  ++*failures;
}

int every_collective(mwms::DeviceCommunicator& comm, cudaStream_t stream) {
  const int n = comm.world_size(), rank = comm.rank();
  const mwms::DeviceStream s{stream};
  int failures = 0, checked = 0;
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt32, DataType::kInt64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProd};
  for (DataType t : types) {
    const std::size_t e = mwms::dtype_size(t);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1009},
                              (std::size_t{1} << 20) / e + 1}) {
      const std::string tag = std::string(mwms::to_string(t)) + " count " + std::to_string(count);
      for (ReduceOp op : ops) {
        Device d(count * e);
        to_device(d.p, input(rank, t, op, count));
        comm.all_reduce_async(d.p, count, t, op, s)->wait();
        expect(to_host(d.p, count * e) == reduced(n, t, op, count),
               "all_reduce " + tag + " " + std::string(mwms::to_string(op)), &failures);
        ++checked;
      }
      {  // reduce-scatter: rank r gets block r of the all-reduce of n * count elements
        Device send(count * e * n), recv(count * e);
        to_device(send.p, input(rank, t, ReduceOp::kSum, count * n));
        comm.reduce_scatter(send.p, recv.p, count, t, ReduceOp::kSum, s)->wait();
        const std::vector<unsigned char> all = reduced(n, t, ReduceOp::kSum, count * n);
        const std::vector<unsigned char> mine(all.begin() + static_cast<long>(count * e * rank),
                                              all.begin() + static_cast<long>(count * e * (rank + 1)));
        expect(to_host(recv.p, count * e) == mine, "reduce_scatter " + tag, &failures);
        ++checked;
      }
      {  // all-gather: block r is rank r's input
        Device send(count * e), recv(count * e * n);
        to_device(send.p, input(rank, t, ReduceOp::kSum, count));
        comm.all_gather(send.p, recv.p, count, t, s)->wait();
        std::vector<unsigned char> want;
        for (int r = 0; r < n; ++r) {
          std::vector<unsigned char> x = input(r, t, ReduceOp::kSum, count);
          want.insert(want.end(), x.begin(), x.end());
        }
        expect(to_host(recv.p, count * e * n) == want, "all_gather " + tag, &failures);
        ++checked;
      }
      {  // broadcast from the last rank
        Device d(count * e);
        to_device(d.p, input(rank, t, ReduceOp::kSum, count));
        comm.broadcast(d.p, count, t, n - 1, s)->wait();
        expect(to_host(d.p, count * e) == input(n - 1, t, ReduceOp::kSum, count),
               "broadcast " + tag, &failures);
        ++checked;
      }
    }
  }
  {  // a bucket of three tensors
    const std::size_t counts[] = {7, 1009, 65536};
    std::vector<Device*> ds;
    std::vector<mwms::DeviceTensor> tensors;
    for (std::size_t c : counts) {
      ds.push_back(new Device(c * 4));
      to_device(ds.back()->p, input(rank, DataType::kFloat32, ReduceOp::kMean, c));
      tensors.push_back({ds.back()->p, c});
    }
    comm.all_reduce_bucket(tensors.data(), tensors.size(), DataType::kFloat32, ReduceOp::kMean, s)
        ->wait();
    for (std::size_t k = 0; k < 3; ++k) {
      expect(to_host(ds[k]->p, counts[k] * 4) == reduced(n, DataType::kFloat32, ReduceOp::kMean, counts[k]),
             "bucket tensor " + std::to_string(k), &failures);
      delete ds[k];
    }
    ++checked;
  }
  std::printf("rank %d: %d collectives checked, %d failed\n", rank, checked, failures);
  return failures;
}

// A 64 MiB float32 all-reduce through the backend chosen, timed over 5 iterations after one warm-up.
void timed(mwms::DeviceCommunicator& comm, cudaStream_t stream) {
  const std::size_t bytes = std::size_t{64} << 20;
  Device d(bytes);
  cuda_check(cudaMemset(d.p, 0, bytes), "cudaMemset");
  comm.all_reduce_async(d.p, bytes / 4, DataType::kFloat32, ReduceOp::kSum, {stream})->wait();
  const auto start = std::chrono::steady_clock::now();
  const int iters = 5;
  for (int i = 0; i < iters; ++i) {
    comm.all_reduce_async(d.p, bytes / 4, DataType::kFloat32, ReduceOp::kSum, {stream})->wait();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  if (comm.rank() == 0) {
    std::printf("{\"bench\":\"staged_check\",\"backend\":\"%s\",\"world_size\":%d,\"bytes\":%zu,"
                "\"ms\":%.3f,\"algbw_gbs\":%.3f}\n",
                comm.describe().substr(0, comm.describe().find(' ')).c_str(), comm.world_size(),
                bytes, s * 1e3, static_cast<double>(bytes) / s / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string implementation = "ring", want = "host-staged";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--implementation") implementation = argv[i + 1];
    else if (flag == "--expect") want = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--implementation ring|auto|nccl] [--expect host-staged|nccl]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount: %s, %d device(s))\n",
                err == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(err), devices);
    return kSkipReturnCode;
  }
  try {
    mwms::CommunicatorOptions o;
    o.timeout_seconds = 60;
    o.implementation = implementation == "auto" ? mwms::Implementation::kAuto
                       : implementation == "nccl" ? mwms::Implementation::kNccl
                                                  : mwms::Implementation::kRing;
    auto comm = mwms::DeviceCommunicator::create(mwms::resolve_from_environment(), o);
    std::printf("rank %d of %d: %s\n", comm->rank(), comm->world_size(), comm->describe().c_str());
    if (comm->describe().rfind(want + " (", 0) != 0) {
      std::printf("FAIL: expected the %s backend, got: %s\n", want.c_str(), comm->describe().c_str());
      return 1;
    }
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
    const int failures = every_collective(*comm, stream);
    timed(*comm, stream);
    comm->barrier(mwms::DeviceStream{stream});
    comm->finalize();
    cudaStreamDestroy(stream);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
