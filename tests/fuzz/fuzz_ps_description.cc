// libFuzzer target: the description a worker sends a parameter server at init and join
// (strategy/ps/ps_protocol.h, Note [ps messages]), as it arrives off the wire. The decoder is
// total: it accepts, or throws PeerError; nothing else escapes, and what it accepts re-encodes
// to the same bytes and stays within the published bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "strategy/ps/ps_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace ps = mwms::strategy::ps;
  mwms::ErrorContext ctx;
  try {
    const ps::JobDescription d = ps::decode(reinterpret_cast<const char*>(data), size, ctx);
    if (ps::encode(d) != std::string(reinterpret_cast<const char*>(data), size)) __builtin_trap();
    if (d.shards.size() > (std::size_t{1} << 20)) __builtin_trap();
    if (!ps::first_difference(d, d).empty()) __builtin_trap();
    const ps::Layout layout = ps::ps_layout(d.shards);
    std::size_t total = 0;
    for (const ps::Segment& s : layout.segments) total += s.count;
    if (total != layout.total) __builtin_trap();
  } catch (const mwms::PeerError&) {
  }
  return 0;
}
