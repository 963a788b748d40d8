// A threaded world for the algorithm tests (gloo's base_test idea): one thread per rank, each
// with a real PlanRunner over its links of one MemFabric, running plans (or the flat
// all-reduce) as the engine backend does, plus exact inputs and expectations. Inputs are small
// integers (support/values.h), so every reduction is exact whatever the order, and each rank's
// result is compared byte for byte with one expected buffer. Failures are recorded per rank
// (RankState::failure) and checked on the main thread: Catch is not thread-safe.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective/algorithms/algorithms.h"
#include "collective/engine/plan_runner.h"
#include "collective/transport/mem/mem_transport.h"
#include "kernels/reduce.h"
#include "mwms/errors.h"
#include "support/values.h"

namespace mwms::testing {

namespace mc = mwms::collective;

inline void fill_input(std::vector<char>& buf, int rank, std::size_t count, DataType t,
                       ReduceOp op) {
  buf.assign(count * mwms::dtype_size(t), 0);
  for (std::size_t i = 0; i < count; ++i) store(t, buf.data(), i, input_value(rank, i, op));
}

// The reduction over `n` ranks of elements [first, first + count), exact, stored in `t`.
inline void fill_expected(std::vector<char>& buf, int n, std::size_t first, std::size_t count,
                          DataType t, ReduceOp op) {
  buf.assign(count * mwms::dtype_size(t), 0);
  for (std::size_t i = 0; i < count; ++i) {
    double acc = input_value(0, first + i, op);
    for (int r = 1; r < n; ++r) {
      const double v = input_value(r, first + i, op);
      if (op == ReduceOp::kSum || op == ReduceOp::kMean) acc += v;
      if (op == ReduceOp::kMin) acc = std::min(acc, v);
      if (op == ReduceOp::kMax) acc = std::max(acc, v);
      if (op == ReduceOp::kProd) acc *= v;
    }
    store(t, buf.data(), i, acc);
  }
  if (op == ReduceOp::kMean) mwms::kernels::scale_divide(buf.data(), count, t, n);
}

// One rank's side of the threaded world: a runner over its in-memory links, reusable scratch and
// plan storage (as the engine backend keeps them), and the first mismatch it saw.
struct RankState {
  int rank = 0;
  int world_size = 1;
  mc::PlanRunner* runner = nullptr;
  std::vector<char> scratch;
  mc::Plan plan;
  std::uint64_t seq = 0;
  const mc::HostLayout* hosts = nullptr;  // for the hierarchical algorithm
  std::string failure;

  void run(const mc::Algorithm& algo, mc::CollectiveKind kind, DataType t, ReduceOp op,
           std::size_t count, int root, mc::Buffers b) {
    mc::CollectiveCall call{
        kind, t, op, count, root, seq++, rank, world_size, static_cast<std::uint8_t>(algo.id()),
        hosts};
    if (algo.flat()) {  // Note [flat all-reduce]: the engine backend's dispatch
      mwms::ErrorContext ctx;
      ctx.rank = rank;
      ctx.seq = static_cast<std::int64_t>(call.seq);
      runner->run_flat(call, b.recv, /*timeout_seconds=*/60, ctx);
      return;
    }
    const std::size_t need = algo.scratch_bytes(call);
    if (scratch.size() < need) scratch.resize(need);
    algo.plan(call, b, scratch.data(), &plan);
    algo.stage(call, b, scratch.data());
    mwms::ErrorContext ctx;
    ctx.rank = rank;
    ctx.seq = static_cast<std::int64_t>(call.seq);
    runner->run(plan, t, op, world_size, /*timeout_seconds=*/60, ctx);
    algo.finish(call, b, scratch.data());
  }

  void expect(const char* what, const mc::Algorithm& algo, DataType t, ReduceOp op,
              std::size_t count, const char* got, const std::vector<char>& want) {
    if (!failure.empty() || want.empty() || std::memcmp(got, want.data(), want.size()) == 0) {
      return;
    }
    failure = std::string(what) + " " + std::string(algo.name()) + " world " +
              std::to_string(world_size) + " rank " + std::to_string(rank) + " " +
              std::string(mwms::to_string(t)) + " " + std::string(mwms::to_string(op)) + " count " +
              std::to_string(count) + ": result differs from the exact reduction";
  }
};

// Runs body(state) on `n` threads, one per rank, over a MemFabric with rings of `ring_bytes`.
inline void run_world(int n, std::size_t ring_bytes, std::size_t chunk_bytes,
                      const std::function<void(RankState&)>& body) {
  mc::MemFabric fabric(n, ring_bytes);
  std::vector<std::vector<std::unique_ptr<mc::Link>>> links;
  for (int r = 0; r < n; ++r) links.push_back(fabric.links_of(r));
  std::vector<RankState> states(static_cast<std::size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::vector<mc::Link*> raw;
        for (auto& l : links[static_cast<std::size_t>(r)]) raw.push_back(l.get());
        mc::RunnerOptions ro;
        ro.chunk_bytes = chunk_bytes;
        ro.yield_while_spinning = true;  // more threads than cores
        mc::PlanRunner runner(raw, nullptr, ro);
        RankState& st = states[static_cast<std::size_t>(r)];
        st.rank = r;
        st.world_size = n;
        st.runner = &runner;
        body(st);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (const RankState& st : states) {
    INFO(st.failure);
    CHECK(st.failure.empty());
  }
}

}  // namespace mwms::testing
