// mwms_soak: thousands of random collectives on real processes, every result verified, resident
// memory checked flat (docs/RELIABILITY.md "Soak"; scripts/soak.sh runs the full 10,000).
//
//   mwms_soak --ranks 4 --collectives 500 --max-bytes 1M            # forks 4 ranks (TF_CONFIG)
//   mpirun -np 4 mwms_soak --collectives 500 --transports tcp,shm,auto,mpi
//
// Each rank builds one communicator per transport x algorithm (tcp, shm, auto, and mpi under an
// MPI launcher; auto, ring, gather, rd, rhd), all alive at once, and runs a sequence of
// collectives drawn from one seed (soak_plan.h): all_reduce, reduce_scatter, all_gather,
// broadcast and barrier, every dtype and op, 0 B to --max-bytes (log-uniform), in place or not,
// blocking or asynchronous (up to 3 outstanding), each on a communicator drawn at random. Every
// result is checked element by element against the reference (Note [soak values]) and 64 guard
// bytes after every buffer must stay untouched. Resident memory (/proc/self/statm) is read after
// a warm-up that runs every collective at the largest size on every communicator (so every
// scratch buffer has grown) and at the end: the growth must stay within --rss-growth-kib.
// Exit status: 0 when every rank passed; 1 when a result was wrong, a collective failed or the
// memory grew (the reason on stderr); 2 for a bad command line.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/env.h"
#include "multiproc/launcher.h"
#include "mwms/mwms.h"
#include "soak/soak_plan.h"

namespace {

using mwms::soak::Kind;
using mwms::soak::Step;

constexpr std::size_t kGuardBytes = 64;
constexpr unsigned char kGuard = 0xA5;
constexpr int kAsyncSlots = 3;  // asynchronous collectives outstanding at most
// AddressSanitizer holds freed blocks in a quarantine (256 MiB by default), so private memory
// grows with every free under it: the memory bounds mean nothing there and are not checked.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizedHeap = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitizedHeap = true;
#else
constexpr bool kSanitizedHeap = false;
#endif
#else
constexpr bool kSanitizedHeap = false;
#endif

struct Config {
  int ranks = 4;
  std::uint64_t collectives = 10000;
  std::uint64_t seed = 1;
  std::size_t max_bytes = 4u << 20;
  std::vector<std::string> transports;
  std::vector<std::string> algorithms = {"auto", "ring", "gather", "rd", "rhd"};
  double timeout_seconds = 120;
  long rss_growth_kib = 1024;  // private memory (Note [soak memory])
  std::string json;
  bool progress = false;  // rank 0 prints every 5 % on stderr
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// "4M", "64K", "1000": bytes.
std::size_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  const unsigned long long v = std::stoull(s, &pos);
  const std::string unit = s.substr(pos);
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  throw std::invalid_argument("size " + s + ": use bytes, K or M");
}

bool under_mpi_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

mwms::TransportChoice transport_of(const std::string& name) {
  if (name == "tcp") return mwms::TransportChoice::kTcp;
  if (name == "shm") return mwms::TransportChoice::kShm;
  if (name == "mpi") return mwms::TransportChoice::kMpi;
  if (name == "auto") return mwms::TransportChoice::kAuto;
  throw std::invalid_argument("transport " + name + ": choose tcp, shm, mpi or auto");
}

// Resident memory from /proc/self/statm, in KiB: {resident, shared} (shared: file-backed and
// shared-memory pages, e.g. the shm transport's rings; resident - shared is private memory).
std::pair<long, long> rss_kib() {
  long pages = 0, resident = 0, shared = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld %ld", &pages, &resident, &shared) != 3) resident = shared = 0;
    std::fclose(f);
  }
  const long kib = ::sysconf(_SC_PAGESIZE) / 1024;
  return {resident * kib, shared * kib};
}

