// The data-movement primitive of the TCP ring (NCCL's "primitives" idea): a rank streams a list
// of transfers to its ring successor while receiving the matching list from its predecessor, on
// non-blocking sockets, chunk by chunk. It knows no dtype or reduction: the algorithm describes
// what to send and where to receive, and is told (on_chunk) when received bytes are complete so it
// can reduce them; it never allocates.
//
// Note [ring gating]: send of transfer t may depend on what transfer g = send_gate received: only
// bytes that the algorithm has finalised (reduced or copied) in g may be sent. This is what lets
// step s+1 start sending while step s is still receiving (receive, reduce and send overlap). A
// recv_gate g says the receive buffer of t is still being sent by transfer g (double-buffered
// scratch), so t's payload must not land before g's send completed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collective/frame.h"
#include "common/socket.h"
#include "mwms/errors.h"

namespace mwms::collective {

struct Transfer {
  bool has_send = false;
  const char* send = nullptr;
  std::size_t send_bytes = 0;
  int send_gate = -1;  // Note [ring gating]
  FrameHeader send_header;

  bool has_recv = false;
  char* recv = nullptr;
  std::size_t recv_bytes = 0;
  int recv_gate = -1;  // Note [ring gating]
  bool recv_in_chunks = false;  // finalise through ChunkSink::on_chunk in chunk_bytes pieces
  FrameHeader expect_header;
};

/// Why a rank aborted; carried in the abort frame so relayed errors keep their class.
enum class AbortCause : std::uint8_t { kPeer = 0, kMismatch = 1, kTimeout = 2 };

class ChunkSink {
 public:
  /// Bytes [begin, end) of transfer t's payload have arrived at Transfer::recv; process them.
  virtual void on_chunk(int t, std::size_t begin, std::size_t end) = 0;

 protected:
  ~ChunkSink() = default;
};

struct RingNeighbours {
  int prev_rank = -1;
  int next_rank = -1;
  std::vector<std::string> addresses;  // by rank, for naming peers in errors
  std::vector<std::string> tasks;      // by rank ("chief 0", "worker 1")
};

class TcpRingChannel {
 public:
  TcpRingChannel(common::Socket data_next, common::Socket data_prev, common::Socket ctrl_next,
                 common::Socket ctrl_prev, RingNeighbours neighbours, std::size_t chunk_bytes,
                 double spin_seconds);

  /// Runs `n` transfers to completion. A wait with no progress for `timeout_seconds` throws
  /// TimeoutError naming the neighbour waited for; a closed or reset link throws PeerError; an
  /// abort from a neighbour throws PeerError naming the rank that failed (and forwards the abort).
  void run(Transfer* transfers, int n, ChunkSink* sink, double timeout_seconds, ErrorContext ctx);

  /// Tells both neighbours that `failed_rank` failed (best effort, never throws, never blocks
  /// more than ~1 s). Each rank forwards an abort once, so it travels around the ring.
  void send_abort(int failed_rank, const std::string& reason,
                  AbortCause cause = AbortCause::kPeer) noexcept;


 private:
  struct State;
  static std::size_t send_limit(const Transfer& t, const State& st);
  bool pump_send(Transfer* ts, int n, State& st, const ErrorContext& ctx);
  bool pump_recv(Transfer* ts, int n, ChunkSink* sink, State& st, const ErrorContext& ctx);
  void wait_for_io(const State& st, double timeout_seconds, const ErrorContext& ctx);
  void check_control(int fd, int from_rank, const ErrorContext& ctx);
  void drain_abort(int fd, int from_rank, const ErrorContext& ctx);
  void send_stall_notice(std::uint64_t seq) noexcept;
  ErrorContext with_peer(ErrorContext ctx, int peer) const;

  common::Socket data_next_, data_prev_, ctrl_next_, ctrl_prev_;
  RingNeighbours nb_;
  std::size_t chunk_bytes_;
  double spin_seconds_;
  bool ctrl_next_open_ = true;
  bool ctrl_prev_open_ = true;
  bool abort_sent_ = false;
  bool want_read_ = false;     // a receive can progress (set before each wait)
  bool want_write_ = false;    // a send can progress
  bool wait_on_prev_ = true;   // whom a timeout names
  // Note [stall blame]: a rank blocked on its predecessor for half the timeout tells its successor
  // whom it waits for; the successor then blames that rank, not its innocent neighbour, so every
  // rank's TimeoutError names the rank that actually stalled.
  int blamed_upstream_ = -1;
  int notice_sent_for_ = -2;
};

}  // namespace mwms::collective
