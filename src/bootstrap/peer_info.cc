#include "bootstrap/peer_info.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
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

void assign_local_ranks(std::vector<PeerInfo>* peers) {
  std::map<std::string, int> seen;
  for (PeerInfo& p : *peers) p.local_rank = seen[p.host_id]++;
  for (PeerInfo& p : *peers) p.local_size = seen[p.host_id];
}

json to_json(const PeerInfo& p) {
  return json{{"rank", p.rank},           {"address", p.address},
              {"host_id", p.host_id},     {"transport", p.transport},
              {"blobs", p.blobs}};
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
