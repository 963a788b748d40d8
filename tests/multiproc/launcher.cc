#include "multiproc/launcher.h"

#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

namespace mwms::testing {

int bind_any(int port) {
  // Dual-stack like the library's listener; IPv4 alone where the kernel has no IPv6.
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd >= 0) {
    int zero = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    ::close(fd);
    return -1;
  }
  fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

// Ports below the kernel's ephemeral range: an outgoing connection (ours included) never takes
// one of them between the choice here and the child's bind. Each is bound while the others are
// chosen, so they differ.
std::vector<int> free_ports(int n) {
  int ephemeral_low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  std::mt19937 rng(static_cast<unsigned>(::getpid()) ^
                   static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> pick(10000, std::max(10001, ephemeral_low - 1));
  static std::set<int> handed_out;  // never twice: two clusters of one test must not collide
  std::vector<int> ports;
  std::vector<int> fds;
  while (static_cast<int>(ports.size()) < n) {
    int port = pick(rng);
    if (handed_out.count(port) != 0) continue;
    int fd = bind_any(port);
    if (fd < 0) continue;  // taken: pick another
    ports.push_back(port);
    fds.push_back(fd);
    handed_out.insert(port);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

namespace {
std::vector<int> g_extra_ports;  // set by run_ranks before it forks
}  // namespace

const std::vector<int>& extra_ports() { return g_extra_ports; }

std::string make_tf_config(const std::vector<int>& ports, int rank, bool with_chief) {
  std::vector<std::string> addresses;
  for (int port : ports) addresses.push_back("localhost:" + std::to_string(port));
  return make_tf_config(addresses, rank, with_chief);
}

std::string make_tf_config(const std::vector<std::string>& addresses, int rank, bool with_chief) {
  std::string workers;
  std::size_t first_worker = with_chief ? 1 : 0;
  for (std::size_t i = first_worker; i < addresses.size(); ++i) {
    workers += std::string(i > first_worker ? "," : "") + "\"" + addresses[i] + "\"";
  }
  std::string cluster = "{\"worker\":[" + workers + "]";
  if (with_chief) cluster += ",\"chief\":[\"" + addresses[0] + "\"]";
  cluster += "}";
  std::string type = with_chief && rank == 0 ? "chief" : "worker";
  int index = with_chief ? (rank == 0 ? 0 : rank - 1) : rank;
  return "{\"cluster\":" + cluster + ",\"task\":{\"type\":\"" + type +
         "\",\"index\":" + std::to_string(index) + "}}";
}

const std::vector<TestHost>& test_hosts() {
  static const std::vector<TestHost> hosts = [] {
    std::vector<TestHost> out;
    const char* raw = std::getenv("MWMSTEST_HOSTS");
    std::string spec = raw != nullptr ? raw : "";
    std::size_t pos = 0;
    while (pos < spec.size()) {
      std::size_t end = spec.find(',', pos);
      if (end == std::string::npos) end = spec.size();
      const std::string item = spec.substr(pos, end - pos);
      const std::size_t eq = item.find('=');
      if (eq == 0 || eq == std::string::npos || eq + 1 == item.size()) {
        throw std::runtime_error("MWMSTEST_HOSTS: '" + item + "' is not netns=address");
      }
      out.push_back({item.substr(0, eq), item.substr(eq + 1)});
      pos = end + 1;
    }
    return out;
  }();
  return hosts;
}

int host_of(int rank, int n, int hosts) {
  return hosts <= 1 || n <= 0 ? 0 : std::min(hosts - 1, rank * hosts / n);
}

namespace {

// Moves this (child) process into the network namespace `name` (/run/netns/<name>, as
// `ip netns` makes them); throws with the reason.
void enter_netns(const std::string& name) {
  const std::string path = "/run/netns/" + name;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  const int rc = ::setns(fd, CLONE_NEWNET);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("setns(" + path + "): " + std::strerror(err));
}

}  // namespace

namespace {

// What a child prints when its listen port was taken between free_ports and its bind
// (rendezvous.cc, open_listener).
bool port_taken(const ChildResult& r) {
  return r.exit_code != 0 && r.output.find("address already in use") != std::string::npos;
}

// One run of run_ranks; *taken is set when a child lost its port to another process (the
// others are then killed at once instead of waiting for their connect timeouts).
std::vector<ChildResult> run_once(
    const LaunchOptions& options,
    const std::function<void(int, const std::string&,
                             const std::function<void(const std::string&)>&)>& body,
    bool* taken) {
  const int n = options.world_size;
  std::vector<int> ports = free_ports(n);
  g_extra_ports = free_ports(options.extra_ports);
  const std::vector<TestHost>& hosts = test_hosts();
  const int nhosts = static_cast<int>(hosts.size());
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    addresses.push_back((hosts.empty() ? std::string("localhost")
                                       : hosts[static_cast<std::size_t>(host_of(r, n, nhosts))].address) +
                        ":" + std::to_string(ports[static_cast<std::size_t>(r)]));
  }
  std::vector<ChildResult> results(n);
  std::vector<pid_t> pids(n);
  std::vector<int> pipes(n);
  auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < n; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::string tf_config = make_tf_config(addresses, rank, options.with_chief);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      auto report = [fd = fds[1]](const std::string& text) {
        std::string line = text + "\n";
        (void)!::write(fd, line.data(), line.size());
      };
      int code = 0;
      try {
        if (!hosts.empty()) {
          enter_netns(hosts[static_cast<std::size_t>(host_of(rank, n, nhosts))].netns);
        }
        body(rank, tf_config, report);
      } catch (const std::exception& e) {
        report(e.what());
        code = 1;
      }
      ::_exit(code);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    pids[rank] = pid;
    pipes[rank] = fds[0];
    results[rank].rank = rank;
  }
  int running = n;
  while (running > 0) {
    for (int rank = 0; rank < n; ++rank) {
      char buf[4096];
      ssize_t got;
      while (pipes[rank] >= 0 && (got = ::read(pipes[rank], buf, sizeof(buf))) > 0) {
        results[rank].output.append(buf, static_cast<std::size_t>(got));
      }
      if (pids[rank] <= 0) continue;
      int status = 0;
      if (::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        results[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        results[rank].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        results[rank].seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        pids[rank] = 0;
        --running;
        if (port_taken(results[rank])) *taken = true;
      }
    }
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > options.timeout_seconds || *taken) {
      for (int rank = 0; rank < n; ++rank) {
        if (pids[rank] > 0) {
          ::kill(pids[rank], SIGKILL);
          ::waitpid(pids[rank], nullptr, 0);
          results[rank].timed_out = !*taken;
          pids[rank] = 0;
          --running;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < n; ++rank) {
    char buf[4096];
    ssize_t got;
    while ((got = ::read(pipes[rank], buf, sizeof(buf))) > 0) {
      results[rank].output.append(buf, static_cast<std::size_t>(got));
    }
    ::close(pipes[rank]);
  }
  return results;
}

}  // namespace

std::vector<ChildResult> run_ranks(
    const LaunchOptions& options,
    const std::function<void(int, const std::string&,
                             const std::function<void(const std::string&)>&)>& body) {
  std::vector<ChildResult> results;
  for (int attempt = 1;; ++attempt) {
    bool taken = false;
    results = run_once(options, body, &taken);
    if (!taken || attempt >= std::max(1, options.attempts)) break;
    for (const ChildResult& r : results) {
      if (!port_taken(r)) continue;
      std::cerr << "run_ranks: another process took a port before rank " << r.rank
                << " could bind it; running again with fresh ports (attempt " << attempt + 1
                << "): " << r.output;
      break;
    }
  }
  g_extra_ports.clear();
  return results;
}

std::string describe(const std::vector<ChildResult>& results) {
  std::string out;
  for (const auto& r : results) {
    out += "rank " + std::to_string(r.rank) + ": exit " + std::to_string(r.exit_code) +
           (r.signal ? " signal " + std::to_string(r.signal) : "") +
           (r.timed_out ? " TIMED OUT" : "") + " after " + std::to_string(r.seconds) + " s\n" +
           r.output + "\n";
  }
  return out;
}

void expect_no_allocations(const std::function<void()>& round,
                           const std::function<void(const std::string&)>& report) {
  round();  // grows the scratch buffers and plans once
  long before = allocations();
  for (int i = 0; i < 20; ++i) round();
  long allocated = allocations() - before;
  report("allocations in 20 rounds: " + std::to_string(allocated));
  if (allocated != 0) {
    throw std::runtime_error("collectives allocated " + std::to_string(allocated));
  }
}

}  // namespace mwms::testing
