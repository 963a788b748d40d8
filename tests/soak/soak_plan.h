// The soak's random collectives and their references (tests/soak, docs/RELIABILITY.md "Soak").
// Every rank draws the same sequence of steps from the same seed, fills its inputs from a hash
// of (seed, step, rank, element) and can therefore compute every other rank's inputs, and so the
// expected result, locally: no rank trusts a value it received.
//
// Note [soak values]: every input is k x 2^-s with an integer k small enough that every partial
// result of the reduction (sums of up to n values, products of up to n values) is exactly
// representable in the dtype (float32 24 significant bits, float64 53, float16 11, bfloat16 8,
// int32/int64 without overflow). The result is then independent of the order in which the
// algorithm combines the ranks' values, so it is compared for equality, not within a tolerance:
// every algorithm, transport and chunking must give the exact value. kMean divides the exact sum
// once, as the library does (scale_divide: float32 division for float32/float16/bfloat16,
// float64 for float64, truncating integer division for integers); the reference performs the
// same division in the same type, so that is exact as well (and exact outright for n = 4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mwms/types.h"

namespace mwms::soak {

/// Steps of the warm-up are numbered from here (the run's from 0), so that their inputs differ.
constexpr std::uint64_t kWarmUpFirstIndex = std::uint64_t{1} << 40;

/// The collectives the soak draws.
enum class Kind : std::uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };

/// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier".
const char* kind_name(Kind kind) noexcept;

/// splitmix64 (Steele, Lea, Flood 2014): small, fast, and identical on every rank and build.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() noexcept;
  /// Uniform in [0, n); n > 0.
  std::uint64_t below(std::uint64_t n) noexcept { return next() % n; }

 private:
  std::uint64_t state_;
};

/// One drawn collective. `count` is the per-rank element count of the call: all_reduce's and
/// broadcast's buffer, reduce_scatter's recv_count, all_gather's send_count.
struct Step {
  std::uint64_t index = 0;  ///< position in the sequence (the value hash includes it)
  Kind kind = Kind::kBarrier;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::size_t count = 0;
  int root = 0;           ///< broadcast only
  int comm = 0;           ///< index of the communicator (transport x algorithm) that runs it
  bool in_place = false;  ///< reduce_scatter/all_gather: recv aliases this rank's block of send
  bool async = false;     ///< issued with the *_async form and waited on later
  int scale = 0;          ///< s of Note [soak values]
};

/// What a soak draws from. Sizes are log-uniform between 1 byte and max_bytes (every binary
/// order of magnitude equally likely, so most calls are small), plus empty calls; max_bytes
/// bounds the largest buffer of a step on any rank (all_gather's recv, reduce_scatter's send).
struct PlanOptions {
  std::uint64_t seed = 1;
  int world_size = 4;
  int num_comms = 1;
  std::size_t max_bytes = 4u << 20;
  double async_fraction = 0.2;  ///< share of steps issued asynchronously
};

/// Draws the next step; the same options and rng state give the same step on every rank.
Step draw_step(const PlanOptions& options, std::uint64_t index, Rng* rng);

/// Element count of the buffers a step needs on one rank: {send, recv} (equal for in-place
/// all_reduce and broadcast; 0 for a barrier).
std::pair<std::size_t, std::size_t> buffer_counts(const Step& step, int world_size);

/// Fills this rank's input of `step` (send buffer, or the buffer of all_reduce/broadcast).
void fill_input(const Step& step, std::uint64_t seed, int world_size, int rank, void* buffer);

/// Checks the result on this rank; returns the number of elements checked. @throws
/// std::runtime_error naming the step, dtype, op, count, element, value and expected value at
/// the first wrong element.
std::size_t verify(const Step& step, std::uint64_t seed, int world_size, int rank,
                   const void* result, const std::string& where);

}  // namespace mwms::soak