// One buffer pair with guard bytes behind each (sized for the largest step once, reused).
struct Slot {
  std::vector<unsigned char> send, recv;
  std::shared_ptr<mwms::Work> work;
  Step step;
  // Value-initialised: every page is touched now, so the soak's own buffers are resident
  // before the warm-up ends and cannot pass for growth of the library's memory.
  explicit Slot(std::size_t bytes) : send(bytes + kGuardBytes), recv(bytes + kGuardBytes) {}
};

struct Comm {
  std::string name;  // "tcp/ring"
  std::unique_ptr<mwms::Communicator> c;
};

// Per-rank counters, exchanged at the end so that rank 0 can print the whole job.
struct Stats {
  std::int64_t steps = 0, async_steps = 0, elements = 0, bytes = 0;
  std::int64_t per_kind[5] = {};
  std::int64_t per_dtype[6] = {};
  std::int64_t per_op[5] = {};
  // Resident KiB after the warm-up, at the end and the largest sample, split into private
  // (resident - shared: heap, stacks) and shared (the shm rings, MPI's segments): see
  // Note [soak memory].
  std::int64_t private_warm = 0, private_end = 0, private_max = 0;
  std::int64_t shared_warm = 0, shared_end = 0, shared_max = 0;
  std::int64_t warmup_ms = 0, run_ms = 0;
};

class Runner {
 public:
  Runner(const Config& cfg, int rank, int n, std::vector<Comm> comms)
      : cfg_(cfg), rank_(rank), n_(n), comms_(std::move(comms)) {
    for (int i = 0; i <= kAsyncSlots; ++i) slots_.emplace_back(cfg.max_bytes);
  }

  void run(const std::function<void(const std::string&)>& report) {
    const auto t0 = std::chrono::steady_clock::now();
    warm_up();
    const auto t1 = std::chrono::steady_clock::now();
    if (cfg_.progress && rank_ == 0) {
      std::cerr << "soak: warm-up done in " << std::chrono::duration<double>(t1 - t0).count()
                << " s" << std::endl;
    }
    sample(true);
    mwms::soak::PlanOptions po;
    po.seed = cfg_.seed;
    po.world_size = n_;
    po.num_comms = static_cast<int>(comms_.size());
    po.max_bytes = cfg_.max_bytes;
    mwms::soak::Rng rng(cfg_.seed);
    for (std::uint64_t i = 0; i < cfg_.collectives; ++i) {
      const Step s = mwms::soak::draw_step(po, i, &rng);
      count(s);
      if (s.async) {
        start(free_slot(), s);
      } else {
        start(slots_[0], s);
        finish(slots_[0]);
      }
      if ((i + 1) % std::max<std::uint64_t>(1, cfg_.collectives / 20) == 0) {
        sample(false);
        if (cfg_.progress && rank_ == 0) {
          std::cerr << "soak: " << (i + 1) * 100 / cfg_.collectives << " % (" << i + 1
                    << " collectives, "
                    << std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count()
                    << " s)" << std::endl;
        }
      }
    }
    for (int k = 1; k <= kAsyncSlots; ++k) finish(slots_[static_cast<std::size_t>(k)]);
    sample(false);
    stats_.private_end = curve_.back().first;
    stats_.shared_end = curve_.back().second;
    const auto t2 = std::chrono::steady_clock::now();
    stats_.warmup_ms = std::chrono::duration_cast<std::chrono::milliseconds>(t1 - t0).count();
    stats_.run_ms = std::chrono::duration_cast<std::chrono::milliseconds>(t2 - t1).count();
    summarize(report);
    for (Comm& c : comms_) c.c->finalize();
  }

