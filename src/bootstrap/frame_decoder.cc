// Frames of the start-up protocol (handshake.h): send_message/recv_message with deadlines and
// the incremental FrameDecoder the accepting side feeds from non-blocking reads.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "bootstrap/handshake.h"

namespace mwms::bootstrap {

namespace {

using common::Deadline;
using common::IoResult;
using common::IoStatus;

constexpr std::uint32_t kMagic = 0x424D574D;  // "MWMB" little-endian
constexpr std::uint32_t kVersion = 1;

struct MessageHeader {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t kind;
  std::uint32_t length;
};
static_assert(sizeof(MessageHeader) == 16, "frame header is 16 bytes on the wire");

}  // namespace

IoResult send_message(int fd, MessageKind kind, const std::string& text, Deadline deadline) {
  // Refuse here what the receiver would refuse as a protocol error: the sender then reports the
  // true cause ("Message too long") instead of the peer seeing a broken frame. TF_CONFIG's limits
  // (Note [bounded TF_CONFIG]) keep real rendezvous messages far below kMaxMessageBytes.
  if (text.size() > kMaxMessageBytes) return {IoStatus::kError, EMSGSIZE};
  MessageHeader h{kMagic, kVersion, static_cast<std::uint32_t>(kind),
                  static_cast<std::uint32_t>(text.size())};
  // One buffer, one write: a frame never sits half-sent between two system calls.
  std::string frame(reinterpret_cast<const char*>(&h), sizeof(h));
  frame += text;
  return common::write_exact(fd, frame.data(), frame.size(), deadline);
}

IoResult recv_message(int fd, MessageKind* kind, std::string* text, Deadline deadline,
                      std::size_t max_bytes) {
  MessageHeader h{};
  IoResult r = common::read_exact(fd, &h, sizeof(h), deadline);
  if (r.status != IoStatus::kOk) return r;
  if (h.magic != kMagic || h.version != kVersion || h.length > max_bytes ||
      h.length > kMaxMessageBytes) {
    return {IoStatus::kError, EPROTO};
  }
  *kind = static_cast<MessageKind>(h.kind);
  text->assign(h.length, '\0');
  return common::read_exact(fd, text->data(), h.length, deadline);
}

FrameDecoder::State FrameDecoder::feed(std::string_view data, std::size_t* used) {
  *used = 0;
  if (state_ != State::kNeedMore) return state_;
  if (header_have_ < sizeof(header_)) {
    std::size_t take = std::min(sizeof(header_) - header_have_, data.size());
    std::memcpy(header_ + header_have_, data.data(), take);
    header_have_ += take;
    *used += take;
    data.remove_prefix(take);
    if (header_have_ < sizeof(header_)) return state_;
    MessageHeader h;
    std::memcpy(&h, header_, sizeof(h));
    if (h.magic != kMagic || h.version != kVersion || h.length > max_bytes_ ||
        h.length > kMaxMessageBytes) {
      return state_ = State::kError;
    }
    kind_ = static_cast<MessageKind>(h.kind);
    length_ = h.length;
    text_.clear();
    text_.reserve(length_);
  }
  std::size_t take = std::min(length_ - text_.size(), data.size());
  text_.append(data.data(), take);
  *used += take;
  if (text_.size() == length_) state_ = State::kDone;
  return state_;
}

FrameDecoder::State FrameDecoder::read_from(int fd, IoResult* io) {
  *io = {};
  while (state_ == State::kNeedMore) {
    // Read no further than this frame: the next one belongs to whoever reads after us.
    char buf[4096];
    std::size_t want = header_have_ < sizeof(header_) ? sizeof(header_) - header_have_
                                                      : std::min(sizeof(buf), length_ - text_.size());
    ssize_t n = ::recv(fd, buf, want, MSG_DONTWAIT);
    if (n == 0) {
      *io = {IoStatus::kClosed, 0};
      return state_ = State::kError;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return state_;
      *io = {IoStatus::kError, errno};
      return state_ = State::kError;
    }
    std::size_t used = 0;
    feed(std::string_view(buf, static_cast<std::size_t>(n)), &used);
    if (state_ == State::kError) *io = {IoStatus::kError, EPROTO};
  }
  return state_;
}

}  // namespace mwms::bootstrap
