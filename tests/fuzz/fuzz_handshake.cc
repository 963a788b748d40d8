// libFuzzer target: the bytes a stranger sends to a listener, through what the accepting side of
// the handshake runs on them (Note [auth handshake]): the incremental frame decoder fed in two
// pieces, then the bounded decoder of the first message. Neither may throw, allocate past its
// bound, or accept a claim outside the documented limits.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "bootstrap/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mwms::bootstrap::FrameDecoder;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  FrameDecoder decoder(mwms::bootstrap::kMaxHandshakeBytes);
  // The first byte chooses where the stream is cut, as two reads from a socket would cut it.
  std::size_t cut = size == 0 ? 0 : static_cast<std::size_t>(data[0]) % (size + 1);
  std::size_t used = 0;
  FrameDecoder::State state = decoder.feed(bytes.substr(0, cut), &used);
  if (used > cut) __builtin_trap();
  if (state == FrameDecoder::State::kNeedMore) {
    std::size_t used2 = 0;
    state = decoder.feed(bytes.substr(cut), &used2);
    if (used + used2 > size) __builtin_trap();
  }
  if (state != FrameDecoder::State::kDone) return 0;
  if (decoder.text().size() > mwms::bootstrap::kMaxHandshakeBytes) __builtin_trap();
  mwms::bootstrap::HandshakeClaim claim;
  bool auth = false;
  std::string nonce, why;
  if (mwms::bootstrap::detail::decode_first_message(decoder.kind(), decoder.text(), &claim, &auth,
                                                    &nonce, &why)) {
    if (nonce.size() != mwms::bootstrap::kNonceBytes) __builtin_trap();
    if (claim.rank < 0 || claim.fingerprint.size() > 256) __builtin_trap();
    if (claim.hello.size() > decoder.text().size()) __builtin_trap();
  } else if (why.empty()) {
    __builtin_trap();  // a refusal always has a reason for the log
  }
  return 0;
}
