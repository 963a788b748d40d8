#include "collective/transport/mem/mem_transport.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

struct MemFabric::Pair {
  // make_unique honours ByteRingControl's alignas(64) (C++17 aligned new): head and tail keep
  // cache lines of their own, as in a shared-memory segment.
  ByteRingControl control;
  char* data = nullptr;
  ~Pair() { std::free(data); }
};

MemFabric::MemFabric(int world_size, std::size_t ring_bytes)
    : world_size_(world_size),
      ring_bytes_(ring_bytes),
      bells_(new Doorbell[world_size]),
      flat_(static_cast<char*>(
          std::aligned_alloc(64, kFlatAreaBytes * static_cast<std::size_t>(world_size)))),
      stage_(static_cast<char*>(
          std::aligned_alloc(4096, kFlatStageAreaBytes * static_cast<std::size_t>(world_size)))) {
  // A multiple of 64 is what Note [ring link layout] needs, and what aligned_alloc requires of
  // the size for a 64-byte alignment.
  MWMS_CHECK(ring_bytes % 64 == 0 && ring_bytes >= 128, "ring size must be a multiple of 64");
  pairs_.resize(static_cast<std::size_t>(world_size) * static_cast<std::size_t>(world_size));
  for (auto& p : pairs_) {
    p = std::make_unique<Pair>();
    p->data = static_cast<char*>(std::aligned_alloc(64, ring_bytes));
  }
  // Note [flat slots]: zeroed flat areas; of the staging areas only the heads (tags) need zeros,
  // so the data pages stay untouched until a staged call uses them.
  const std::size_t n = static_cast<std::size_t>(world_size);
  MWMS_CHECK(flat_ != nullptr && stage_ != nullptr, "no memory for the flat areas");
  std::memset(flat_.get(), 0, kFlatAreaBytes * n);
  for (std::size_t set = 0; set < 2 * n; ++set) {
    std::memset(stage_.get() + set * kFlatStageSetBytes, 0, kFlatStageHeadBytes);
  }
}

MemFabric::~MemFabric() = default;

std::vector<std::unique_ptr<Link>> MemFabric::links_of(int rank) {
  std::vector<std::unique_ptr<Link>> links(static_cast<std::size_t>(world_size_));
  TransportCaps caps;
  caps.name = "mem";
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank) continue;
    // Ring (a, b) at a * world + b is written by a and read by b: this rank's `out` is the
    // peer's `in`, so each ring has exactly one producer and one consumer.
    Pair& out = *pairs_[static_cast<std::size_t>(rank * world_size_ + peer)];
    Pair& in = *pairs_[static_cast<std::size_t>(peer * world_size_ + rank)];
    links[static_cast<std::size_t>(peer)] = std::make_unique<RingLink>(
        peer, caps, ByteRing{&out.control, out.data, ring_bytes_},
        ByteRing{&in.control, in.data, ring_bytes_}, &bells_[rank], &bells_[peer],
        FlatSlots{flat_.get() + static_cast<std::size_t>(rank) * kFlatAreaBytes,
                  flat_.get() + static_cast<std::size_t>(peer) * kFlatAreaBytes,
                  stage_.get() + static_cast<std::size_t>(rank) * kFlatStageAreaBytes,
                  stage_.get() + static_cast<std::size_t>(peer) * kFlatStageAreaBytes});
  }
  return links;
}

namespace {

// A link that keeps its fabric alive (the transport that made it is gone after setup), as
// ShmLink keeps its segments.
class MemLink final : public Link {
 public:
  MemLink(std::shared_ptr<MemFabric> fabric, std::unique_ptr<Link> ring)
      : fabric_(std::move(fabric)), ring_(std::move(ring)) {}
  const TransportCaps& caps() const noexcept override { return ring_->caps(); }
  int peer() const noexcept override { return ring_->peer(); }
  bool poll_send(SendSlot& slot) override { return ring_->poll_send(slot); }
  bool poll_recv(RecvSlot& slot) override { return ring_->poll_recv(slot); }
  RecvView recv_view(const RecvSlot& slot) override { return ring_->recv_view(slot); }
  void recv_release(RecvSlot& slot, std::size_t bytes) override {
    ring_->recv_release(slot, bytes);
  }
  void wait(double max_seconds, bool for_send, bool for_recv) override {
    ring_->wait(max_seconds, for_send, for_recv);
  }
  Doorbell* doorbell() const noexcept override { return ring_->doorbell(); }
  bool moved_since_poll(bool for_send, bool for_recv) const noexcept override {
    return ring_->moved_since_poll(for_send, for_recv);
  }
  FlatSlots flat_slots() const noexcept override { return ring_->flat_slots(); }
  bool peek_envelope(FrameHeader* out) const noexcept override { return ring_->peek_envelope(out); }