 private:
  // Every collective at the largest size on every communicator, blocking and asynchronous, so
  // that scratch buffers, plans and staging have grown before memory is first measured: the
  // all-reduce in a 4-, a 2- and an 8-byte type (16-bit types are staged in float32), the other
  // collectives once, and an asynchronous all-reduce and broadcast (the progress thread).
  void warm_up() {
    std::uint64_t index = mwms::soak::kWarmUpFirstIndex;
    const struct {
      Kind kind;
      mwms::DataType dtype;
      bool async;
    } calls[] = {{Kind::kAllReduce, mwms::DataType::kFloat32, false},
                 {Kind::kAllReduce, mwms::DataType::kBFloat16, false},
                 {Kind::kAllReduce, mwms::DataType::kInt64, false},
                 {Kind::kReduceScatter, mwms::DataType::kFloat16, false},
                 {Kind::kAllGather, mwms::DataType::kFloat32, false},
                 {Kind::kBroadcast, mwms::DataType::kFloat64, false},
                 {Kind::kBarrier, mwms::DataType::kFloat32, false},
                 {Kind::kAllReduce, mwms::DataType::kFloat16, true},
                 {Kind::kBroadcast, mwms::DataType::kInt32, true}};
    for (std::size_t c = 0; c < comms_.size(); ++c) {
      for (const auto& call : calls) {
        Step s;
        s.index = index++;
        s.kind = call.kind;
        s.dtype = call.dtype;
        s.op = mwms::ReduceOp::kMean;
        s.comm = static_cast<int>(c);
        s.async = call.async;
        const std::size_t elements = cfg_.max_bytes / mwms::dtype_size(s.dtype);
        s.count = s.kind == Kind::kBarrier ? 0
                  : s.kind == Kind::kReduceScatter || s.kind == Kind::kAllGather
                      ? elements / static_cast<std::size_t>(n_)
                      : elements;
        Slot& slot = slots_[call.async ? 1 : 0];
        start(slot, s);
        finish(slot);
      }
    }
    stats_.elements = 0;
  }

  // Reads resident memory (Note [soak memory]); `first`: the baseline after the warm-up.
  void sample(bool first) {
    const auto [resident, shared] = rss_kib();
    const long priv = resident - shared;
    if (first) {
      stats_.private_warm = stats_.private_max = priv;
      stats_.shared_warm = stats_.shared_max = shared;
      return;
    }
    stats_.private_max = std::max<std::int64_t>(stats_.private_max, priv);
    stats_.shared_max = std::max<std::int64_t>(stats_.shared_max, shared);
    curve_.emplace_back(priv, shared);
  }

  void count(const Step& s) {
    ++stats_.steps;
    stats_.async_steps += s.async ? 1 : 0;
    ++stats_.per_kind[static_cast<int>(s.kind)];
    if (s.kind != Kind::kBarrier) ++stats_.per_dtype[static_cast<int>(s.dtype)];
    if (s.kind == Kind::kAllReduce || s.kind == Kind::kReduceScatter) {
      ++stats_.per_op[static_cast<int>(s.op)];
    }
    const auto counts = mwms::soak::buffer_counts(s, n_);
    stats_.bytes += static_cast<std::int64_t>(std::max(counts.first, counts.second) *
                                              mwms::dtype_size(s.dtype));
  }

  // An asynchronous slot, waiting for (and checking) the oldest outstanding one when all are busy.
  Slot& free_slot() {
    for (int k = 1; k <= kAsyncSlots; ++k) {
      if (!slots_[static_cast<std::size_t>(k)].work) return slots_[static_cast<std::size_t>(k)];
    }
    Slot* oldest = &slots_[1];
    for (int k = 2; k <= kAsyncSlots; ++k) {
      if (slots_[static_cast<std::size_t>(k)].step.index < oldest->step.index) {
        oldest = &slots_[static_cast<std::size_t>(k)];
      }
    }
    finish(*oldest);
    return *oldest;
  }

  // Where the input goes and where the result is read, with the in-place aliasing of the step.
  std::pair<unsigned char*, unsigned char*> pointers(Slot& slot, const Step& s) const {
    const std::size_t block = s.count * mwms::dtype_size(s.dtype) * static_cast<std::size_t>(rank_);
    if (s.kind == Kind::kAllReduce || s.kind == Kind::kBroadcast) {
      return {slot.recv.data(), slot.recv.data()};
    }
    if (s.in_place && s.kind == Kind::kReduceScatter) {
      return {slot.send.data(), slot.send.data() + block};
    }
    if (s.in_place && s.kind == Kind::kAllGather)
      return {slot.recv.data() + block, slot.recv.data()};
    return {slot.send.data(), slot.recv.data()};
  }

