// The --backend nccl sweep and bucket_perf's device path over a device::Runtime
// (device_sweep.h): compiled in every build, with the real CUDA/NCCL runtime in device_bench.cc
// and a host-memory fake in tests/unit/bench/device_sweep_test.cc.
#include "common/device_sweep.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <vector>

#include "common/run_environment.h"
#include "common/size_sweep.h"
#include "common/statistics.h"
#include "common/timing.h"
#include "common/verification.h"
#include "mwms/mwms.h"

namespace mwms::bench::device {
namespace {

// Device memory from the runtime, released on destruction; at least one byte.
class DeviceBuffer {
 public:
  DeviceBuffer(const Runtime& rt, std::size_t bytes)
      : rt_(rt), data_(rt.alloc(bytes == 0 ? 1 : bytes)) {}
  ~DeviceBuffer() { rt_.release(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }

 private:
  const Runtime& rt_;
  void* data_;
};

// A stream of this rank's device; copies on it are complete when they return.
class Stream {
 public:
  explicit Stream(const Runtime& rt) : rt_(rt), stream_(rt.stream_create()) {}
  ~Stream() { rt_.stream_destroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return stream_; }
  DeviceStream handle() const { return DeviceStream{stream_}; }
  void to_device(void* dst, const void* src, std::size_t bytes) const {
    rt_.to_device(dst, src, bytes, stream_);
  }
  void to_host(void* dst, const void* src, std::size_t bytes) const {
    rt_.to_host(dst, src, bytes, stream_);
  }
  const Runtime& runtime() const { return rt_; }

