// Small POSIX TCP utilities shared by the bootstrap (rendezvous) and the TCP transport: an RAII
// descriptor, listen/connect/accept with deadlines, and blocking-with-deadline reads and writes.
// They return a status instead of throwing so that each caller can raise the error that names
// the task, rank and address involved (STYLE item 13).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace mwms::common {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

/// Seconds from now to `d` (negative when passed).
double seconds_left(Deadline d);
/// A deadline `seconds` from now.
Deadline deadline_after(double seconds);

/// Move-only owner of a file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close() noexcept;

 private:
  int fd_ = -1;
};

enum class IoStatus { kOk, kTimeout, kClosed, kError };

struct IoResult {
  IoStatus status = IoStatus::kOk;
  int error = 0;              // errno for kError
  std::string describe() const;  // "timed out", "connection closed by peer", strerror text
};

/// Listens on all interfaces (dual-stack IPv6 when available, else IPv4) at `port` (0 picks a free
/// one). On failure returns an invalid Socket and sets *error to errno.
Socket listen_tcp(int port, int* error);
/// Port a listening socket is bound to.
int local_port(const Socket& listener);

/// Note [inherited listener]: what is wrong with descriptor `fd`, handed to this process by its
/// launcher (MWMS_LISTEN_FD), as the listener of a task whose address is `host`:`port`; empty
/// when it is an open TCP socket (IPv4 or IPv6) in the listening state, bound to `port` (0:
/// any port) at an address that `host` reaches (the wildcard address, or `host` itself when it
/// is an IP literal; a host name is not resolved and any bound address is taken). Otherwise one
/// phrase naming the descriptor and what it is instead, e.g. "descriptor 7 is bound to port
/// 20001, not 20002". Takes no ownership and changes nothing; never blocks; thread-safe.
std::string listener_problem(int fd, int port, const std::string& host);

/// Takes ownership of a listening socket `fd` that listener_problem() accepted: sets
/// close-on-exec (processes this one starts do not inherit it), O_NONBLOCK and SO_REUSEADDR
/// (a later bind of the port succeeds while accepted connections linger), as listen_tcp's.
Socket adopt_listener(int fd);

/// Connects to host:port, retrying refused/unreachable/unresolvable attempts with back-off
/// (10 ms doubling to 500 ms) until `deadline`. On failure returns an invalid Socket and a text
/// describing the last attempt's error in *last_error (each attempt waits at least 50 ms, past
/// `deadline` if need be, so a refusal is told from a timeout). Out of descriptors (EMFILE,
/// ENFILE) it returns at once, with *exhausted set when given (Note [descriptor budget]).
Socket connect_tcp(const std::string& host, int port, Deadline deadline, std::string* last_error,
                   bool* exhausted = nullptr);

/// Accepts one connection before `deadline`; invalid Socket on timeout or error (see *result).
Socket accept_until(const Socket& listener, Deadline deadline, IoResult* result);

/// Reads/writes exactly `bytes` before `deadline` (poll + non-blocking I/O, MSG_NOSIGNAL).
IoResult read_exact(int fd, void* data, std::size_t bytes, Deadline deadline);
IoResult write_exact(int fd, const void* data, std::size_t bytes, Deadline deadline);

/// O_NONBLOCK and TCP_NODELAY (small frames must not wait for Nagle).
void tune_stream_socket(int fd);

}  // namespace mwms::common