  // The allocations a step uses and how many elements of each: the guard bytes follow them.
  std::vector<std::pair<unsigned char*, std::size_t>> guarded(Slot& slot, const Step& s) const {
    const auto counts = mwms::soak::buffer_counts(s, n_);
    switch (s.kind) {
      case Kind::kAllReduce:
      case Kind::kBroadcast:
        return {{slot.recv.data(), counts.second}};
      case Kind::kReduceScatter:
        if (s.in_place) return {{slot.send.data(), counts.first}};
        break;
      case Kind::kAllGather:
        if (s.in_place) return {{slot.recv.data(), counts.second}};
        break;
      case Kind::kBarrier:
        break;
    }
    return {{slot.send.data(), counts.first}, {slot.recv.data(), counts.second}};
  }

  void start(Slot& slot, const Step& s) {
    slot.step = s;
    const auto [in, out] = pointers(slot, s);
    const std::size_t esize = mwms::dtype_size(s.dtype);
    mwms::soak::fill_input(s, cfg_.seed, n_, rank_, in);
    for (auto [base, used] : guarded(slot, s))
      std::memset(base + used * esize, kGuard, kGuardBytes);
    mwms::Communicator& c = *comms_[static_cast<std::size_t>(s.comm)].c;
    const std::size_t n = s.count;
    const bool a = s.async;
    switch (s.kind) {
      case Kind::kAllReduce:
        if (a)
          slot.work = c.all_reduce_async(out, n, s.dtype, s.op);
        else
          c.all_reduce(out, n, s.dtype, s.op);
        break;
      case Kind::kReduceScatter:
        if (a)
          slot.work = c.reduce_scatter_async(in, out, n, s.dtype, s.op);
        else
          c.reduce_scatter(in, out, n, s.dtype, s.op);
        break;
      case Kind::kAllGather:
        if (a)
          slot.work = c.all_gather_async(in, out, n, s.dtype);
        else
          c.all_gather(in, out, n, s.dtype);
        break;
      case Kind::kBroadcast:
        if (a)
          slot.work = c.broadcast_async(out, n, s.dtype, s.root);
        else
          c.broadcast(out, n, s.dtype, s.root);
        break;
      case Kind::kBarrier:
        if (a)
          slot.work = c.barrier_async();
        else
          c.barrier();
        break;
    }
  }

  // Waits for the slot's collective (when asynchronous) and checks its result and guard bytes.
  void finish(Slot& slot) {
    if (slot.step.async) {
      if (!slot.work) return;
      slot.work->wait();
      slot.work.reset();
    }
    const Step& s = slot.step;
    const std::string& where = comms_[static_cast<std::size_t>(s.comm)].name;
    const std::size_t esize = mwms::dtype_size(s.dtype);
    stats_.elements += static_cast<std::int64_t>(
        mwms::soak::verify(s, cfg_.seed, n_, rank_, pointers(slot, s).second, where));
    for (auto [base, used] : guarded(slot, s)) {
      for (std::size_t g = 0; g < kGuardBytes; ++g) {
        if (base[used * esize + g] != kGuard) {
          throw std::runtime_error("soak step " + std::to_string(s.index) + " (" + where +
                                   "): " + mwms::soak::kind_name(s.kind) +
                                   " wrote past its buffer (" + std::to_string(used) +
                                   " elements, guard byte " + std::to_string(g) + ")");
        }
      }
    }
  }

