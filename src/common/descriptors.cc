// Note [descriptor budget]: a rank opens O(world size x streams) descriptors: control links,
// TCP streams, memfds of its shared-memory peers. Under a low `ulimit -n` (containers, batch
// systems; 4 ranks x 3 streams fail at 24-32) the rank that runs out used to fail somewhere in
// the middle of connecting, its peers only after their connect timeout blaming it ("never
// connected"), and a leader out of descriptors logged a refused accept hundreds of times.
// Instead each rank publishes its headroom (limit - open) in the peer-info exchange, and after
// the exchange, when every rank knows every pair's transport, every rank computes every rank's
// need (DescriptorBudget) and all fail together before anything connects, naming the rank(s)
// short of descriptors, the limit, the need and its parts. A descriptor that still runs out later
// (the program opened files meanwhile) fails that call at once with errno_description's text:
// an accept, socket, memfd or epoll never waits for a descriptor to come back.
#include "common/descriptors.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace mwms::common {

long descriptor_limit() noexcept {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<long>(r.rlim_cur);
}

long open_descriptors() noexcept {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  long n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n - 1;  // the directory's own descriptor
}

long descriptor_headroom() noexcept {
  const long limit = descriptor_limit();
  const long open = open_descriptors();
  return limit < 0 || open < 0 ? -1 : limit - open;
}

std::string errno_description(int err) {
  static_assert(EMFILE == 24 && ENFILE == 23, "descriptors_exhausted() spells them out");
  if (err == EMFILE) {
    const long limit = descriptor_limit();
    const long open = open_descriptors();
    return "out of file descriptors (" + std::string(std::strerror(err)) + "): this process has " +
           (open >= 0 ? std::to_string(open) : std::string("?")) + " open of its limit of " +
           (limit >= 0 ? std::to_string(limit) : std::string("?")) +
           " (ulimit -n); raise it (ulimit -n, systemd LimitNOFILE, docker --ulimit nofile) or "
           "open fewer (MWMS_NSOCKS_PERPEER)";
  }
  if (err == ENFILE) {
    return "out of file descriptors (" + std::string(std::strerror(err)) +
           "): the system's file table is full (fs.file-max); this process's own limit is not "
           "the cause";
  }
  return std::strerror(err);
}

int DescriptorBudget::total() const noexcept {
  if (world_size <= 1) return 0;
  const int epolls = streams_per_peer > 1 ? tcp_peers : 0;
  return 1 + (world_size - 1) + tcp_peers * streams_per_peer + epolls + shm_peers + kAllowance;
}

std::string DescriptorBudget::describe() const {
  std::string out = "1 listener, " + std::to_string(world_size - 1) + " control links";
  if (tcp_peers > 0) {
    out += ", " + std::to_string(tcp_peers * streams_per_peer) + " TCP streams to " +
           std::to_string(tcp_peers) + " peers (MWMS_NSOCKS_PERPEER=" +
           std::to_string(streams_per_peer) + ")";
    if (streams_per_peer > 1) out += ", " + std::to_string(tcp_peers) + " epoll sets";
  }
  if (shm_peers > 0) out += ", " + std::to_string(shm_peers) + " shared-memory segments of peers";
  return out + ", " + std::to_string(kAllowance) + " for handshakes";
}

}  // namespace mwms::common
