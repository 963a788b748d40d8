// The Gloo side of --compare gloo: Gloo's own all-reduce algorithms over its TCP transport
// (Debian's libgloo-dev, gloo 0.0~git20220518), timed in the same run as libmwms on the same
// buffer, so that the ratio survives a noisy machine. Two of Gloo's algorithms are timed:
// AllreduceRingChunked (a ring with 2 x world size chunks in flight) and AllreduceHalvingDoubling
// (recursive halving reduce-scatter + doubling all-gather, Rabenseifner's algorithm, binary
// blocks when the world size is not a power of two). Gloo is an optional dependency of the bench
// only: CMake compiles gloo_baseline.cc when it finds Gloo, gloo_baseline_none.cc otherwise, so
// no #if is needed anywhere in the bench.
//
// Rendezvous: Gloo's FileStore in a fresh directory that rank 0 creates under `store_root` and
// broadcasts over the libmwms communicator, so the ranks must share that file system (one
// machine, or the network-namespace test hosts); each rank's Gloo device binds the address its
// task advertises in the cluster (the TF_CONFIG host), so Gloo's pairs use the same links.
#pragma once

#include <cstddef>
#include <string>

#include "mwms/mwms.h"

namespace mwms::bench::gloo_baseline {

/// True when the bench was built with Gloo.
bool built_with_gloo();
/// Gloo's version ("gloo 0.5.0"); empty without Gloo.
std::string library_version();
/// Empty when Gloo's algorithms can run `dtype`/`op`, otherwise why not.
std::string unsupported_reason(DataType dtype, ReduceOp op);

/// Gloo's algorithms timed beside libmwms.
enum class Algorithm { kRingChunked, kHalvingDoubling };

/// Connects a Gloo full mesh of comm.world_size() ranks (collective: every rank calls it once,
/// after the communicator exists). Blocks up to 60 s for the other ranks.
/// @throws mwms::BackendError naming the directory or Gloo's message when it fails.
void connect(Communicator& comm, const std::string& store_root);
/// Builds both algorithms for an in-place all-reduce of `count` elements of `buffer` (Gloo
/// allocates its scratch here, outside any timing). Collective, like connect().
/// @throws mwms::BackendError when Gloo refuses (count above INT_MAX, Gloo's own errors).
void prepare(void* buffer, std::size_t count, DataType dtype, ReduceOp op);
/// Runs one all-reduce with `algorithm` on what prepare() set up. kMean runs as a sum (Gloo has
/// no mean; the division is a local pass that does not change the comparison).
/// @throws mwms::BackendError with Gloo's message (a peer closed, Gloo's timeout).
void run(Algorithm algorithm);
/// Drops the algorithms and the mesh. Never throws.
void disconnect() noexcept;

}  // namespace mwms::bench::gloo_baseline