  // All ranks' counters to rank 0 (over the first communicator), which reports the job; then
  // every rank checks its own memory against the bounds (Note [soak memory]).
  void summarize(const std::function<void(const std::string&)>& report) {
    constexpr std::size_t kWords = sizeof(Stats) / sizeof(std::int64_t);
    std::vector<std::int64_t> all(kWords * static_cast<std::size_t>(n_));
    comms_[0].c->all_gather(&stats_, all.data(), kWords, mwms::DataType::kInt64);
    Stats worst;  // the largest of each figure over the ranks
    std::int64_t private_growth = 0, shared_growth = 0;
    for (int r = 0; r < n_; ++r) {
      Stats s;
      std::memcpy(static_cast<void*>(&s), all.data() + kWords * static_cast<std::size_t>(r),
                  sizeof s);
      private_growth = std::max(private_growth, s.private_max - s.private_warm);
      shared_growth = std::max(shared_growth, s.shared_max - s.shared_warm);
      worst.private_warm = std::max(worst.private_warm, s.private_warm);
      worst.private_end = std::max(worst.private_end, s.private_end);
      worst.shared_warm = std::max(worst.shared_warm, s.shared_warm);
      worst.shared_end = std::max(worst.shared_end, s.shared_end);
    }
    std::ostringstream line;
    line << "rank " << rank_ << ": private " << stats_.private_warm << " -> " << stats_.private_end
         << " KiB, shared " << stats_.shared_warm << " -> " << stats_.shared_end
         << " KiB; growth every 5 % (private/shared):";
    for (const auto& [p, sh] : curve_) {
      line << " " << p - stats_.private_warm << "/" << sh - stats_.shared_warm;
    }
    report(line.str());
    if (rank_ == 0) report(job_summary(worst, private_growth, shared_growth));
    const long growth = static_cast<long>(stats_.private_max - stats_.private_warm);
    const long sgrowth = static_cast<long>(stats_.shared_max - stats_.shared_warm);
    if (kSanitizedHeap) {
      if (rank_ == 0) report("soak: memory not checked: AddressSanitizer keeps freed memory");
      return;
    }
    if (growth > cfg_.rss_growth_kib || sgrowth > shared_bound_kib()) {
      throw std::runtime_error(
          "rank " + std::to_string(rank_) + ": resident memory grew after the warm-up: private " +
          std::to_string(growth) + " KiB (bound " + std::to_string(cfg_.rss_growth_kib) +
          " KiB, from " + std::to_string(stats_.private_warm) + " KiB), shared " +
          std::to_string(sgrowth) + " KiB (bound " + std::to_string(shared_bound_kib()) + " KiB)");
    }
  }

  // Note [soak memory]: private memory (resident - shared in /proc/self/statm: heap, stacks)
  // must stay flat after the warm-up, within --rss-growth-kib. Shared pages are the shm
  // transport's rings (and Open MPI's own segments), mapped at setup and first touched only when
  // a write position reaches them, so they may grow until every ring has wrapped once, but never
  // beyond the capacity mapped: per communicator that can use shared memory (shm, auto, and mpi
  // for Open MPI's segments, counted like rings) an inbound and an outbound ring per peer, each
  // with a control page, plus 1 MiB for pages of the program's own files. More than that would
  // mean memory mapped per collective.
  long shared_bound_kib() const {
    long long ring = mwms::common::env_int("MWMS_SHM_RING_BYTES");
    if (ring <= 0) ring = 4 * mwms::common::env_int("MWMS_CHUNK_BYTES");
    ring = (ring + 4095) / 4096 * 4096 + 4096;
    long comms = 0;
    for (const Comm& c : comms_) comms += c.name.rfind("tcp/", 0) == 0 ? 0 : 1;
    return static_cast<long>(comms * 2 * (n_ - 1) * ring / 1024) + 1024;
  }

