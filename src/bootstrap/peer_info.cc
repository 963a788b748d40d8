#include "bootstrap/peer_info.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string_view>
#include <nlohmann/json.hpp>

namespace mwms::bootstrap {

using nlohmann::json;

std::string local_host_id() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  struct stat st {};
  std::string netns = ::stat("/proc/self/ns/net", &st) == 0 ? std::to_string(st.st_ino) : "";
  return std::string(host) + "/" + boot + "/" + netns;
}

// Note [dead process]: a killed rank is normally noticed at once, when the kernel closes its
// sockets. A rank that forked (a data loader, a shell-out) leaves its sockets open in the child
// when it dies, and then nothing closes: its peers saw only heartbeat silence and blamed a
// "stopped or hung" process 20 s later. On one host the process itself can be asked: each rank
// publishes its pid namespace, pid and start time in the peer-info exchange, and a rank whose
// wait for a same-host peer makes no progress looks at /proc/PID/stat (at most every 0.25 s per
// peer, control_plane.cc): gone, a zombie, or another process under a reused pid means it died,
// and that is what the error says. Another pid namespace (containers sharing a network
// namespace) proves nothing, so it is never judged; across hosts the heartbeat still decides.
namespace {

std::string pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : "";
}

// Field 3 (state) and field 22 (start time) of /proc/PID/stat, read into `line` (no allocation:
// a wait's liveness check runs on the steady-state path). False when it cannot be read.
bool read_stat(const char* pid, char* state, std::string_view* start, bool* missing,
               char (&line)[1024]) {
  *missing = false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%s/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *missing = errno == ENOENT || errno == ESRCH;
    return false;
  }
  ssize_t n;
  do n = ::read(fd, line, sizeof(line) - 1); while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) {
    *missing = n == 0 || errno == ESRCH;  // the process went while we read
    return false;
  }
  const std::string_view all(line, static_cast<std::size_t>(n));
  const std::size_t close = all.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string_view::npos) return false;
  std::string_view rest = all.substr(close + 1);
  for (int i = 3; i <= 22; ++i) {
    const std::size_t b = rest.find_first_not_of(" \n");
    if (b == std::string_view::npos) return false;
    rest.remove_prefix(b);
    const std::size_t e = std::min(rest.find_first_of(" \n"), rest.size());
    if (i == 3) *state = rest[0];
    if (i == 22) {
      *start = rest.substr(0, e);
      return true;
    }
    rest.remove_prefix(e);
  }
  return false;
}

// Computed once (a pid namespace never changes under a running process).
const std::string& own_pid_namespace() {
  static const std::string ns = pid_namespace();
  return ns;
}

}  // namespace

std::string local_process_id() {
  char state = 0;
  std::string_view start;
  bool missing = false;
  char line[1024];
  const std::string& ns = own_pid_namespace();
  if (ns.empty() || !read_stat("self", &state, &start, &missing, line)) return "";
  return ns + ":" + std::to_string(::getpid()) + ":" + std::string(start);
}

bool process_gone(const std::string& id) noexcept {
  // No allocation here (Note [dead process]; the steady-state tests count operator new).
  const std::string_view v(id);
  const std::size_t a = v.find(':');
  const std::size_t b = a == std::string_view::npos ? a : v.find(':', a + 1);
  if (b == std::string_view::npos || v.size() > 64) return false;
  const std::string& ns = own_pid_namespace();
  if (ns.empty() || v.substr(0, a) != ns) return false;
  const std::string_view pid = v.substr(a + 1, b - a - 1);
  if (pid.empty() || pid.size() > 10 || pid.find_first_not_of("0123456789") != std::string_view::npos) {
    return false;
  }
  char pid_text[16] = {0};
  pid.copy(pid_text, pid.size());
  char state = 0;
  std::string_view start;
  bool missing = false;
  char line[1024];
  if (!read_stat(pid_text, &state, &start, &missing, line)) return missing;
  return state == 'Z' || state == 'X' || start != v.substr(b + 1);
}

void assign_local_ranks(std::vector<PeerInfo>* peers) {
  std::map<std::string, int> seen;
  for (PeerInfo& p : *peers) p.local_rank = seen[p.host_id]++;
  for (PeerInfo& p : *peers) p.local_size = seen[p.host_id];
}

json to_json(const PeerInfo& p) {
  return json{{"rank", p.rank},
              {"address", p.address},
              {"host_id", p.host_id},
              {"transport", p.transport},
              {"blobs", p.blobs},
              {"process", p.process},
              {"fd_headroom", p.fd_headroom},
              {"online_cores", p.online_cores}};
}

bool from_json(const json& j, PeerInfo* out, std::string* why) noexcept {
  try {
    auto str = [&](const char* key, std::size_t max, std::string* dst) {
      if (!j.contains(key) || !j[key].is_string()) {
        *why = std::string("peer info has no string '") + key + "'";
        return false;
      }
      *dst = j[key].get<std::string>();
      if (dst->size() > max) {
        *why = std::string("peer info '") + key + "' is longer than " + std::to_string(max);
        return false;
      }
      return true;
    };
    if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer()) {
      *why = "peer info is not an object with an integer rank";
      return false;
    }
    PeerInfo p;
    p.rank = j["rank"].get<int>();
    if (!str("address", kMaxHostIdBytes, &p.address) ||
        !str("host_id", kMaxHostIdBytes, &p.host_id) || !str("transport", 16, &p.transport)) {
      return false;
    }
    // Optional (Note [dead process]): "" when absent; bounded like any string.
    if (j.contains("process") && !str("process", 64, &p.process)) return false;
    if (j.contains("fd_headroom")) {  // optional, Note [descriptor budget]
      const json& h = j["fd_headroom"];
      if (!h.is_number_integer() || h.get<long long>() < -1 || h.get<long long>() > (1LL << 31)) {
        *why = "peer info 'fd_headroom' is not an integer in [-1, 2^31]";
        return false;
      }
      p.fd_headroom = static_cast<long>(h.get<long long>());
    }
    if (j.contains("online_cores")) {  // optional: what the selector's topology reads
      const json& c = j["online_cores"];
      if (!c.is_number_integer() || c.get<long long>() < 0 || c.get<long long>() > (1LL << 20)) {
        *why = "peer info 'online_cores' is not an integer in [0, 2^20]";
        return false;
      }
      p.online_cores = static_cast<int>(c.get<long long>());
    }
    if (!j.contains("blobs") || !j["blobs"].is_object() || j["blobs"].size() > kMaxBlobs) {
      *why = "peer info 'blobs' is not an object of at most " + std::to_string(kMaxBlobs);
      return false;
    }
    for (const auto& [name, value] : j["blobs"].items()) {
      if (!value.is_string() || value.get<std::string>().size() > kMaxBlobBytes ||
          name.size() > 16) {
        *why = "peer info blob '" + name.substr(0, 16) + "' is not a string of at most " +
               std::to_string(kMaxBlobBytes) + " bytes";
        return false;
      }
      p.blobs[name] = value.get<std::string>();
    }
    *out = std::move(p);
    return true;
  } catch (...) {
    *why = "peer info could not be decoded";
    return false;
  }
}

}  // namespace mwms::bootstrap