 private:
  const Runtime& rt_;
  void* stream_;
};

// Raw NCCL's communicator from the runtime, destroyed with this object.
class Raw {
 public:
  Raw(const Runtime& rt, DeviceCommunicator& ours, const Stream& stream)
      : rt_(rt), stream_(stream), raw_(rt.raw_create(ours, stream.get())) {}
  ~Raw() { rt_.raw_destroy(raw_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  void enqueue(DeviceCollective kind, void* buffer, const CallShape& s, DataType dtype) {
    rt_.raw_enqueue(raw_, kind, buffer, s, dtype, stream_.get());
  }
  void wait_stream() { rt_.raw_wait(raw_, stream_.get()); }

 private:
  const Runtime& rt_;
  const Stream& stream_;
  void* raw_;
};

// Host-side helpers over the DeviceCommunicator: a barrier, and values reduced across ranks
// (max of times, sum of wrong counts), through a small device scratch buffer.
class Ranks {
 public:
  Ranks(DeviceCommunicator& comm, const Stream& stream)
      : comm_(comm),
        stream_(stream),
        scratch_(
            stream.runtime(),
            std::max<std::size_t>(64 * sizeof(double), static_cast<std::size_t>(comm.world_size()) *
                                                           sizeof(std::int32_t))) {}

  void barrier() {
    comm_.all_reduce(scratch_.data(), 1, DataType::kFloat32, ReduceOp::kSum, stream_.handle());
  }
  /// Elementwise op over ranks of `n` (<= 64) doubles, in place.
  void reduce(double* values, std::size_t n, ReduceOp op) {
    stream_.to_device(scratch_.data(), values, n * sizeof(double));
    comm_.all_reduce(scratch_.data(), n, DataType::kFloat64, op, stream_.handle());
    stream_.to_host(values, scratch_.data(), n * sizeof(double));
  }
  /// Every rank's device id, in rank order.
  std::vector<std::int32_t> devices() {
    std::vector<std::int32_t> all(static_cast<std::size_t>(comm_.world_size()), 0);
    all[static_cast<std::size_t>(comm_.rank())] = comm_.device();
    auto* base = static_cast<std::int32_t*>(scratch_.data());
    stream_.to_device(base + comm_.rank(), &all[static_cast<std::size_t>(comm_.rank())],
                      sizeof(std::int32_t));
    comm_.all_gather(base + comm_.rank(), base, 1, DataType::kInt32, stream_.handle());
    stream_.to_host(all.data(), base, all.size() * sizeof(std::int32_t));
    return all;
  }

 private:
  DeviceCommunicator& comm_;
  const Stream& stream_;
  DeviceBuffer scratch_;  // 64 doubles, or world_size int32 for devices() when that is more
};

// Ours: the same call through the DeviceCommunicator, in place, the host path's layout.
std::shared_ptr<Work> run_ours(DeviceCommunicator& comm, DeviceCollective kind, void* buffer,
                               const CallShape& s, DataType dtype, DeviceStream stream) {
  const std::size_t block = s.count * dtype_size(dtype);
  auto* bytes = static_cast<unsigned char*>(buffer);
  unsigned char* own = bytes + static_cast<std::size_t>(s.rank) * block;
  switch (kind) {
    case DeviceCollective::kAllReduce:
      return comm.all_reduce_async(buffer, s.count, dtype, s.op, stream);
    case DeviceCollective::kReduceScatter:
      return comm.reduce_scatter_async(buffer, own, s.count, dtype, s.op, stream);
    case DeviceCollective::kAllGather:
      return comm.all_gather_async(own, buffer, s.count, dtype, stream);
    case DeviceCollective::kBroadcast:
      return comm.broadcast_async(buffer, s.count, dtype, s.root, stream);
  }
  throw InvalidArgument("unknown device collective");
}

class DeviceSweep {
 public:
  DeviceSweep(const CollectiveDescriptor& collective, const BenchOptions& options,
              DeviceCommunicator& comm, const Stream& stream)
      : collective_(collective),
        options_(options),
        comm_(comm),
        stream_(stream),
        ranks_(comm, stream),
        elem_bytes_(dtype_size(options.dtype)),
        max_elements_(collective.buffer_count(
            collective.count_for_bytes(options.max_bytes, elem_bytes_, comm.world_size()),
            comm.world_size())),
        buffer_(stream.runtime(), max_elements_ * elem_bytes_),
        host_(max_elements_ * elem_bytes_ + 1) {
    if (collective.uses_root && options.root >= comm.world_size()) {
      // Every rank has the same options, so every rank stops here: no peer is left waiting.
      throw InvalidArgument("--root " + std::to_string(options.root) +
                            " is not a rank (world size " + std::to_string(comm.world_size()) +
                            ")");
    }
    if (options.compare_nccl) raw_ = std::make_unique<Raw>(stream.runtime(), comm, stream);
  }

  int run() {
    const bool leader = comm_.rank() == 0;
    const std::vector<std::int32_t> devices = ranks_.devices();
    if (leader) print_banner(devices);
    return sweep_sizes(
        collective_, options_, comm_.world_size(), leader,
        [this](std::size_t count) { return measure(count); }, [this] { return run_info(); });
  }

 private:
  CallShape shape(std::size_t count) const {
    return CallShape{count, comm_.rank(), comm_.world_size(), options_.op, options_.root};
  }

  // The first call on the check pattern, copied back and verified as the host path verifies.
  std::int64_t check_first_iteration(const CallShape& call, std::size_t elements) {
    fill_input(collective_, host_.data(), call, options_.dtype);
    stream_.to_device(buffer_.data(), host_.data(), elements * elem_bytes_);
    run_ours(comm_, collective_.device, buffer_.data(), call, options_.dtype, stream_.handle())
        ->wait();
    stream_.to_host(host_.data(), buffer_.data(), elements * elem_bytes_);
    return count_wrong(collective_, host_.data(), call, options_.dtype);
  }

  void fill_timing_value(std::size_t elements) {
    fill_constant(host_.data(), elements, options_.dtype, collective_.timing_value(options_.op));
    stream_.to_device(buffer_.data(), host_.data(), elements * elem_bytes_);
  }

  // Note [device timing]: n calls back to back on the stream, until the last completed, / n.
  double time_ours(const CallShape& call, int warmups) {
    works_.clear();
    for (int i = 0; i < warmups; ++i) {
      works_.push_back(run_ours(comm_, collective_.device, buffer_.data(), call, options_.dtype,
                                stream_.handle()));
    }
    for (auto& w : works_) w->wait();
    works_.clear();
    ranks_.barrier();
    const Stopwatch watch;
    for (int i = 0; i < options_.iters; ++i) {
      works_.push_back(run_ours(comm_, collective_.device, buffer_.data(), call, options_.dtype,
                                stream_.handle()));
    }
    works_.back()->wait();  // stream order: the others completed before it
    const double us = watch.elapsed_us() / options_.iters;
    for (auto& w : works_) w->wait();
    works_.clear();
    return us;
  }

  double time_raw(const CallShape& call) {
    for (int i = 0; i < options_.warmup_iters; ++i) {
      raw_->enqueue(collective_.device, buffer_.data(), call, options_.dtype);
    }
    raw_->wait_stream();
    ranks_.barrier();
    const Stopwatch watch;
    for (int i = 0; i < options_.iters; ++i) {
      raw_->enqueue(collective_.device, buffer_.data(), call, options_.dtype);
    }
    raw_->wait_stream();
    return watch.elapsed_us() / options_.iters;
  }

  ResultRow measure(std::size_t count) {
    const CallShape call = shape(count);
    const std::size_t elements = collective_.buffer_count(count, comm_.world_size());
    ResultRow row = start_row(collective_, options_, elements);
    int warmups = options_.warmup_iters;
    std::int64_t wrong = 0;
    if (options_.check != 0) {
      wrong = check_first_iteration(call, elements);
      if (warmups > 0) --warmups;
    }
    fill_timing_value(elements);
    double values[3] = {time_ours(call, warmups), 0.0, static_cast<double>(wrong)};
    if (raw_) {
      fill_timing_value(elements);
      values[1] = time_raw(call);
    }
    // A collective finishes when its slowest rank does; wrong elements add up over ranks.
    ranks_.reduce(values, 2, ReduceOp::kMax);
    ranks_.reduce(values + 2, 1, ReduceOp::kSum);
    const double factor = collective_.busbw_factor(comm_.world_size());
    row.time_us = values[0];
    row.algbw = gb_per_s(static_cast<double>(row.bytes), row.time_us);
    row.busbw = row.algbw * factor;
    row.wrong = options_.check != 0 ? static_cast<std::int64_t>(values[2]) : -1;
    if (raw_) {
      row.has_nccl = true;
      row.nccl_time_us = values[1];
      row.nccl_busbw = gb_per_s(static_cast<double>(row.bytes), row.nccl_time_us) * factor;
    }
    return row;
  }

  RunInfo run_info() const {
    RunInfo info;
    info.collective = collective_.name;
    info.ranks = comm_.world_size();
    info.backend = "nccl";
    info.describe = comm_.describe();
    info.iters = options_.iters;
    info.warmup_iters = options_.warmup_iters;
    info.nccl_library = stream_.runtime().library();
    info.environment = measured_environment(EnvScope::kDevice);
    return info;
  }

  void print_banner(const std::vector<std::int32_t>& devices) const {
    std::cout << "# " << collective_.name << "_perf: libmwms " << MWMS_VERSION_STRING << "\n"
              << "# minBytes " << options_.min_bytes << " maxBytes " << options_.max_bytes
              << " step: " << options_.step_factor
              << "(factor) warmup iters: " << options_.warmup_iters << " iters: " << options_.iters
              << " validation: " << options_.check
              << " backend: nccl compare: " << (options_.compare_nccl ? "nccl" : "none");
    if (collective_.uses_root) std::cout << " root: " << options_.root;
    std::cout << "\n"
              << "# time (device buffers): " << options_.iters
              << " calls back to back on one stream until the last completed, / " << options_.iters
              << " (nccl-tests' measure), max over ranks; busbw = algbw * "
              << collective_.busbw_factor(comm_.world_size()) << "\n#\n"
              << "# Backend: nccl requested; used: " << comm_.describe() << "\n"
              << "# Environment: "
              << describe_environment(measured_environment(EnvScope::kDevice), "") << "\n"
              << "# NCCL: " << stream_.runtime().library();
    if (options_.compare_nccl) {
      std::cout << "; raw NCCL (its own communicator, same buffers, same timing): nccl time, "
                   "nccl busbw; vs nccl = busbw / nccl busbw";
    }
    std::cout << "\n# Ranks: " << comm_.world_size() << "\n";
    for (std::size_t r = 0; r < devices.size(); ++r) {
      std::cout << "#  Rank " << r << " device " << devices[r] << "\n";
    }
    std::cout << "#\n";
    print_table_header(std::cout, false, false, options_.compare_nccl);
  }

  const CollectiveDescriptor& collective_;
  const BenchOptions& options_;
  DeviceCommunicator& comm_;
  const Stream& stream_;
  Ranks ranks_;
  std::size_t elem_bytes_;
  std::size_t max_elements_;
  DeviceBuffer buffer_;
  std::vector<unsigned char> host_;  // staging for the check and the fills
  std::unique_ptr<Raw> raw_;
  std::vector<std::shared_ptr<Work>> works_;
};

}  // namespace

int sweep(const CollectiveDescriptor& collective, const BenchOptions& options,
          DeviceCommunicator& comm, const Runtime& rt) {
  const Stream stream(rt);
  return DeviceSweep(collective, options, comm, stream).run();
}

BucketRow buckets(const std::vector<std::size_t>& counts, const BucketOptions& options,
                  DeviceCommunicator& comm, const Runtime& rt, BucketRunInfo* info) {
  const Stream stream(rt);
  Ranks ranks(comm, stream);
  const std::size_t elem = dtype_size(options.dtype);
  const int n = comm.world_size();
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<DeviceTensor> tensors;
  std::size_t largest = 0;
  for (std::size_t c : counts) {
    buffers.push_back(std::make_unique<DeviceBuffer>(rt, c * elem));
    tensors.push_back(DeviceTensor{buffers.back()->data(), c});
    largest = std::max(largest, c);
  }
  std::vector<unsigned char> host(largest * elem);
  const CallShape shape{0, comm.rank(), n, options.op, 0};
  const auto fill = [&](bool pattern) {
    const double constant = options.op == ReduceOp::kProd ? 1.0 : 0.0;
    for (std::size_t t = 0; t < counts.size(); ++t) {
      for (std::size_t i = 0; i < counts[t]; ++i) {
        store_element(host.data(), i, options.dtype,
                      pattern ? reduction_input(i, shape.rank, n, options.op) : constant);
      }
      stream.to_device(tensors[t].data, host.data(), counts[t] * elem);
    }
  };
  const auto wrong = [&]() {
    std::int64_t bad = 0;
    for (std::size_t t = 0; t < counts.size(); ++t) {
      stream.to_host(host.data(), tensors[t].data, counts[t] * elem);
      for (std::size_t i = 0; i < counts[t]; ++i) {
        if (load_element(host.data(), i, options.dtype) != reduction_expected(i, n, options.op)) {
          ++bad;
        }
      }
    }
    return bad;
  };
  std::vector<std::shared_ptr<Work>> works;
  const auto bucketed = [&] {
    comm.all_reduce_bucket_async(tensors.data(), tensors.size(), options.dtype, options.op,
                                 stream.handle())
        ->wait();
  };
  const auto separate = [&] {
    works.clear();
    for (const DeviceTensor& t : tensors) {
      works.push_back(
          comm.all_reduce_async(t.data, t.count, options.dtype, options.op, stream.handle()));
    }
    for (auto& w : works) w->wait();
  };
  double values[3] = {0, 0, 0};
  if (options.check != 0) {
    fill(true);
    bucketed();
    values[2] += static_cast<double>(wrong());
    fill(true);
    separate();
    values[2] += static_cast<double>(wrong());
  }
  std::vector<double> times;
  const auto median_us = [&](const auto& once) {
    fill(false);
    for (int i = 0; i < options.warmup_iters; ++i) once();
    ranks.barrier();
    time_iterations(options.iters, times, once);
    return median(times);
  };
  values[0] = median_us(bucketed);
  values[1] = median_us(separate);
  ranks.reduce(values, 2, ReduceOp::kMax);
  ranks.reduce(values + 2, 1, ReduceOp::kSum);
  BucketRow row;
  row.tensors = counts.size();
  row.smallest_bytes = static_cast<std::size_t>(-1);
  for (std::size_t c : counts) {
    row.bytes += c * elem;
    row.smallest_bytes = std::min(row.smallest_bytes, c * elem);
    row.largest_bytes = std::max(row.largest_bytes, c * elem);
  }
  row.type = std::string(to_string(options.dtype));
  row.redop = std::string(to_string(options.op));
  row.buckets = 1;  // one NCCL group
  const double factor = 2.0 * (n - 1) / n;
  row.bucketed_time_us = values[0];
  row.bucketed_busbw = gb_per_s(static_cast<double>(row.bytes), values[0]) * factor;
  row.separate_time_us = values[1];
  row.separate_busbw = gb_per_s(static_cast<double>(row.bytes), values[1]) * factor;
  row.wrong = options.check != 0 ? static_cast<std::int64_t>(values[2]) : -1;
  info->buffers = "device";
  info->ranks = n;
  info->backend = "nccl";
  info->describe = comm.describe();
  info->bytes_per_pack = 0;
  info->iters = options.iters;
  info->warmup_iters = options.warmup_iters;
  return row;
}

}  // namespace mwms::bench::device
