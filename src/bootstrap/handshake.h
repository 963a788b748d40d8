// The connection handshake (issue 7, DESIGN "Bootstrap"): the one module that opens every
// connection libmwms accepts — the rendezvous and every data and control link — and, with
// MWMS_AUTH_KEY, proves in both directions that each end holds the job's key.
//
// Note [auth handshake]: C is the connecting side, A the accepting side; K the shared key.
//   1. C -> A  frame of the connection's kind (kHello, kRingData, kRingControl):
//              {"v":1, "auth":bool, "nonce":Nc, "rank":r, "fingerprint":F, "hello":P}
//   2. A -> C  kChallenge {"ok":true, "nonce":Na, "proof":Pa}   or {"ok":false, "error":...}
//   3. C -> A  kProof     {"ok":true, "proof":Pc}               or {"ok":false, "error":...}
//   4. A -> C  kVerdict   {"ok":true} or {"ok":false, "error":...}
// Pa = HMAC-SHA256(K, "mwms-auth-v1" | "acceptor"  | kind | r | F | Nc | Na | SHA-256(P)),
// Pc = HMAC-SHA256(K, "mwms-auth-v1" | "connector" | kind | r | F | Na | Nc | SHA-256(P)),
// each field length-prefixed. Nc and Na are 32 fresh bytes from RAND_bytes, so a recorded
// exchange proves nothing on a new connection (each side's proof covers the other's fresh
// nonce); the role labels stop a proof being reflected back; the claims (connection kind,
// rank, fingerprint, the whole hello P) cannot be changed without the key. Proofs are
// compared with CRYPTO_memcmp. Without a key on either side, messages 3 and 4 are skipped and
// the proofs are empty: the handshake then only frames the claims, and a side with a key
// refuses a side without one (and the other way round), each saying so to the other.
// Every frame is bounded (kMaxHandshakeBytes) and every read has a deadline.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/socket.h"

namespace mwms::bootstrap {

/// Length-prefixed frame used by the rendezvous, the link hellos and the handshake:
/// magic "MWMB", version, kind, length (bounded by kMaxMessageBytes) then the (JSON) text.
enum class MessageKind : std::uint32_t {
  kHello = 1,        // rendezvous hello (C -> leader)
  kReply = 2,        // rendezvous answer (leader -> C)
  kRingData = 3,     // data link hello
  kRingControl = 4,  // control link hello
  kChallenge = 5,    // handshake step 2
  kProof = 6,        // handshake step 3
  kVerdict = 7,      // handshake step 4
};
constexpr std::size_t kMaxMessageBytes = 4u << 20;
/// Bound on every handshake frame, hello included (a peer info is at most ~10 KiB).
constexpr std::size_t kMaxHandshakeBytes = 64u << 10;
/// Size of each side's nonce, in bytes.
constexpr std::size_t kNonceBytes = 32;

/// Sends one frame; returns the I/O result (EMSGSIZE for a text over kMaxMessageBytes).
common::IoResult send_message(int fd, MessageKind kind, const std::string& text,
                              common::Deadline deadline);
/// Receives one frame of at most `max_bytes`; sets *kind and *text. A bad magic/version/length
/// gives kError with error = EPROTO.
common::IoResult recv_message(int fd, MessageKind* kind, std::string* text,
                              common::Deadline deadline,
                              std::size_t max_bytes = kMaxMessageBytes);

/// Incremental decoder of one frame, for non-blocking readers (the accepting side reads many
/// connections at once). Not thread-safe; one per connection.
class FrameDecoder {
 public:
  enum class State { kNeedMore, kDone, kError };
  explicit FrameDecoder(std::size_t max_bytes) : max_bytes_(max_bytes) {}
  /// Consumes bytes from `data` (at most up to the end of this frame) and sets *used to how many
  /// were taken. kError: bad magic, version or a length over max_bytes (nothing is allocated
  /// beyond max_bytes). After kDone, kind() and text() hold the frame.
  State feed(std::string_view data, std::size_t* used);
  /// Reads what `fd` has (non-blocking) and feeds it; *io reports a close or an error (kError).
  State read_from(int fd, common::IoResult* io);
  MessageKind kind() const noexcept { return kind_; }
  const std::string& text() const noexcept { return text_; }

 private:
  std::size_t max_bytes_;
  unsigned char header_[16] = {};
  std::size_t header_have_ = 0;
  std::size_t length_ = 0;
  MessageKind kind_ = MessageKind::kHello;
  std::string text_;
  State state_ = State::kNeedMore;
};

/// The job's shared secret (MWMS_AUTH_KEY or the contents of MWMS_AUTH_KEY_FILE). Never logged;
/// its bytes are wiped when it is destroyed.
class AuthKey {
 public:
  AuthKey() = default;
  explicit AuthKey(std::string bytes) : bytes_(std::move(bytes)) {}
  AuthKey(const AuthKey&) = default;
  AuthKey& operator=(const AuthKey&) = default;
  ~AuthKey();
  bool enabled() const noexcept { return !bytes_.empty(); }
  const std::string& bytes() const noexcept { return bytes_; }

