// Note [advertised address]: TF_CONFIG and Slurm name every task's address, but MPI and torchrun
// name at most rank 0's, so the other ranks must say where they listen. The choice, in order:
// 1. MWMS_SOCKET_IFNAME (NCCL's syntax, for hosts with several networks: the one to use is a
//    site decision no heuristic can make);
// 2. loopback when the leader is a loopback name (a one-host job: host names may not resolve);
// 3. the source address of the route toward the leader: connect(2) on a UDP socket picks the
//    route and binds the local address without sending a packet; whatever reaches the leader is
//    the network the job runs on;
// 4. the host name (MPI's behaviour before this file), which needs working name resolution.
#include "bootstrap/local_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "common/env.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

bool InterfaceFilter::matches(std::string_view name) const {
  bool hit = false;
  for (const std::string& n : names) {
    hit = hit || (exact ? name == n : name.substr(0, n.size()) == n);
  }
  return hit != exclude;
}

InterfaceFilter parse_interface_filter(std::string_view text) {
  InterfaceFilter f;
  std::string_view rest = text;
  if (!rest.empty() && rest[0] == '^') {
    f.exclude = true;
    rest.remove_prefix(1);
  }
  if (!rest.empty() && rest[0] == '=') {
    f.exact = true;
    rest.remove_prefix(1);
  }
  auto bad = [&](const std::string& why) {
    return InvalidArgument("MWMS_SOCKET_IFNAME=" + std::string(text.substr(0, 200)) + ": " + why);
  };
  std::size_t start = 0;
  while (true) {
    std::size_t comma = rest.find(',', start);
    std::string_view name =
        rest.substr(start, comma == std::string_view::npos ? comma : comma - start);
    if (name.empty()) throw bad("an empty interface name (expected e.g. eth0,ib or ^docker)");
    if (name.size() >= IFNAMSIZ) throw bad("\"" + std::string(name) + "\" is longer than 15 bytes");
    if (f.names.size() == 64) throw bad("more than 64 names");
    f.names.emplace_back(name);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return f;
}

namespace {

std::string numeric_host(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text,
                sizeof(text));
  }
  return text;
}

// Interfaces that are up, with their first IPv4 (else IPv6, not link-local) address, in order.
std::vector<std::pair<std::string, std::string>> interfaces() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family) continue;
      if ((i->ifa_flags & IFF_UP) == 0) continue;
      if (family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr)) {
        continue;
      }
      out.emplace_back(i->ifa_name, numeric_host(i->ifa_addr));
    }
  }
  ::freeifaddrs(all);
  return out;
}

// Local address of the route toward host:port, "" when there is none.
std::string route_source(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      out = numeric_host(reinterpret_cast<sockaddr*>(&local));
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

}  // namespace

std::string interface_address(const InterfaceFilter& filter) {
  for (const auto& [name, address] : interfaces()) {
    if (filter.matches(name)) return address;
  }
  return "";
}

std::string bracket_host(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

std::string advertised_host(const std::string& toward, int toward_port) {
  if (common::env_is_set("MWMS_SOCKET_IFNAME")) {
    std::string spec = common::env_string("MWMS_SOCKET_IFNAME");
    std::string address = interface_address(parse_interface_filter(spec));
    if (address.empty()) {
      std::string seen;
      for (const auto& [name, a] : interfaces()) seen += (seen.empty() ? "" : ", ") + name + " " + a;
      throw BootstrapError("MWMS_SOCKET_IFNAME=" + spec +
                           " matches no interface that is up with an address; interfaces: " +
                           (seen.empty() ? std::string("none") : seen));
    }
    return address;
  }
  if (!toward.empty() && is_loopback_host(toward)) return "127.0.0.1";
  if (!toward.empty()) {
    std::string address = route_source(toward, toward_port);
    if (!address.empty()) return address;
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// Note [local peers before the exchange]: under MWMS_TRANSPORT=auto each task makes its
// shared-memory segment before the rendezvous (the segment's address is part of the peer info),
// but only the exchange's host ids say which peers share a host. A task whose peers are all on
// other machines made, published and freed a segment for nothing (a memfd of world size rings).
// TF_CONFIG and Slurm list every address up front, which is enough to skip it in the common
// case: a peer cannot share this host's host id (host name, boot id and network namespace) if
// its address is none of this host's. The test is one-sided: anything unsure (an incomplete
// ring, a name that does not resolve, a public address that NAT maps here but two tasks share)
// keeps the segment, and choose_transports() only picks shm when both sides published one, so a
// wrong "remote" costs the pair shared memory, never correctness.
bool may_share_host(const std::vector<std::string>& ring, int self, int world_size) noexcept {
  try {
    if (static_cast<int>(ring.size()) != world_size || self < 0 || self >= world_size) return true;
    auto host_of = [](const std::string& address) {
      std::string h = address.substr(0, address.rfind(':'));
      if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
      return h;
    };
    std::set<std::string> local;  // numeric addresses of this host, its own task's host's too
    ifaddrs* all = nullptr;
    if (::getifaddrs(&all) != 0) return true;
    for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr != nullptr) local.insert(numeric_host(i->ifa_addr));
    }
    ::freeifaddrs(all);
    char name[256] = {0};
    ::gethostname(name, sizeof(name) - 1);
    auto resolve = [](const std::string& host, std::set<std::string>* out) {
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) out->insert(numeric_host(a->ai_addr));
      ::freeaddrinfo(found);
      return true;
    };
    const std::string mine = host_of(ring[static_cast<std::size_t>(self)]);
    if (!resolve(mine, &local)) return true;
    std::set<std::string> others;
    for (int r = 0; r < world_size; ++r) {
      if (r != self) others.insert(host_of(ring[static_cast<std::size_t>(r)]));
    }
    if (others.size() > 64) return true;
    for (const std::string& h : others) {
      if (h == mine || h == name || is_loopback_host(h)) return true;
      std::set<std::string> addresses;
      if (!resolve(h, &addresses)) return true;
      for (const std::string& a : addresses) {
        if (local.count(a) != 0 || is_loopback_host(a)) return true;
      }
    }
    return false;
  } catch (...) {
    return true;  // (std::bad_alloc) the safe answer
  }
}

}  // namespace mwms::bootstrap
