#include "soak/soak_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "kernels/reduce.h"

namespace mwms::soak {

namespace {

std::uint64_t mix(std::uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool is_int(DataType t) { return t == DataType::kInt32 || t == DataType::kInt64; }

// Significant bits of `t`: the largest power of two up to which every integer is exact (floats)
// or the value range (integers, sign bit excluded).
int exact_bits(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return 24;
    case DataType::kFloat64:
      return 53;
    case DataType::kFloat16:
      return 11;
    case DataType::kBFloat16:
      return 8;
    case DataType::kInt32:
      return 31;
    case DataType::kInt64:
      return 63;
  }
  return 8;
}

// Note [soak values]: the largest |k| such that n values combine exactly.
std::int64_t value_bound(DataType t, ReduceOp op, int n) {
  const int bits = exact_bits(t);
  // Integers: stay below 2^bits - 1 (no overflow); floats: at most 2^bits (exact).
  const unsigned __int128 limit = (static_cast<unsigned __int128>(1) << bits) - (is_int(t) ? 1 : 0);
  if (op != ReduceOp::kProd || n == 1) {
    return static_cast<std::int64_t>(limit / static_cast<unsigned>(n));
  }
  // The largest k with k^n <= limit: from just below 2^(bits/n) upwards (a few steps).
  std::int64_t k = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::pow(2.0, static_cast<double>(bits) / n)) - 2);
  for (;;) {
    unsigned __int128 p = 1;
    for (int i = 0; i < n && p <= limit; ++i) p *= static_cast<unsigned __int128>(k + 1);
    if (p > limit) return k;
    ++k;
  }
}

// Per-(step, rank) stream of input values (the bound and scale of Note [soak values]).
struct Values {
  std::uint64_t base;
  std::uint64_t span;  // 2K + 1
  std::int64_t bound;  // K
  int scale;
  Values(const Step& s, std::uint64_t seed, int n, int rank)
      : base(mix(mix(seed ^ (s.index * 0xD1B54A32D192ED03ull)) + static_cast<std::uint64_t>(rank))),
        bound(value_bound(s.dtype, s.op, n)),
        scale(s.scale) {
    span = 2 * static_cast<std::uint64_t>(bound) + 1;
  }
  std::int64_t k(std::size_t i) const noexcept {
    return static_cast<std::int64_t>(mix(base + i) % span) - bound;
  }
  double real(std::size_t i) const noexcept {
    return std::ldexp(static_cast<double>(k(i)), -scale);
  }
};

void store(DataType t, void* base, std::size_t i, const Values& v) {
  switch (t) {
    case DataType::kFloat32:
      static_cast<float*>(base)[i] = static_cast<float>(v.real(i));
      return;
    case DataType::kFloat64:
      static_cast<double*>(base)[i] = v.real(i);
      return;
    case DataType::kFloat16:
      static_cast<std::uint16_t*>(base)[i] = kernels::float_to_half(static_cast<float>(v.real(i)));
      return;
    case DataType::kBFloat16:
      static_cast<std::uint16_t*>(base)[i] =
          kernels::float_to_bfloat16(static_cast<float>(v.real(i)));
      return;
    case DataType::kInt32:
      static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v.k(i));
      return;
    case DataType::kInt64:
      static_cast<std::int64_t*>(base)[i] = v.k(i);
      return;
  }
}

double load_real(DataType t, const void* base, std::size_t i) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(base)[i];
    case DataType::kFloat16:
      return kernels::half_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::kBFloat16:
      return kernels::bfloat16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    default:
      return 0;
  }
}

std::int64_t load_int(DataType t, const void* base, std::size_t i) {
  return t == DataType::kInt32 ? static_cast<const std::int32_t*>(base)[i]
                               : static_cast<const std::int64_t*>(base)[i];
}

// The reduction of element i over every rank, in exact arithmetic (Note [soak values]).
template <typename T>
T combine(const std::vector<Values>& ranks, std::size_t i, ReduceOp op,
          T (*get)(const Values&, std::size_t)) {
  T acc = get(ranks[0], i);
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    const T v = get(ranks[r], i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
    }
  }
  return acc;
}

// kMean's division as scale_divide performs it, then rounding to the storage type.
double mean_of(double sum, DataType t, int n) {
  switch (t) {
    case DataType::kFloat64:
      return sum / n;
    case DataType::kFloat32:
      return static_cast<float>(sum) / static_cast<float>(n);
    case DataType::kFloat16:
      return kernels::half_to_float(
          kernels::float_to_half(static_cast<float>(sum) / static_cast<float>(n)));
    case DataType::kBFloat16:
      return kernels::bfloat16_to_float(
          kernels::float_to_bfloat16(static_cast<float>(sum) / static_cast<float>(n)));
    default:
      return sum;
  }
}

[[noreturn]] void wrong(const Step& s, const std::string& where, std::size_t count,
                        std::size_t element, const std::string& got, const std::string& want) {
  std::ostringstream msg;
  if (s.index >= kWarmUpFirstIndex) {
    msg << "soak warm-up step " << s.index - kWarmUpFirstIndex;
  } else {
    msg << "soak step " << s.index;
  }
  msg << " (" << where << "): " << kind_name(s.kind) << " "
      << to_string(s.dtype) << " " << to_string(s.op) << " count " << count
      << (s.in_place ? " in place" : "") << (s.async ? " async" : "") << ": element " << element
      << " is " << got << ", expected " << want;
  throw std::runtime_error(msg.str());
}

}  // namespace

