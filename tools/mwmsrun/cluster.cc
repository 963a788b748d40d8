// mwmsrun's cluster: a free loopback port per task (its socket already listening, Note
// [inherited listener]) or, with --hosts, HOST:port-base+slot, and each task's TF_CONFIG.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "mwmsrun.h"

namespace mwmsrun {

namespace {

// Note [inherited listener] (src/bootstrap/rendezvous.cc): a socket listening on `port` as the
// task's own listener would (common::listen_tcp: every interface, dual-stack IPv6 where the
// kernel has it, else IPv4; SO_REUSEADDR), close-on-exec; -1 when the port is taken.
int listen_on(int port) {
  const int one = 1;
  const int zero = 0;
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 128) == 0) {
      return fd;
    }
    const int e = errno;
    ::close(fd);
    if (e == EADDRINUSE) return -1;
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // no IPv6 in this kernel
  if (fd < 0) return -1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 128) == 0) {
    return fd;
  }
  ::close(fd);
  return -1;
}

// n sockets listening on distinct random ports in 20000-31999 (below Linux's ephemeral range,
// so that no outgoing connection holds one of them). They stay open until each task has them:
// nothing can take a port between this choice and the task's use of it.
std::vector<Listener> listen_on_free_ports(int n) {
  std::mt19937 rng(
      static_cast<unsigned>(::getpid()) ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> pick(20000, 31999);
  std::set<int> tried;
  std::vector<Listener> out;
  for (int tries = 0; static_cast<int>(out.size()) < n && tries < 100000; ++tries) {
    const int p = pick(rng);
    if (!tried.insert(p).second) continue;
    const int fd = listen_on(p);
    if (fd >= 0) out.push_back({p, fd});
  }
  if (static_cast<int>(out.size()) < n) {
    for (const Listener& l : out) ::close(l.fd);
    throw std::runtime_error("no " + std::to_string(n) + " free TCP ports in 20000-31999");
  }
  return out;
}

// Splits "h1:2,h2:2" into hosts repeated by their slot count; throws on a malformed list.
std::vector<std::string> parse_hosts(const std::string& spec) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    std::size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const std::size_t colon = item.rfind(':');
    std::string host = item;
    int slots = 1;
    if (colon != std::string::npos) {
      host = item.substr(0, colon);
      const std::string n = item.substr(colon + 1);
      char* e = nullptr;
      const long v = std::strtol(n.c_str(), &e, 10);
      if (n.empty() || *e != '\0' || v < 1 || v > 1024) {
        throw std::runtime_error("--hosts: '" + item + "' is not HOST or HOST:SLOTS (1-1024)");
      }
      slots = static_cast<int>(v);
    }
    if (host.empty() || host.size() > 253) {
      throw std::runtime_error("--hosts: '" + item + "' has no host name (or one over 253 bytes)");
    }
    for (int i = 0; i < slots; ++i) out.push_back(host);
    pos = end + 1;
  }
  return out;
}

}  // namespace

std::string tf_config(const std::vector<std::string>& addresses, int rank, bool with_chief,
                      int training) {
  nlohmann::json cluster;
  nlohmann::json workers = nlohmann::json::array();
  nlohmann::json ps = nlohmann::json::array();
  for (int i = with_chief ? 1 : 0; i < training; ++i) workers.push_back(addresses[i]);
  for (std::size_t i = static_cast<std::size_t>(training); i < addresses.size(); ++i) {
    ps.push_back(addresses[i]);
  }
  cluster["worker"] = workers;
  if (with_chief) cluster["chief"] = nlohmann::json::array({addresses[0]});
  if (!ps.empty()) cluster["ps"] = ps;
  nlohmann::json task;
  if (rank >= training) {
    task["type"] = "ps";
    task["index"] = rank - training;
  } else {
    task["type"] = with_chief && rank == 0 ? "chief" : "worker";
    task["index"] = with_chief ? (rank == 0 ? 0 : rank - 1) : rank;
  }
  return nlohmann::json{{"cluster", cluster}, {"task", task}}.dump();
}

int assign_addresses(const Options& o, std::vector<std::string>& addresses,
                     std::vector<Listener>& listeners) {
  try {
    if (!o.hosts.empty()) {
      if (!o.print_only) {
        std::cerr << "mwmsrun: error: --hosts starts nothing; use it with --print-tf-config and "
                     "start each host's tasks there (or use mpirun/srun)"
                  << std::endl;
        return 2;
      }
      std::vector<std::string> per_task = parse_hosts(o.hosts);
      if (o.np != 0 && o.np + o.num_ps != static_cast<int>(per_task.size())) {
        std::cerr << "mwmsrun: error: -np " << o.np << " + --ps " << o.num_ps << " but --hosts "
                  << o.hosts << " lists " << per_task.size()
                  << " slot(s); give one of them, or make them agree" << std::endl;
        return 2;
      }
      std::map<std::string, int> slot;
      for (const std::string& h : per_task) {
        addresses.push_back(h + ":" + std::to_string(o.port_base + slot[h]++));
      }
    } else {
      if (o.np < 1) {
        std::cerr << "mwmsrun: error: -np N is required (or --hosts with --print-tf-config)"
                  << std::endl;
        return 2;
      }
      listeners = listen_on_free_ports(o.np + o.num_ps);
      for (const Listener& l : listeners) {
        addresses.push_back("127.0.0.1:" + std::to_string(l.port));
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "mwmsrun: error: " << e.what() << std::endl;
    return 2;
  }
  return -1;
}

}  // namespace mwmsrun
