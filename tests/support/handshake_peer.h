// The connection set-up that handshake tests repeat (Note [auth handshake] in
// src/bootstrap/handshake.h): a listener on a port of this host, a connection dialled to it or to
// a task's "host:port", this end's source address as the accepting side logs it, and one framed
// message read off a connection. Used by tests/unit/bootstrap/handshake_test.cc (the handshake
// alone) and tests/multiproc/auth_test.cc (strangers at a real job's ports). Header-only, no test
// framework: a failure throws std::runtime_error naming the address and the cause, which fails
// a Catch test case and makes a forked rank exit non-zero.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <stdexcept>
#include <string>

#include "bootstrap/handshake.h"
#include "common/socket.h"
#include "mwms/cluster.h"

namespace mwms::testing {

/// A TCP listener on `port` of this host (0: an ephemeral one, read back into port).
/// @throws std::runtime_error when the port cannot be bound (the errno).
struct TestListener {
  common::Socket socket;
  int port = 0;
  explicit TestListener(int wanted = 0) {
    int error = 0;
    socket = common::listen_tcp(wanted, &error);
    if (!socket.valid()) {
      throw std::runtime_error("cannot listen on port " + std::to_string(wanted) + ": errno " +
                               std::to_string(error));
    }
    port = common::local_port(socket);
  }
  /// A connection to this listener over 127.0.0.1, made within `seconds`.
  common::Socket connect(double seconds = 5) const;
};

/// A connection to `address` ("host:port"), made within `seconds` (retrying as connect_tcp
/// does). @throws std::runtime_error naming the address and the last connect error.
inline common::Socket dial(const std::string& address, double seconds = 20) {
  auto [host, port] = split_address(address);
  std::string err;
  auto s = common::connect_tcp(host, port, common::deadline_after(seconds), &err);
  if (!s.valid()) throw std::runtime_error("cannot reach " + address + ": " + err);
  return s;
}

inline common::Socket TestListener::connect(double seconds) const {
  return dial("127.0.0.1:" + std::to_string(port), seconds);
}

/// "ip:port" of this end of the connected socket `fd` ("[ip6]:port" for IPv6), written as the
/// accepting side writes the source it sees (bootstrap::peer_source) in its refusals.
inline std::string local_source(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  char text[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(v4->sin_port));
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
  ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
  return "[" + std::string(text) + "]:" + std::to_string(ntohs(v6->sin6_port));
}

/// The text of the next framed message on `fd` (bootstrap::recv_message), its kind in `*kind`,
/// within `seconds`. @throws std::runtime_error when none arrives whole in time (what the read
/// saw: closed, timed out, malformed).
inline std::string recv_text(int fd, bootstrap::MessageKind* kind, double seconds = 5) {
  std::string text;
  auto r = bootstrap::recv_message(fd, kind, &text, common::deadline_after(seconds));
  if (r.status != common::IoStatus::kOk) throw std::runtime_error("no message: " + r.describe());
  return text;
}

}  // namespace mwms::testing