const char* kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::uint64_t Rng::next() noexcept {
  const std::uint64_t out = mix(state_);
  state_ += 0x9E3779B97F4A7C15ull;
  return out;
}

Step draw_step(const PlanOptions& o, std::uint64_t index, Rng* rng) {
  Step s;
  s.index = index;
  const std::uint64_t k = rng->below(100);
  s.kind = k < 50   ? Kind::kAllReduce
           : k < 65 ? Kind::kReduceScatter
           : k < 80 ? Kind::kAllGather
           : k < 95 ? Kind::kBroadcast
                    : Kind::kBarrier;
  s.dtype = static_cast<DataType>(rng->below(6));
  s.op = static_cast<ReduceOp>(rng->below(5));
  if (s.kind != Kind::kAllReduce && s.kind != Kind::kReduceScatter) s.op = ReduceOp::kSum;
  s.comm = static_cast<int>(rng->below(static_cast<std::uint64_t>(o.num_comms)));
  s.root = static_cast<int>(rng->below(static_cast<std::uint64_t>(o.world_size)));
  s.in_place = rng->below(4) == 0;
  s.async = static_cast<double>(rng->below(1000)) < o.async_fraction * 1000;
  // Log-uniform bytes: every power of two up to max_bytes equally likely; 3 % empty calls.
  int top = 0;
  while ((std::size_t{2} << top) <= o.max_bytes) ++top;
  std::size_t bytes = 0;
  if (rng->below(100) >= 3) {
    const std::size_t low = std::size_t{1} << rng->below(static_cast<std::uint64_t>(top) + 1);
    bytes = std::min(o.max_bytes, low + static_cast<std::size_t>(rng->below(low)));
  }
  const std::size_t elements = bytes / dtype_size(s.dtype);
  const bool blocks = s.kind == Kind::kReduceScatter || s.kind == Kind::kAllGather;
  s.count = s.kind == Kind::kBarrier ? 0
            : blocks                 ? elements / static_cast<std::size_t>(o.world_size)
                                     : elements;
  // Note [soak values]: halves keep few fraction bits, products none (no subnormals).
  const bool half = s.dtype == DataType::kFloat16 || s.dtype == DataType::kBFloat16;
  const std::uint64_t max_scale = is_int(s.dtype) || s.op == ReduceOp::kProd ? 0 : half ? 3 : 8;
  s.scale = static_cast<int>(rng->below(max_scale + 1));
  return s;
}

std::pair<std::size_t, std::size_t> buffer_counts(const Step& s, int n) {
  const std::size_t nn = static_cast<std::size_t>(n);
  switch (s.kind) {
    case Kind::kReduceScatter:
      return {s.count * nn, s.count};
    case Kind::kAllGather:
      return {s.count, s.count * nn};
    case Kind::kBarrier:
      return {0, 0};
    default:
      return {s.count, s.count};
  }
}

void fill_input(const Step& s, std::uint64_t seed, int n, int rank, void* buffer) {
  const Values v(s, seed, n, rank);
  const std::size_t count = buffer_counts(s, n).first;
  for (std::size_t i = 0; i < count; ++i) store(s.dtype, buffer, i, v);
}

std::size_t verify(const Step& s, std::uint64_t seed, int n, int rank, const void* result,
                   const std::string& where) {
  std::vector<Values> ranks;
  for (int r = 0; r < n; ++r) ranks.emplace_back(s, seed, n, r);
  const std::size_t count = buffer_counts(s, n).second;
  const auto real = [](const Values& v, std::size_t i) { return v.real(i); };
  const auto integer = [](const Values& v, std::size_t i) { return v.k(i); };
  for (std::size_t j = 0; j < count; ++j) {
    // Which rank's element (all_gather, broadcast) or which global element (reduce_scatter).
    std::size_t i = j;
    const Values* only = nullptr;
    if (s.kind == Kind::kReduceScatter) i = static_cast<std::size_t>(rank) * s.count + j;
    if (s.kind == Kind::kAllGather) {
      only = &ranks[j / s.count];
      i = j % s.count;
    }
    if (s.kind == Kind::kBroadcast) only = &ranks[static_cast<std::size_t>(s.root)];
    if (is_int(s.dtype)) {
      std::int64_t want =
          only != nullptr ? only->k(i) : combine<std::int64_t>(ranks, i, s.op, integer);
      if (s.op == ReduceOp::kMean && only == nullptr) want /= n;
      const std::int64_t got = load_int(s.dtype, result, j);
      if (got != want) wrong(s, where, count, j, std::to_string(got), std::to_string(want));
    } else {
      double want = only != nullptr ? only->real(i) : combine<double>(ranks, i, s.op, real);
      if (s.op == ReduceOp::kMean && only == nullptr) want = mean_of(want, s.dtype, n);
      const double got = load_real(s.dtype, result, j);
      if (got != want) {  // also equal for -0 vs +0 (the sign of a zero product is not checked)
        std::ostringstream g, w;
        g.precision(17);
        w.precision(17);
        g << got;
        w << want;
        wrong(s, where, count, j, g.str(), w.str());
      }
    }
  }
  return count;
}

}  // namespace mwms::soak
