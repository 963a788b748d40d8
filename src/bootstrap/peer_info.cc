#include "bootstrap/peer_info.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
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

// Field 3 (state) and field 22 (start time) of /proc/PID/stat; false when it cannot be read.
bool read_stat(const std::string& pid, char* state, std::string* start, bool* missing) {
  *missing = false;
  std::ifstream in("/proc/" + pid + "/stat");
  if (!in) {
    *missing = errno == ENOENT;
    return false;
  }
  std::string line;
  std::getline(in, line);
  const std::size_t close = line.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos || line.size() > 4096) return false;
  std::istringstream fields(line.substr(close + 1));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i) {
    if (i == 3) *state = f.empty() ? '?' : f[0];
    if (i == 22) {
      *start = f;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string local_process_id() {
  char state = 0;
  std::string start;
  bool missing = false;
  const std::string ns = pid_namespace();
  if (ns.empty() || !read_stat("self", &state, &start, &missing)) return "";
  return ns + ":" + std::to_string(::getpid()) + ":" + start;
}

bool process_gone(const std::string& id) noexcept {
  try {
    const std::size_t a = id.find(':');
    const std::size_t b = a == std::string::npos ? a : id.find(':', a + 1);
    if (b == std::string::npos || id.size() > 64 || id.substr(0, a) != pid_namespace()) {
      return false;
    }
    const std::string pid = id.substr(a + 1, b - a - 1);
    if (pid.empty() || pid.size() > 10 || pid.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    char state = 0;
    std::string start;
    bool missing = false;
    if (!read_stat(pid, &state, &start, &missing)) return missing;
    return state == 'Z' || state == 'X' || start != id.substr(b + 1);
  } catch (...) {
    return false;
  }
}

void assign_local_ranks(std::vector<PeerInfo>* peers) {
  std::map<std::string, int> seen;
  for (PeerInfo& p : *peers) p.local_rank = seen[p.host_id]++;
  for (PeerInfo& p : *peers) p.local_size = seen[p.host_id];
}

json to_json(const PeerInfo& p) {
  return json{{"rank", p.rank},           {"address", p.address},
              {"host_id", p.host_id},     {"transport", p.transport},
              {"blobs", p.blobs},         {"process", p.process},
              {"fd_headroom", p.fd_headroom}};
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
