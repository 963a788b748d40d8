// A collective refused with CollectiveMismatchError must leave the caller's buffer bit for bit as
// it was (issue 20, item 2; Note [accept before landing] in src/collective/transport/link.h):
// every transport a host test can reach (shared memory, TCP with one and with three streams) and
// every algorithm (ring, gather, recursive doubling, Rabenseifner), every collective, at sizes
// from one envelope-sized message to several pipeline chunks. The three ranks disagree so that
// their payloads have the same byte count (the case a link cannot tell from the size): 4 x
// float32, 8 x float16 and 4 x int32, or the same call with three ops. Where only some ranks
// disagree, a rank that already reduced an agreeing peer's data may hold partial results
// (docs/errors.md says so); every rank here receives a refused envelope first.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "multiproc/launcher.h"
#include "mwms/mwms.h"

namespace {

using mwms::DataType;
using mwms::ReduceOp;
using mwms::testing::ChildResult;
using mwms::testing::LaunchOptions;
using mwms::testing::run_ranks;

enum class Call { kAllReduceDtype, kAllReduceOp, kBroadcast, kAllGather, kReduceScatter };

struct Case {
  Call call;
  const char* algorithm;  // "" for the selector's choice
  std::size_t bytes;      // per-rank payload of the call (all_gather/reduce_scatter: per block)
};

const char* name_of(Call c) {
  switch (c) {
    case Call::kAllReduceDtype: return "all_reduce (dtype)";
    case Call::kAllReduceOp: return "all_reduce (op)";
    case Call::kBroadcast: return "broadcast";
    case Call::kAllGather: return "all_gather";
    case Call::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

void fill(std::vector<unsigned char>* b, int rank) {
  for (std::size_t i = 0; i < b->size(); ++i) {
    // Float16 and float32 patterns that are finite either way (no NaN payload surprises).
    (*b)[i] = static_cast<unsigned char>(0x21 + (i * 7 + static_cast<std::size_t>(rank) * 13) % 64);
  }
}

// Runs one refused call; returns "" when it was refused and left `buf` (and `out`) untouched,
// otherwise what went wrong. A case whose algorithm does not apply to the call returns "n/a".
std::string run_case(int rank, const std::string& tf_config, const Case& k,
                     mwms::TransportChoice transport) {
  mwms::CommunicatorOptions o;
  o.transport = transport;
  o.timeout_seconds = 10;
  o.connect_timeout_seconds = 30;
  o.algorithm = k.algorithm;
  auto comm = mwms::Communicator::create(mwms::resolve_tf_config(tf_config), o);
  // Every rank disagrees with every other, in the same bytes: float32, float16 (twice the
  // count), int32; or float32 with sum, max, min. So every rank's first envelope is refused.
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kInt32};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  const bool by_op = k.call == Call::kAllReduceOp;
  const DataType dtype = by_op ? DataType::kFloat32 : dtypes[rank];
  const std::size_t count = k.bytes / mwms::dtype_size(dtype);
  const ReduceOp op = by_op ? ops[rank] : ReduceOp::kSum;
  std::vector<unsigned char> buf(k.bytes * 3), out(k.bytes * 3);
  fill(&buf, rank);
  fill(&out, rank + 2);
  const std::vector<unsigned char> buf0 = buf, out0 = out;
  std::string got;
  try {
    switch (k.call) {
      case Call::kAllReduceDtype:
      case Call::kAllReduceOp: comm->all_reduce(buf.data(), count, dtype, op); break;
      case Call::kBroadcast: comm->broadcast(buf.data(), count, dtype, /*root=*/0); break;
      case Call::kAllGather: comm->all_gather(buf.data(), out.data(), count, dtype); break;
      case Call::kReduceScatter:
        comm->reduce_scatter(buf.data(), out.data(), count, dtype, ReduceOp::kSum);
        break;
    }
    // A broadcast's root only sends: like MPI's and NCCL's, it completes without hearing the
    // others (they refuse it; the root's next collective fails with their relayed error).
    if (!(k.call == Call::kBroadcast && rank == 0)) got = "not refused";
  } catch (const mwms::CollectiveMismatchError&) {
  } catch (const mwms::InvalidArgument& e) {
    if (std::string(e.what()).find("does not apply") != std::string::npos) return "n/a";
    got = std::string("InvalidArgument: ") + e.what();
  } catch (const mwms::Error& e) {
    // A peer that saw the mismatch first may abort before this rank reads its envelope: the
    // relayed abort is a PeerError carrying the first rank's text.
    if (std::string(e.what()).find("mismatch") == std::string::npos &&
        std::string(e.what()).find("called") == std::string::npos) {
      got = std::string("other error: ") + e.what();
    }
  }
  std::size_t changed = 0;
  for (std::size_t i = 0; i < buf.size(); ++i) changed += buf[i] != buf0[i];
  std::size_t changed_out = 0;
  for (std::size_t i = 0; i < out.size(); ++i) changed_out += out[i] != out0[i];
  if (changed != 0) got += " buffer: " + std::to_string(changed) + " bytes changed;";
  if (changed_out != 0) got += " output: " + std::to_string(changed_out) + " bytes changed;";
  return got;
}

void check_transport(mwms::TransportChoice transport, const char* streams) {
  std::vector<Case> cases;
  for (const char* algo : {"", "ring", "gather", "rd", "rhd", "flat"}) {
    for (std::size_t bytes : {std::size_t{16}, std::size_t{4096}, std::size_t{1} << 20}) {
      cases.push_back({Call::kAllReduceDtype, algo, bytes});
    }
    cases.push_back({Call::kAllReduceOp, algo, 16});
    cases.push_back({Call::kAllReduceOp, algo, std::size_t{1} << 20});
  }
  for (Call c : {Call::kBroadcast, Call::kAllGather, Call::kReduceScatter}) {
    for (std::size_t bytes : {std::size_t{16}, std::size_t{1} << 20}) cases.push_back({c, "", bytes});
  }
  LaunchOptions opts;
  opts.world_size = 3;  // not a power of two: recursive doubling's and Rabenseifner's folds too
  opts.timeout_seconds = 240;
  if (streams != nullptr) ::setenv("MWMS_NSOCKS_PERPEER", streams, 1);
  auto results = run_ranks(opts, [&](int rank, const std::string& tf_config, auto report) {
    int bad = 0;
    // Repeated: which rank reads the other's envelope first (and how much payload is there by
    // then) varies from run to run.
    for (int round = 0; round < 3; ++round) {
      for (const Case& k : cases) {
        const std::string got = run_case(rank, tf_config, k, transport);
        if (got.empty() || got == "n/a") continue;
        report(std::string(name_of(k.call)) + " [" + (*k.algorithm ? k.algorithm : "auto") + "] " +
               std::to_string(k.bytes) + " B:" + got + "\n");
        ++bad;
      }
    }
    if (bad != 0) throw std::runtime_error(std::to_string(bad) + " refused calls were wrong");
  });
  if (streams != nullptr) ::unsetenv("MWMS_NSOCKS_PERPEER");
  INFO(mwms::testing::describe(results));
  for (const ChildResult& r : results) CHECK(r.exit_code == 0);
}

}  // namespace

TEST_CASE("a refused collective leaves the caller's buffers as they were: shared memory",
          "[shm][fault]") {
  check_transport(mwms::TransportChoice::kShm, nullptr);
}

TEST_CASE("a refused collective leaves the caller's buffers as they were: tcp", "[tcp][fault]") {
  check_transport(mwms::TransportChoice::kTcp, nullptr);
}

TEST_CASE("a refused collective leaves the caller's buffers as they were: tcp, 3 streams",
          "[tcp][fault]") {
  check_transport(mwms::TransportChoice::kTcp, "3");
}