  std::string job_summary(const Stats& worst, std::int64_t private_growth,
                          std::int64_t shared_growth) const {
    std::ostringstream o;
    const double secs = static_cast<double>(stats_.run_ms) / 1000.0;
    o << "soak: " << n_ << " ranks, " << stats_.steps << " collectives (" << stats_.async_steps
      << " async) on " << comms_.size() << " communicators, every result verified ("
      << stats_.elements << " elements on rank 0, " << stats_.bytes / (1 << 20)
      << " MiB of buffers), " << secs << " s ("
      << static_cast<double>(stats_.steps) / std::max(secs, 1e-9) << " collectives/s), warm-up "
      << static_cast<double>(stats_.warmup_ms) / 1000.0 << " s\n";
    o << "soak: kinds";
    for (int k = 0; k < 5; ++k) {
      o << " " << mwms::soak::kind_name(static_cast<Kind>(k)) << " " << stats_.per_kind[k];
    }
    o << "; dtypes";
    for (int t = 0; t < 6; ++t) {
      o << " " << mwms::to_string(static_cast<mwms::DataType>(t)) << " " << stats_.per_dtype[t];
    }
    o << "; ops";
    for (int p = 0; p < 5; ++p) {
      o << " " << mwms::to_string(static_cast<mwms::ReduceOp>(p)) << " " << stats_.per_op[p];
    }
    o << "\nsoak: communicators";
    for (const Comm& c : comms_) o << " " << c.name;
    o << "\nsoak: memory (largest rank) private " << worst.private_warm << " KiB after warm-up, "
      << worst.private_end << " KiB at the end, largest growth " << private_growth << " KiB (bound "
      << cfg_.rss_growth_kib << " KiB); shared " << worst.shared_warm << " -> " << worst.shared_end
      << " KiB, largest growth " << shared_growth << " KiB (bound " << shared_bound_kib()
      << " KiB)";
    if (!cfg_.json.empty()) {
      std::ofstream j(cfg_.json);
      j << "{\"ranks\":" << n_ << ",\"collectives\":" << stats_.steps
        << ",\"async\":" << stats_.async_steps << ",\"communicators\":" << comms_.size()
        << ",\"seed\":" << cfg_.seed << ",\"max_bytes\":" << cfg_.max_bytes
        << ",\"elements_verified_rank0\":" << stats_.elements << ",\"mismatches\":0"
        << ",\"run_seconds\":" << secs << ",\"private_warm_kib\":" << worst.private_warm
        << ",\"private_end_kib\":" << worst.private_end
        << ",\"private_growth_max_kib\":" << private_growth
        << ",\"private_growth_bound_kib\":" << cfg_.rss_growth_kib
        << ",\"shared_warm_kib\":" << worst.shared_warm
        << ",\"shared_end_kib\":" << worst.shared_end
        << ",\"shared_growth_max_kib\":" << shared_growth
        << ",\"shared_growth_bound_kib\":" << shared_bound_kib() << "}\n";
    }
    return o.str();
  }

  const Config& cfg_;
  int rank_, n_;
  std::vector<Comm> comms_;
  std::vector<Slot> slots_;  // [0] blocking, [1..kAsyncSlots] asynchronous
  Stats stats_;
  std::vector<std::pair<long, long>> curve_;  // {private, shared} KiB every 5 % of the run
};

// One rank: its communicators (cluster_of(k) gives communicator k's cluster), then the run.
void run_rank(const Config& cfg, const std::function<mwms::ResolvedCluster(int)>& cluster_of,
              const std::function<void(const std::string&)>& report) {
  std::vector<Comm> comms;
  for (const std::string& t : cfg.transports) {
    for (const std::string& a : cfg.algorithms) {
      mwms::CommunicatorOptions o;
      o.transport = transport_of(t);
      o.algorithm = a;
      o.timeout_seconds = cfg.timeout_seconds;
      o.connect_timeout_seconds = 60;
      comms.push_back(
          {t + "/" + a, mwms::Communicator::create(cluster_of(static_cast<int>(comms.size())), o)});
    }
  }
  const int rank = comms[0].c->rank(), n = comms[0].c->world_size();
  Runner(cfg, rank, n, std::move(comms)).run(report);
}

