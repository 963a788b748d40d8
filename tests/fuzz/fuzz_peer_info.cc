// libFuzzer target: a peer's entry of the peer-info exchange as it arrives from the wire (JSON
// text, then the bounded decoder). from_json never throws; JSON that does not parse is dropped
// the way the rendezvous drops it (parse with exceptions off).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "bootstrap/peer_info.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  mwms::bootstrap::PeerInfo info;
  std::string why;
  if (mwms::bootstrap::from_json(j, &info, &why)) {
    // What was accepted round-trips and stays within the published bounds.
    mwms::bootstrap::PeerInfo again;
    if (!mwms::bootstrap::from_json(mwms::bootstrap::to_json(info), &again, &why)) __builtin_trap();
    if (info.blobs.size() > mwms::bootstrap::kMaxBlobs) __builtin_trap();
    for (const auto& [name, blob] : info.blobs) {
      if (blob.size() > mwms::bootstrap::kMaxBlobBytes) __builtin_trap();
    }
    if (info.host_id.size() > mwms::bootstrap::kMaxHostIdBytes) __builtin_trap();
  }
  return 0;
}
