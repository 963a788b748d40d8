// mwms_kill_worker: one rank of scripts/kill_test.sh (docs/RELIABILITY.md "Peer death").
// Resolves its rank from the environment (TF_CONFIG, or mpirun's), builds one communicator over
// --transport and runs random verified collectives (soak_plan.h) until --collectives (0: until it
// fails). It prints one line per event, on stdout, for the script to parse:
//
//   READY rank R pid P transport T
//   FAILED rank R pid P class C peer K seq S t_ns T elapsed_ms E after N collectives: what()
//   WRONG rank R pid P t_ns T: the mismatch       (a result that differs from the reference)
//   DONE rank R pid P collectives N
//
// t_ns is CLOCK_REALTIME when the error reached the caller (the script compares it with the
// moment it sent the signal); peer is ErrorContext::peer_rank, the rank the error blames (-1 when
// none). Exit status: 0 DONE, 3 FAILED, 4 WRONG, 2 bad command line.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "mwms/mwms.h"
#include "soak/soak_plan.h"

namespace {

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

const char* class_of(const mwms::Error& e) {
  if (dynamic_cast<const mwms::TimeoutError*>(&e) != nullptr) return "TimeoutError";
  if (dynamic_cast<const mwms::PeerError*>(&e) != nullptr) return "PeerError";
  if (dynamic_cast<const mwms::CollectiveMismatchError*>(&e) != nullptr) {
    return "CollectiveMismatchError";
  }
  if (dynamic_cast<const mwms::InvalidUsage*>(&e) != nullptr) return "InvalidUsage";
  if (dynamic_cast<const mwms::BootstrapError*>(&e) != nullptr) return "BootstrapError";
  if (dynamic_cast<const mwms::BackendError*>(&e) != nullptr) return "BackendError";
  if (dynamic_cast<const mwms::InternalError*>(&e) != nullptr) return "InternalError";
  if (dynamic_cast<const mwms::InvalidArgument*>(&e) != nullptr) return "InvalidArgument";
  return "Error";
}

mwms::TransportChoice transport_of(const std::string& name) {
  if (name == "tcp") return mwms::TransportChoice::kTcp;
  if (name == "shm") return mwms::TransportChoice::kShm;
  if (name == "mpi") return mwms::TransportChoice::kMpi;
  return mwms::TransportChoice::kAuto;
}

}  // namespace

int main(int argc, char** argv) {
  std::string transport = "tcp";
  std::string algorithm = "auto";
  double timeout = 5;
  std::uint64_t collectives = 0, seed = 1;
  std::size_t max_bytes = 256u << 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--transport")
      transport = v;
    else if (a == "--algorithm")
      algorithm = v;
    else if (a == "--timeout")
      timeout = std::stod(v);
    else if (a == "--collectives")
      collectives = std::stoull(v);
    else if (a == "--seed")
      seed = std::stoull(v);
    else if (a == "--max-bytes")
      max_bytes = std::stoull(v);
    else {
      std::cerr << "usage: mwms_kill_worker [--transport tcp|shm|mpi|auto] [--algorithm A] "
                   "[--timeout S] [--collectives N] [--seed S] [--max-bytes B]\n";
      return 2;
    }
  }
  const long pid = static_cast<long>(::getpid());
  int rank = -1;
  std::uint64_t done = 0;
  const auto started = std::chrono::steady_clock::now();
  std::unique_ptr<mwms::Communicator> comm;  // outlives the catch: t_ns is taken before teardown
  try {
    mwms::CommunicatorOptions o;
    o.transport = transport_of(transport);
    o.algorithm = algorithm;
    o.timeout_seconds = timeout;
    o.connect_timeout_seconds = 30;
    comm = mwms::Communicator::create(mwms::resolve_from_environment(), o);
    rank = comm->rank();
    const int n = comm->world_size();
    std::printf("READY rank %d pid %ld transport %s\n", rank, pid, transport.c_str());
    std::fflush(stdout);
    mwms::soak::PlanOptions po;
    po.seed = seed;
    po.world_size = n;
    po.max_bytes = max_bytes;
    po.async_fraction = 0;
    mwms::soak::Rng rng(seed);
    std::vector<unsigned char> send(max_bytes + 64), recv(max_bytes + 64);
    for (; collectives == 0 || done < collectives; ++done) {
      const mwms::soak::Step s = mwms::soak::draw_step(po, done, &rng);
      unsigned char* in =
          s.kind == mwms::soak::Kind::kAllReduce || s.kind == mwms::soak::Kind::kBroadcast
              ? recv.data()
              : send.data();
      mwms::soak::fill_input(s, seed, n, rank, in);
      switch (s.kind) {
        case mwms::soak::Kind::kAllReduce:
          comm->all_reduce(recv.data(), s.count, s.dtype, s.op);
          break;
        case mwms::soak::Kind::kReduceScatter:
          comm->reduce_scatter(send.data(), recv.data(), s.count, s.dtype, s.op);
          break;
        case mwms::soak::Kind::kAllGather:
          comm->all_gather(send.data(), recv.data(), s.count, s.dtype);
          break;
        case mwms::soak::Kind::kBroadcast:
          comm->broadcast(recv.data(), s.count, s.dtype, s.root);
          break;
        case mwms::soak::Kind::kBarrier:
          comm->barrier();
          break;
      }
      try {
        mwms::soak::verify(s, seed, n, rank, recv.data(), transport);
      } catch (const std::runtime_error& e) {
        std::printf("WRONG rank %d pid %ld t_ns %lld: %s\n", rank, pid,
                    static_cast<long long>(now_ns()), e.what());
        std::fflush(stdout);
        return 4;
      }
    }
    comm->finalize();
    std::printf("DONE rank %d pid %ld collectives %llu\n", rank, pid,
                static_cast<unsigned long long>(done));
    return 0;
  } catch (const mwms::Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - started)
                        .count();
    std::printf(
        "FAILED rank %d pid %ld class %s peer %d seq %lld t_ns %lld elapsed_ms %lld "
        "after %llu collectives: %s\n",
        rank, pid, class_of(e), e.context().peer_rank, static_cast<long long>(e.context().seq),
        static_cast<long long>(now_ns()), static_cast<long long>(ms),
        static_cast<unsigned long long>(done), e.what());
    std::fflush(stdout);
    return 3;
  }
}
