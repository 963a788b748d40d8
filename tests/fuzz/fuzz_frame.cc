// libFuzzer target: a received 44-byte frame header (any bytes a hostile or broken peer can send)
// checked against the expected one. check_frame must return for an identical header and raise an
// mwms::Error subclass for every other, with a message it can build (describe() of any bytes).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "collective/frame.h"
#include "mwms/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mwms::collective::FrameHeader;
  if (size < 2 * sizeof(FrameHeader)) return 0;
  FrameHeader expected;
  FrameHeader got;
  std::memcpy(&expected, data, sizeof(FrameHeader));
  std::memcpy(&got, data + sizeof(FrameHeader), sizeof(FrameHeader));
  expected.magic = mwms::collective::kFrameMagic;  // the runner builds the expected header
  expected.version = mwms::collective::kFrameVersion;
  (void)mwms::collective::describe(expected);
  (void)mwms::collective::describe(got);
  mwms::ErrorContext ctx;
  ctx.rank = 0;
  ctx.peer_rank = 1;
  const bool same = std::memcmp(&expected, &got, sizeof(FrameHeader)) == 0;
  try {
    mwms::collective::check_frame(expected, got, ctx);
  } catch (const mwms::Error&) {
    if (same) __builtin_trap();  // an identical header must pass
  }
  return 0;
}