 private:
  std::string bytes_;
};

/// The key configured for this process, read once: MWMS_AUTH_KEY, else the file named by
/// MWMS_AUTH_KEY_FILE (one trailing newline stripped); disabled when neither is set. A key file
/// that others may read gets one warning. Thread-safe.
/// @throws InvalidArgument when both are set, when MWMS_AUTH_KEY is set but empty, when the file
///   cannot be read (naming the path and the system error) or holds an empty key.
const AuthKey& auth_key_from_env();

/// What the connecting side claims; every field is covered by the proofs.
struct HandshakeClaim {
  MessageKind kind = MessageKind::kHello;  // the connection's purpose
  int rank = -1;
  std::string fingerprint;  // the job's cluster fingerprint as the connecting side sees it
  std::string hello;        // the rest of the hello (JSON text), opaque to the handshake
};

/// How a connecting handshake ended.
struct ConnectOutcome {
  enum class Status { kOk, kIo, kRefused, kKeyMismatch, kProtocol };
  Status status = Status::kOk;
  common::IoResult io;  // for kIo
  std::string detail;   // for kRefused: the acceptor's reason; otherwise what went wrong
};

/// `o.detail` for a message that already says "key mismatch": without the "key mismatch: " that
/// every kKeyMismatch detail starts with (the detail unchanged otherwise), so that the caller's
/// error says it once.
std::string mismatch_detail(const ConnectOutcome& o);

/// Connecting side of Note [auth handshake] on a connected socket: sends `claim` and proves
/// `key` to the acceptor (when enabled), verifying the acceptor's proof first. Blocks until
/// the acceptor's verdict or `deadline`. Never throws: the caller raises the error naming the
/// task and the peer. kKeyMismatch: the acceptor's proof did not verify (another key); the
/// acceptor is told so.
ConnectOutcome connect_handshake(int fd, const AuthKey& key, const HandshakeClaim& claim,
                                 common::Deadline deadline);

/// "ip:port" of the other end of a connected socket ("[v6]:port"; IPv4-mapped addresses as
/// IPv4), or "unknown source" when the system cannot say.
std::string peer_source(int fd);

/// One finished accepting handshake (a success or a refusal).
struct HandshakeEvent {
  bool ok = false;
  common::Socket socket;  // valid when ok
  std::string source;     // the connection's real source address (peer_source)
  HandshakeClaim claim;   // what it claimed (rank -1 when it got no valid first message)
  bool key_mismatch = false;  // refused because its proof (or ours, at its end) did not verify
  std::string reason;         // for a refusal: why, for the log
};

/// Accepting side of Note [auth handshake] for every connection arriving at a listener: runs
/// all pending handshakes at once (one poll over the listener and every pending connection),
/// each with its own deadline of `hello_seconds` from its accept, so N silent connections cost
/// one deadline, not N. Only connections whose first frame has a kind in `kinds` are served.
/// Not thread-safe; one per listener and phase.
class HandshakeServer {
 public:
  HandshakeServer(const common::Socket& listener, const AuthKey& key,
                  std::vector<MessageKind> kinds, double hello_seconds);
  ~HandshakeServer();
  HandshakeServer(const HandshakeServer&) = delete;
  HandshakeServer& operator=(const HandshakeServer&) = delete;

  /// Accepts and advances handshakes until one finishes (returned: a success with its socket,
  /// or a refusal with the source and reason) or `until` passes (nullopt). Never throws for
  /// what a peer does.
  std::optional<HandshakeEvent> next(common::Deadline until);
  /// Connections whose handshake is under way.
  std::size_t pending() const noexcept;

 private:
  struct Pending;
  // Reads what p's socket has and moves its handshake on; queues an event when it finishes.
  void advance(Pending* p);
  const common::Socket& listener_;
  AuthKey key_;
  std::vector<MessageKind> kinds_;
  double hello_seconds_;
  std::vector<std::unique_ptr<Pending>> pending_;
  std::vector<HandshakeEvent> ready_;
};

namespace detail {
/// Pa or Pc of Note [auth handshake] (32 bytes), for the unit tests and the fuzz target.
std::string handshake_proof(const AuthKey& key, bool acceptor, const HandshakeClaim& claim,
                            std::string_view connector_nonce, std::string_view acceptor_nonce);
/// Decodes and bounds-checks message 1 (Note [auth handshake]); false (and *why) for anything
/// that does not fit. Never throws.
bool decode_first_message(MessageKind kind, const std::string& text, HandshakeClaim* claim,
                          bool* auth, std::string* nonce, std::string* why) noexcept;
}  // namespace detail

}  // namespace mwms::bootstrap
