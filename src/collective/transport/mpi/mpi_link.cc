#include "collective/transport/mpi/mpi_link.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::collective {

namespace {

constexpr int kEnvelopeBytes = static_cast<int>(sizeof(FrameHeader));

// Checks an MPI return code; the message is built only on failure (no allocation per piece).
void check(int rc, const char* what, int peer) {
  if (rc != MPI_SUCCESS) bootstrap::throw_if_mpi(rc, what + std::to_string(peer));
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

MpiComm::MpiComm(bootstrap::MpiRuntime& runtime, MPI_Comm comm) : runtime_(runtime), comm_(comm) {}

MpiComm::~MpiComm() {
  // After MPI_Finalize every MPI call is erroneous: the communicator went with MPI itself.
  if (comm_ == MPI_COMM_NULL || bootstrap::MpiRuntime::finalised()) return;
  std::unique_lock<std::mutex> lock = runtime_.serialise();
  int rc = MPI_Comm_free(&comm_);
  if (rc != MPI_SUCCESS) {
    MWMS_LOG_WARN(kNet, "MPI_Comm_free failed: " << bootstrap::mpi_error_text(rc));
  }
}

// No lock: links attach at connect and detach when destroyed, on the one thread that uses the
// communicator (mpi_link.h).
void MpiComm::attach(MpiLink* link) { links_.push_back(link); }

void MpiComm::detach(MpiLink* link) noexcept {
  links_.erase(std::remove(links_.begin(), links_.end(), link), links_.end());
}

bool MpiComm::progress() noexcept {
  std::unique_lock<std::mutex> lock = runtime_.serialise();  // Note [mpi threading]
  bool any = false;
  // The call comes first: every link is tested, even after one has completed something.
  for (MpiLink* l : links_) any = l->progress_nothrow() || any;
  return any;
}

TransportCaps mpi_caps(std::size_t chunk_bytes) {
  TransportCaps c;
  c.name = "mpi";
  c.chunk_bytes = chunk_bytes;
  return c;
}

MpiLink::MpiLink(int peer, int peer_mpi_rank, std::shared_ptr<MpiComm> comm,
                 std::size_t chunk_bytes)
    : peer_(peer), peer_mpi_(peer_mpi_rank), comm_(std::move(comm)), chunk_(chunk_bytes),
      caps_(mpi_caps(chunk_bytes)) {
  // MPI_Testsome skips null requests, so the whole array can be tested whatever is posted.
  for (Direction* d : {&send_, &recv_}) {
    std::fill(std::begin(d->requests), std::end(d->requests), MPI_REQUEST_NULL);
    std::fill(std::begin(d->completed), std::end(d->completed), false);
  }
  comm_->attach(this);
}

MpiLink::~MpiLink() {
  // First: another link's wait() must not test the requests of a link being destroyed.
  comm_->detach(this);
  if (bootstrap::MpiRuntime::finalised()) return;
  std::unique_lock<std::mutex> lock = comm_->runtime().serialise();
  cancel_outstanding(send_, false);
  cancel_outstanding(recv_, true);
}

void MpiLink::cancel_outstanding(Direction& d, bool is_recv) noexcept {
  for (MPI_Request& r : d.requests) {
    if (r == MPI_REQUEST_NULL) continue;
    if (is_recv) {
      // A receive is cancelled locally; waiting for it then returns at once, and MPI no longer
      // writes into the caller's buffer.
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    } else {
      // Cancelling a send is deprecated and may never complete; let MPI finish it on its own.
      MPI_Request_free(&r);
    }
  }
}

std::size_t MpiLink::piece_bytes(const Direction& d, std::size_t i) const noexcept {
  return std::min(chunk_, d.bytes - i * chunk_);
}

void MpiLink::begin(Direction& d, std::size_t bytes) {
  d.bytes = bytes;
  d.pieces = (bytes + chunk_ - 1) / chunk_;
  d.posted = 0;
  d.finished = 0;
  d.envelope_done = false;
  d.active = true;
  d.expect[0] = kEnvelopeBytes;
}

// Tests the first `count` requests of `d` (1: the envelope only); marks what completed and
// checks each receive's size (Note [mpi link messages]).
bool MpiLink::test(Direction& d, bool is_recv, int count) {
  int outcount = 0;
  // Completed requests come back as MPI_REQUEST_NULL, so their slots may be reposted; completed[]
  // remembers them until advance() counts them in order. MPI_ERR_IN_STATUS: the communicator
  // returns errors (MPI_ERRORS_RETURN), each failed request's in its status.
  int rc = MPI_Testsome(count, d.requests, &outcount, d.indices, d.statuses);
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) bootstrap::throw_if_mpi(rc, "MPI_Testsome");
  if (outcount == MPI_UNDEFINED || outcount == 0) return false;  // UNDEFINED: no active request
  const char* what = is_recv ? "MPI_Irecv from rank " : "MPI_Isend to rank ";
  for (int k = 0; k < outcount; ++k) {
    const int i = d.indices[k];
    if (rc == MPI_ERR_IN_STATUS) {
      bootstrap::throw_if_mpi(d.statuses[k].MPI_ERROR, what + std::to_string(peer_));
    }
    if (is_recv) {
      int got = 0;
      MPI_Get_count(&d.statuses[k], MPI_BYTE, &got);
      if (got != d.expect[i]) {
        throw PeerError("rank " + std::to_string(peer_) + " sent an MPI message of " +
                        std::to_string(got) + " bytes where " + std::to_string(d.expect[i]) +
                        " were expected (" + (i == 0 ? "envelope" : "payload piece") +
                        "): MWMS_CHUNK_BYTES or the libmwms version differs between the ranks");
      }
    }
    d.completed[i] = true;
  }
  return true;
}

void MpiLink::advance(Direction& d) noexcept {
  if (d.completed[0]) {
    d.completed[0] = false;
    d.envelope_done = true;
  }
  // Pieces may complete out of order; `finished` counts only the prefix, so what the link reports
  // as arrived is contiguous.
  while (d.finished < d.posted && d.completed[1 + d.finished % kWindow]) {
    d.completed[1 + d.finished % kWindow] = false;
    ++d.finished;
  }
}

bool MpiLink::progress_nothrow() noexcept {
  bool any = false;
  for (Direction* d : {&send_, &recv_}) {
    if (!d->active || d->error) continue;
    // A receive's payload is only tested after the runner saw the envelope (payload_posted).
    const int count = d == &recv_ && d->posted == 0 ? 1 : Direction::kSlots;
    try {
      any = test(*d, d == &recv_, count) || any;
    } catch (...) {  // noexcept: this may run inside another link's wait(); the owner rethrows
      d->error = std::current_exception();
      any = true;
    }
  }
  return any;
}

bool MpiLink::poll_send(SendSlot& slot) {
  if (slot.done) return false;
  std::unique_lock<std::mutex> lock = comm_->runtime().serialise();
  Direction& d = send_;
  if (d.error) std::rethrow_exception(std::exchange(d.error, nullptr));
  bool moved = false;
  if (slot.link_state != &d) {
    begin(d, slot.bytes);
    // The envelope goes at once, before any payload is final: the receiver accepts it (and only
    // then posts its payload receives) while this rank's payload is still being produced.
    check(MPI_Isend(slot.header, kEnvelopeBytes, MPI_BYTE, peer_mpi_,
                    kEnvelopeTag, comm_->comm(), &d.requests[0]),
          "MPI_Isend of an envelope to rank ", peer_);
    slot.link_state = &d;
    slot.header_sent = sizeof(FrameHeader);
    moved = true;
  }
  // kWindow bounds the pieces in flight to the request slots preallocated in the link.
  while (d.posted < d.pieces && d.posted - d.finished < static_cast<std::size_t>(kWindow)) {
    const std::size_t offset = d.posted * chunk_;
    const std::size_t len = piece_bytes(d, d.posted);
    if (offset + len > slot.ready) break;  // gated: the piece is not final yet
    const int i = 1 + static_cast<int>(d.posted % kWindow);
    check(MPI_Isend(slot.data + offset, static_cast<int>(len), MPI_BYTE,
                    peer_mpi_, kPayloadTag, comm_->comm(), &d.requests[i]),
          "MPI_Isend to rank ", peer_);
    ++d.posted;
    slot.sent = offset + len;
    moved = true;
  }
  moved = test(d, false, Direction::kSlots) || moved;
  advance(d);
  if (d.envelope_done && d.finished == d.pieces) {
    slot.done = true;  // every Isend completed: the buffer may be reused
    d.active = false;
    moved = true;
  }
  return moved;
}

bool MpiLink::poll_recv(RecvSlot& slot) {
  if (slot.header_arrived && slot.arrived == slot.bytes) return false;
  std::unique_lock<std::mutex> lock = comm_->runtime().serialise();
  Direction& d = recv_;
  if (d.error) std::rethrow_exception(std::exchange(d.error, nullptr));
  if (slot.link_state != &d) {
    begin(d, slot.bytes);
    check(MPI_Irecv(&slot.header, kEnvelopeBytes, MPI_BYTE, peer_mpi_,
                    kEnvelopeTag, comm_->comm(), &d.requests[0]),
          "MPI_Irecv of an envelope from rank ", peer_);
    slot.link_state = &d;
  }
  if (!slot.header_arrived) {
    // Envelope first, alone: the runner accepts it before any payload receive is posted.
    bool moved = test(d, true, 1);
    advance(d);
    if (!d.envelope_done) return moved;
    slot.header_got = sizeof(FrameHeader);
    slot.header_arrived = true;
    if (d.pieces == 0) d.active = false;  // no payload: progress() has nothing left to test
    return true;
  }
  if (!slot.accepted) return false;  // Note [accept before landing]: no payload receive posted
  bool moved = false;
  const bool staged = !slot.must_land;
  if (staged && staging_.empty()) staging_.resize(kStageSlots * chunk_);  // once per link
  while (d.posted < d.pieces && d.posted - d.finished < static_cast<std::size_t>(kWindow) &&
         // Staged: a slot is reposted only once the runner released all of the piece it holds.
         (!staged || d.posted - slot.consumed / chunk_ < kStageSlots)) {
    const std::size_t offset = d.posted * chunk_;
    const std::size_t len = piece_bytes(d, d.posted);
    const int i = 1 + static_cast<int>(d.posted % kWindow);
    d.expect[i] = static_cast<int>(len);  // the size test() holds the arriving message to
    char* into = staged ? staging_.data() + (d.posted % kStageSlots) * chunk_
                        : slot.landing + offset;
    check(MPI_Irecv(into, static_cast<int>(len), MPI_BYTE,
                    peer_mpi_, kPayloadTag, comm_->comm(), &d.requests[i]),
          "MPI_Irecv from rank ", peer_);
    ++d.posted;
  }
  moved = test(d, true, Direction::kSlots) || moved;
  advance(d);
  const std::size_t arrived = std::min(slot.bytes, d.finished * chunk_);
  if (arrived != slot.arrived) {
    slot.arrived = arrived;
    moved = true;
  }
  if (d.finished == d.pieces) d.active = false;
  return moved;
}

RecvView MpiLink::recv_view(const RecvSlot& slot) {
  if (slot.must_land) return {slot.landing + slot.consumed, slot.arrived - slot.consumed};
  // Note [mpi staging]: up to the end of the staged piece that holds byte `consumed`.
  const std::size_t piece = slot.consumed / chunk_;
  const std::size_t end = std::min(slot.arrived, (piece + 1) * chunk_);
  return {staging_.data() + (piece % kStageSlots) * chunk_ + (slot.consumed - piece * chunk_),
          end > slot.consumed ? end - slot.consumed : 0};
}

// Nothing to hand back here: poll_recv() reposts staging slots from `consumed`.
void MpiLink::recv_release(RecvSlot& slot, std::size_t bytes) { slot.consumed += bytes; }

// Both directions are ignored: progress() tests every request of every link anyway.
void MpiLink::wait(double max_seconds, bool, bool) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (comm_->progress()) return;
    const double waited = seconds_since(start);
    if (waited >= max_seconds) return;
    if (waited < 1e-3) {
      // The peer is probably close behind: stay runnable, but give the core to a rank that
      // shares it (more ranks than cores on this host).
      sched_yield();
    } else {
      // A peer that is late by more than a millisecond: poll at 10 kHz instead of spinning.
      const double nap = std::min(100e-6, max_seconds - waited);
      timespec ts{0, static_cast<long>(nap * 1e9)};
      nanosleep(&ts, nullptr);
    }
  }
}

}  // namespace mwms::collective
