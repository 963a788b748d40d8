// File descriptors: the process's limit, how many are open, what a job needs per rank, and the
// text of an EMFILE/ENFILE failure (Note [descriptor budget] in descriptors.cc).
#pragma once

#include <string>

namespace mwms::common {

/// RLIMIT_NOFILE's soft limit (`ulimit -n`); -1 when unlimited or unreadable. Never throws.
long descriptor_limit() noexcept;

/// Descriptors this process has open (the entries of /proc/self/fd); -1 when unreadable.
/// Never throws; O(open descriptors).
long open_descriptors() noexcept;

/// How many more descriptors this process may open: limit - open, -1 when either is unknown.
long descriptor_headroom() noexcept;

/// True for EMFILE (this process's limit) and ENFILE (the system's file table).
inline bool descriptors_exhausted(int err) noexcept { return err == 24 || err == 23; }

/// The text of a failure with errno `err`: for EMFILE "out of file descriptors (Too many open
/// files): this process has 24 open of its limit of 24 (ulimit -n); ..." naming how to raise it,
/// for ENFILE the system-wide table (fs.file-max), else strerror(err).
std::string errno_description(int err);

/// What one rank of a job opens beside what it had before the communicator (Note [descriptor
/// budget]): its rendezvous listener, a control link per peer, `streams_per_peer` TCP sockets
/// per TCP peer (and an epoll set per TCP link of several streams), one memfd per shared-memory
/// peer, and a small allowance for descriptors open for a moment (handshakes, /proc reads).
struct DescriptorBudget {
  int world_size = 1;
  int tcp_peers = 0;
  int shm_peers = 0;
  int streams_per_peer = 1;  ///< MWMS_NSOCKS_PERPEER
  static constexpr int kAllowance = 2;

  /// Descriptors needed: 0 for a world of one.
  int total() const noexcept;
  /// "1 listener, 3 control links, 9 TCP streams to 3 peers (MWMS_NSOCKS_PERPEER=3), 3 epoll
  /// sets, 2 for handshakes".
  std::string describe() const;
};

}  // namespace mwms::common
