// Point-to-point messages over the engine's links, for protocols that are not collective plans:
// the parameter-server requests and replies (DESIGN "Parameter servers"; the protocol itself is in
// strategy/ps/ps_protocol.h). The links, the control plane and their deadlines are the ones a
// Communicator runs on; only the driver differs.
//
// Note [message channel]: the PlanRunner moves one send and one receive at a time, in the order a
// plan fixes on every rank. A parameter server cannot know that order: it serves whichever worker
// asks first, and a worker talks to every ps at once. So the channel keeps, per peer, a FIFO of
// outgoing messages and at most one incoming message, and pumps all of them together: no send ever
// waits for another peer's receive, so two ps and two workers exchanging large messages cannot
// deadlock on full link buffers (the cycle ps0 -> worker A -> ps1 -> worker B -> ps0 that a
// blocking send per peer allows). Each message is one FrameHeader and exactly `bytes` of payload
// (Note [link messages]); the receiver names the size it expects before the message arrives (the
// links stripe and pace payloads by it), so a protocol announces variable sizes in an earlier,
// fixed-size message. Nothing is allocated per message: the send queues are fixed rings sized at
// construction.
//
// Note [send slices]: a message queued whole is offered to its link kSendSlice bytes per pump,
// so the link publishes it in pieces and the receiver works on the first piece (a ps applying a
// push, a worker copying values out) while the sender copies the next; a link given the whole
// message copies all it has room for before publishing any of it.
//
// Failures are per peer: a link error, a peer whose control link closed while its data link
// stays silent (it died: shared memory has no EOF) or a peer lost to the heartbeat marks that
// peer failed with the error that names it, and the caller decides whether that is fatal (a ps
// that loses a worker in asynchronous mode keeps serving the others).
#pragma once

#include <cstddef>
#include <exception>
#include <vector>

#include "collective/engine/control_plane.h"
#include "collective/engine/plan_runner.h"
#include "collective/frame.h"
#include "collective/transport/link.h"

namespace mwms::collective {

/// Consumes a receive's payload where the link holds it (Note [receive sink]), instead of a copy
/// into the landing area first: the ps applies a pushed gradient straight from a shared-memory
/// ring. Called from pump(), on the channel's thread.
class RecvSink {
 public:
  virtual ~RecvSink() = default;
  /// The envelope arrived (its payload size already checked), before any payload is consumed.
  /// Throwing an mwms::Error refuses the message: the peer fails with that error.
  virtual void on_envelope(const FrameHeader& header) = 0;
  /// Payload bytes [offset, offset + bytes) of the message, readable at `data` during the call.
  /// `offset` and `bytes` are multiples of unit() except for a message's last bytes. Every
  /// payload byte is delivered exactly once, in order. Throwing an mwms::Error fails the peer.
  virtual void consume(std::size_t offset, const char* data, std::size_t bytes) = 0;
  /// The granularity of consume() (an element's size): a unit split across two views of the
  /// link (a ring's wrap, a partial write) is gathered in the landing area first.
  virtual std::size_t unit() const noexcept { return 1; }
};

class MessageChannel {
 public:
  /// Messages queued per peer at most (queue_send throws InternalError beyond it).
  static constexpr std::size_t kQueueDepth = 256;
  /// Payload bytes a send offers its link per pump (Note [send slices]).
  static constexpr std::size_t kSendSlice = std::size_t{256} << 10;

  /// `links` by rank (nullptr for this rank); `control` may be null (threaded tests). Both
  /// outlive the channel.
  MessageChannel(std::vector<Link*> links, ControlPlane* control, RunnerOptions options);

  int world_size() const noexcept { return static_cast<int>(peers_.size()); }