 private:
  std::shared_ptr<MemFabric> fabric_;  // declared first: destroyed after the ring
  std::unique_ptr<Link> ring_;
};

// The fabric of each communicator being connected, by name; weak, so that it dies with its
// last link. Ranks connect in any order; the first one in creates it.
std::shared_ptr<MemFabric> fabric_named(const std::string& name, int world_size,
                                        std::size_t ring_bytes) {
  // The ranks are threads that connect concurrently: the lookup and the creation are one step.
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<MemFabric>> fabrics;
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = fabrics.begin(); it != fabrics.end();) {  // forget the dead ones
    it = it->second.expired() ? fabrics.erase(it) : std::next(it);
  }
  std::shared_ptr<MemFabric> f = fabrics[name].lock();
  if (!f) {
    f = std::make_shared<MemFabric>(world_size, ring_bytes);
    fabrics[name] = f;
  }
  return f;
}

class MemTransport final : public Transport {
 public:
  explicit MemTransport(const TransportOptions& options)
      : options_(options),
        blob_(std::to_string(::getpid()) + ":" + std::to_string(next_nonce())) {
    caps_.name = "mem";
    caps_.chunk_bytes = options.chunk_bytes;
  }
  const TransportCaps& caps() const noexcept override { return caps_; }
  /// "<pid>:<nonce>".
  std::string local_address() const override { return blob_; }
  std::vector<std::unique_ptr<Link>> connect(const std::vector<int>& peers,
                                             const ConnectContext& ctx) override {
    MWMS_CHECK(ctx.peers != nullptr && static_cast<int>(ctx.peers->size()) == ctx.world_size,
               "mem connect without peer info");
    // Every rank names the fabric after rank 0's blob, so all of them find the same one; its
    // nonce keeps two communicators of one job in one process apart.
    auto first = (*ctx.peers)[0].blobs.find("mem");
    MWMS_CHECK(first != (*ctx.peers)[0].blobs.end(), "rank 0 published no mem address");
    // Rings of 4 chunks, as shared memory's default (a multiple of 64, at least 128).
    const std::size_t ring = std::max<std::size_t>(4 * options_.chunk_bytes / 64 * 64, 128);
    std::shared_ptr<MemFabric> fabric =
        fabric_named(options_.job_fingerprint + "/" + first->second, ctx.world_size, ring);
    std::vector<std::unique_ptr<Link>> all = fabric->links_of(ctx.rank);
    std::vector<std::unique_ptr<Link>> links;
    for (int p : peers) {
      links.push_back(
          std::make_unique<MemLink>(fabric, std::move(all[static_cast<std::size_t>(p)])));
    }
    return links;
  }

 private:
  static long long next_nonce() {
    // Atomic: the rank threads create their transports at the same time.
    static std::atomic<long long> nonce{0};
    return ++nonce;
  }
  TransportOptions options_;
  std::string blob_;
  TransportCaps caps_;
};

std::unique_ptr<Transport> create_mem(const TransportOptions& options) {
  return std::make_unique<MemTransport>(options);
}

// Threads of one process: both blobs name the same pid on the same host.
std::string mem_cannot_connect(const bootstrap::PeerInfo& me, const bootstrap::PeerInfo& peer) {
  auto pid_of = [](const bootstrap::PeerInfo& p) {
    auto it = p.blobs.find("mem");
    return it == p.blobs.end() ? std::string() : it->second.substr(0, it->second.find(':'));
  };
  // The pid alone could coincide on two hosts; with the host it names one process.
  if (pid_of(me).empty() || pid_of(peer).empty() || pid_of(me) != pid_of(peer) ||
      me.host_id != peer.host_id) {
    return "rank " + std::to_string(peer.rank) + " (" + peer.address +
           ") is not a thread of the process of rank " + std::to_string(me.rank);
  }
  return "";
}

}  // namespace

// Its links are shm's rings in heap memory: shm's thresholds would fit, but the selector's
// defaults keep the algorithm tests independent of them. They offer the flat slots (Note [flat
// slots]), which the selector never picks here (flat_max_bytes 0) and MWMS_ALGO=flat may force.
constexpr LinkTuning mem_tuning() {
  LinkTuning t;
  t.flat_slots = true;
  return t;
}
const TransportEntry kMemTransportEntry{
    "mem", 40, false, false, create_mem, mem_cannot_connect, nullptr, mem_tuning()};

}  // namespace mwms::collective