int usage(const std::string& why) {
  std::cerr << "mwms_soak: " << why << "\n"
            << "usage: mwms_soak [--ranks N] [--collectives N] [--seed S] [--max-bytes B[K|M]]\n"
            << "  [--transports tcp,shm,auto[,mpi]] [--algorithms auto,ring,gather,rd,rhd]\n"
            << "  [--timeout SECONDS] [--rss-growth-kib K] [--json FILE] [--progress]\n"
            << "Forks --ranks processes; under mpirun each process is one rank.\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  const bool mpi = under_mpi_launcher();
  cfg.transports = mpi ? std::vector<std::string>{"tcp", "shm", "auto", "mpi"}
                       : std::vector<std::string>{"tcp", "shm", "auto"};
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") return usage("runs random verified collectives"), 0;
      if (a == "--progress") {
        cfg.progress = true;
        continue;
      }
      if (i + 1 >= argc) return usage("missing value after " + a);
      const std::string v = argv[++i];
      if (a == "--ranks")
        cfg.ranks = std::stoi(v);
      else if (a == "--collectives")
        cfg.collectives = std::stoull(v);
      else if (a == "--seed")
        cfg.seed = std::stoull(v);
      else if (a == "--max-bytes")
        cfg.max_bytes = parse_bytes(v);
      else if (a == "--transports")
        cfg.transports = split(v);
      else if (a == "--algorithms")
        cfg.algorithms = split(v);
      else if (a == "--timeout")
        cfg.timeout_seconds = std::stod(v);
      else if (a == "--rss-growth-kib")
        cfg.rss_growth_kib = std::stol(v);
      else if (a == "--json")
        cfg.json = v;
      else
        return usage("unknown option " + a);
    }
    for (const std::string& t : cfg.transports) transport_of(t);
  } catch (const std::exception& e) {
    return usage(e.what());
  }
  if (cfg.ranks < 1 || cfg.transports.empty() || cfg.algorithms.empty() || cfg.max_bytes < 64) {
    return usage("need --ranks >= 1, a transport, an algorithm and --max-bytes >= 64");
  }
  const bool wants_mpi =
      std::find(cfg.transports.begin(), cfg.transports.end(), "mpi") != cfg.transports.end();
  if (wants_mpi && !mpi) return usage("transport mpi needs an MPI launcher (mpirun -np N ...)");

  if (mpi) {  // this process is one rank; every communicator bootstraps through MPI
    try {
      run_rank(
          cfg, [](int) { return mwms::resolve_from_environment(); },
          [](const std::string& line) { std::cout << line << std::endl; });
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "mwms_soak: " << e.what() << std::endl;
      return 1;
    }
  }

  // Forked ranks: one loopback cluster (or one on the test hosts of MWMSTEST_HOSTS) per
  // communicator, all ports chosen by run_ranks before the fork (LaunchOptions::extra_ports).
  const int n = cfg.ranks;
  const int num_comms = static_cast<int>(cfg.transports.size() * cfg.algorithms.size());
  const auto& hosts = mwms::testing::test_hosts();
  mwms::testing::LaunchOptions lo;
  lo.world_size = n;
  lo.extra_ports = n * num_comms;  // fresh on every attempt of run_ranks
  lo.timeout_seconds = 600 + static_cast<double>(cfg.collectives) * 0.5;
  const auto started = std::chrono::steady_clock::now();
  const auto results = mwms::testing::run_ranks(lo, [&](int rank, const std::string&, auto report) {
    run_rank(
        cfg,
        [&](int k) {
          std::vector<std::string> addresses;
          for (int r = 0; r < n; ++r) {
            const std::string host = hosts.empty()
                                         ? std::string("localhost")
                                         : hosts[static_cast<std::size_t>(mwms::testing::host_of(
                                                     r, n, static_cast<int>(hosts.size())))]
                                               .address;
            addresses.push_back(host + ":" +
                                std::to_string(mwms::testing::extra_ports()[static_cast<std::size_t>(k * n + r)]));
          }
          return mwms::resolve_tf_config(mwms::testing::make_tf_config(addresses, rank, false));
        },
        report);
  });
  bool ok = true;
  for (const auto& r : results) ok = ok && r.exit_code == 0 && r.signal == 0 && !r.timed_out;
  std::cout << mwms::testing::describe(results);
  std::cout << "soak: " << (ok ? "PASSED" : "FAILED") << " in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
            << " s" << std::endl;
  return ok ? 0 : 1;
}