  /// Queues one message to `peer`: `header` (payload_bytes set to `bytes`), then `bytes` at
  /// `data`, which must stay valid and unchanged until sends_idle(peer). FIFO per peer; never
  /// blocks. Returns the message's ticket (for set_ready). @throws InvalidUsage when `peer`
  /// already failed (its error as the cause).
  std::uint64_t queue_send(int peer, const FrameHeader& header, const void* data,
                           std::size_t bytes);
  /// As queue_send, but only the first `ready` payload bytes may go out until set_ready() allows
  /// more (Note [link messages]: a payload that becomes final bit by bit). The caller must allow
  /// every byte eventually, or sends_idle(peer) stays false.
  std::uint64_t queue_send(int peer, const FrameHeader& header, const void* data,
                           std::size_t bytes, std::size_t ready);
  /// Lets the first `ready` payload bytes of message `ticket` to `peer` go out (never fewer
  /// than before). A no-op for a peer that failed or retired.
  void set_ready(int peer, std::uint64_t ticket, std::size_t ready) noexcept;
  /// Starts the next receive from `peer`: one envelope, then exactly `bytes` of payload into
  /// `landing`. One receive per peer at a time (the previous one must be done).
  void start_recv(int peer, void* landing, std::size_t bytes);
  /// As start_recv, but the payload goes to `sink` (Note [receive sink]), straight from the
  /// link's bytes where the link allows it; `landing` (`bytes` long) is only used for what a link
  /// lands in place (TCP) and to gather units split across views. `sink` outlives the receive.
  void start_recv(int peer, void* landing, std::size_t bytes, RecvSink* sink);
  /// True once the receive started by start_recv(peer) is complete (envelope and payload).
  bool recv_done(int peer) const noexcept;
  /// True while a receive from `peer` is started and not complete.
  bool receiving(int peer) const noexcept;
  /// The envelope of the current (or last completed) receive from `peer`; valid once
  /// header_arrived(peer).
  const FrameHeader& recv_header(int peer) const noexcept;
  bool header_arrived(int peer) const noexcept;
  /// True when nothing queued to `peer` is still being sent.
  bool sends_idle(int peer) const noexcept;

  /// One pass over every peer with work: advances sends and receives. An envelope whose
  /// payload_bytes differs from what the receive expects fails that peer (a protocol violation:
  /// PeerError naming it). Returns true when anything moved. Never blocks, never throws for a
  /// peer's failure (see failed()); throws what the control plane raises (an abort).
  bool pump(const ErrorContext& ctx);
  /// Sleeps until a link or the control plane may have progressed, for at most `max_seconds`
  /// (spins first, as the runner does). Peers whose control link closed while the data link
  /// has nothing more, and peers lost to the heartbeat, are marked failed here. Throws what the
  /// control plane raises (an abort relayed from a peer).
  void wait(double max_seconds, const ErrorContext& ctx);

  /// True once `peer` failed; failure() is its error (PeerError/TimeoutError naming it).
  bool failed(int peer) const noexcept;
  std::exception_ptr failure(int peer) const noexcept;
  /// Marks `peer` failed with `error` (a protocol violation the caller found) and stops
  /// talking to it: its queue is dropped.
  void fail(int peer, std::exception_ptr error) noexcept;
  /// Forgets `peer` without an error (it said goodbye): nothing more is sent to or read from it,
  /// and its closed connections are no failure.
  void retire(int peer) noexcept;
  bool retired(int peer) const noexcept;

  /// The control plane (for names, aborts and the heartbeat's failures), or null.
  ControlPlane* control() const noexcept { return control_; }
  /// `ctx` with the peer's rank, task, address and link transport filled in.
  ErrorContext with_peer(const ErrorContext& ctx, int peer) const;

 private:
  struct Outgoing {
    FrameHeader header;
    const char* data = nullptr;
    std::size_t bytes = 0;
    std::size_t ready = 0;
  };
  struct Peer {
    Link* link = nullptr;
    std::vector<Outgoing> queue;  // ring of kQueueDepth
    std::size_t head = 0;         // next to send
    std::size_t tail = 0;         // next free
    bool sending = false;
    std::size_t allowed = 0;     // payload bytes of the current send allowed out (set_ready)
    SendSlot send;
    bool recv_active = false;
    bool recv_checked = false;
    RecvSlot recv;
    RecvSink* sink = nullptr;    // Note [receive sink]
    std::size_t delivered = 0;   // payload bytes given to `sink`
    bool failed = false;
    bool retired = false;
    std::exception_ptr error;
  };
  bool pump_send(int p, Peer& peer, const ErrorContext& ctx);
  bool pump_recv(int p, Peer& peer, const ErrorContext& ctx);
  void consume(Peer& peer);
  void fail_from_link(int p, const ErrorContext& ctx) noexcept;
  void check_deaths(const ErrorContext& ctx) noexcept;

  std::vector<Peer> peers_;
  ControlPlane* control_;
  RunnerOptions options_;
  std::uint64_t progress_ = 0;
  std::uint64_t progress_seen_ = 0;
  common::Clock::time_point last_progress_;
};

}  // namespace mwms::collective
