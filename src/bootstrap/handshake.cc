#include "bootstrap/handshake.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/descriptors.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

namespace {

using common::Deadline;
using common::IoResult;
using common::IoStatus;
using nlohmann::json;

constexpr std::size_t kMaxFingerprintBytes = 256;
constexpr std::size_t kMaxReasonBytes = 300;
// Bound on connections handshaking at once at one listener: a flood beyond it is refused
// at accept instead of growing the poll set without limit.
constexpr std::size_t kMaxPending = 256;
constexpr const char* kLabel = "mwms-auth-v1";


std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

// Decodes lowercase or uppercase hex of exactly `bytes` bytes; false for anything else.
bool from_hex(const std::string& hex, std::size_t bytes, std::string* out) {
  if (hex.size() != bytes * 2) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->assign(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) {
    int hi = digit(hex[2 * i]);
    int lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<char>(hi * 16 + lo);
  }
  return true;
}

std::string fresh_nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(kNonceBytes)) !=
      1) {
    // Without randomness a nonce could repeat, and a recorded proof could be replayed.
    throw BackendError("OpenSSL's RAND_bytes failed: no random nonce for the handshake",
                       static_cast<int>(ERR_get_error()));
  }
  return nonce;
}

// Appends a field with its length in front, so that no two field lists hash alike.
void append_field(std::string* out, std::string_view field) {
  std::uint32_t n = static_cast<std::uint32_t>(field.size());
  out->append(reinterpret_cast<const char*>(&n), sizeof(n));
  out->append(field.data(), field.size());
}

bool proofs_equal(const std::string& a, const std::string& b) {
  return a.size() == b.size() && a.size() == SHA256_DIGEST_LENGTH &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string clip(std::string text) {
  if (text.size() > kMaxReasonBytes) text.resize(kMaxReasonBytes);
  return text;
}

// A frame's JSON object with an "ok" boolean; false for anything else.
bool parse_verdict(const std::string& text, json* out) {
  *out = json::parse(text, nullptr, false);
  return out->is_object() && out->contains("ok") && (*out)["ok"].is_boolean();
}

std::string error_of(const json& j) {
  return j.contains("error") && j["error"].is_string() ? clip(j["error"].get<std::string>())
                                                       : std::string("no reason given");
}

}  // namespace

// ---- Proofs and the first message ---------------------------------------------------------

namespace detail {

std::string handshake_proof(const AuthKey& key, bool acceptor, const HandshakeClaim& claim,
                            std::string_view connector_nonce, std::string_view acceptor_nonce) {
  unsigned char hello_hash[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(claim.hello.data()), claim.hello.size(),
         hello_hash);
  std::string input;
  append_field(&input, kLabel);
  append_field(&input, acceptor ? "acceptor" : "connector");
  append_field(&input, std::to_string(static_cast<std::uint32_t>(claim.kind)));
  append_field(&input, std::to_string(claim.rank));
  append_field(&input, claim.fingerprint);
  // Each side's proof puts the other's (fresh) nonce first: the one it could not choose.
  append_field(&input, acceptor ? connector_nonce : acceptor_nonce);
  append_field(&input, acceptor ? acceptor_nonce : connector_nonce);
  append_field(&input, std::string_view(reinterpret_cast<const char*>(hello_hash),
                                        sizeof(hello_hash)));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), key.bytes().data(), static_cast<int>(key.bytes().size()),
           reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac,
           &mac_len) == nullptr) {
    throw BackendError("OpenSSL's HMAC-SHA256 failed", static_cast<int>(ERR_get_error()));
  }
  OPENSSL_cleanse(input.data(), input.size());
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

bool decode_first_message(MessageKind kind, const std::string& text, HandshakeClaim* claim,
                          bool* auth, std::string* nonce, std::string* why) noexcept {
  try {
    json j = json::parse(text, nullptr, false);
    auto fail = [&](const char* reason) {
      *why = reason;
      return false;
    };
    if (!j.is_object()) return fail("not a JSON object (not a libmwms handshake)");
    if (!j.contains("v") || !j["v"].is_number_integer() || j["v"].get<long long>() != 1) {
      return fail("no handshake version 1 (another program, or another libmwms version)");
    }
    if (!j.contains("auth") || !j["auth"].is_boolean()) return fail("no auth flag");
    if (!j.contains("rank") || !j["rank"].is_number_integer()) return fail("no integer rank");
    long long rank = j["rank"].get<long long>();
    if (rank < 0 || rank > (1 << 24)) return fail("rank out of range");
    if (!j.contains("fingerprint") || !j["fingerprint"].is_string() ||
        j["fingerprint"].get_ref<const std::string&>().size() > kMaxFingerprintBytes) {
      return fail("no fingerprint string of at most 256 bytes");
    }
    if (!j.contains("hello") || !j["hello"].is_string()) return fail("no hello text");
    if (!j.contains("nonce") || !j["nonce"].is_string() ||
        !from_hex(j["nonce"].get<std::string>(), kNonceBytes, nonce)) {
      return fail("no 32-byte hex nonce");
    }
    claim->kind = kind;
    claim->rank = static_cast<int>(rank);
    claim->fingerprint = j["fingerprint"].get<std::string>();
    claim->hello = j["hello"].get<std::string>();
    *auth = j["auth"].get<bool>();
    return true;
  } catch (...) {
    *why = "undecodable handshake";
    return false;
  }
}

}  // namespace detail

// ---- Connecting side ----------------------------------------------------------------------

std::string mismatch_detail(const ConnectOutcome& o) {
  static const std::string kPrefix = "key mismatch: ";
  return o.detail.rfind(kPrefix, 0) == 0 ? o.detail.substr(kPrefix.size()) : o.detail;
}

ConnectOutcome connect_handshake(int fd, const AuthKey& key, const HandshakeClaim& claim,
                                 Deadline deadline) {
  using Status = ConnectOutcome::Status;
  ConnectOutcome out;
  try {
    const std::string nonce_c = fresh_nonce();
    json first{{"v", 1},
               {"auth", key.enabled()},
               {"nonce", to_hex(nonce_c)},
               {"rank", claim.rank},
               {"fingerprint", claim.fingerprint},
               {"hello", claim.hello}};
    IoResult w = send_message(fd, claim.kind, first.dump(), deadline);
    MessageKind kind{};
    std::string text;
    IoResult r = w.status == IoStatus::kOk
                     ? recv_message(fd, &kind, &text, deadline, kMaxHandshakeBytes)
                     : w;
    if (r.status != IoStatus::kOk) return {Status::kIo, r, ""};
    json challenge;
    if (kind != MessageKind::kChallenge || !parse_verdict(text, &challenge)) {
      return {Status::kProtocol, {}, "answered with something other than a handshake challenge"};
    }
    if (!challenge["ok"].get<bool>()) {
      bool mismatch = challenge.contains("key_mismatch") && challenge["key_mismatch"].is_boolean() &&
                      challenge["key_mismatch"].get<bool>();
      return {mismatch ? Status::kKeyMismatch : Status::kRefused, {}, error_of(challenge)};
    }
    std::string nonce_a;
    if (!challenge.contains("nonce") || !challenge["nonce"].is_string() ||
        !from_hex(challenge["nonce"].get<std::string>(), kNonceBytes, &nonce_a)) {
      return {Status::kProtocol, {}, "its challenge carries no 32-byte nonce"};
    }
    if (!key.enabled()) return out;  // Note [auth handshake]: no proofs without a key
    std::string proof_a;
    bool proved = challenge.contains("proof") && challenge["proof"].is_string() &&
                  from_hex(challenge["proof"].get<std::string>(), SHA256_DIGEST_LENGTH, &proof_a) &&
                  proofs_equal(proof_a, detail::handshake_proof(key, true, claim, nonce_c, nonce_a));
    if (!proved) {
      std::string why = "key mismatch: the accepting side's proof of MWMS_AUTH_KEY did not verify "
                        "at the connecting side";
      send_message(fd, MessageKind::kProof, json{{"ok", false}, {"error", why}}.dump(), deadline);
      return {Status::kKeyMismatch, {}, "its proof of MWMS_AUTH_KEY did not verify here"};
    }
    std::string proof_c = detail::handshake_proof(key, false, claim, nonce_c, nonce_a);
    w = send_message(fd, MessageKind::kProof, json{{"ok", true}, {"proof", to_hex(proof_c)}}.dump(),
                     deadline);
    r = w.status == IoStatus::kOk ? recv_message(fd, &kind, &text, deadline, kMaxHandshakeBytes)
                                  : w;
    if (r.status != IoStatus::kOk) return {Status::kIo, r, ""};
    json verdict;
    if (kind != MessageKind::kVerdict || !parse_verdict(text, &verdict)) {
      return {Status::kProtocol, {}, "answered with something other than a handshake verdict"};
    }
    if (!verdict["ok"].get<bool>()) return {Status::kKeyMismatch, {}, error_of(verdict)};
    return out;
  } catch (const json::exception& e) {
    return {Status::kProtocol, {}, e.what()};
  }
}

std::string peer_source(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown source";
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    int port = ntohs(a->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      ::inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], text, sizeof(text));
      return std::string(text) + ":" + std::to_string(port);
    }
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return "[" + std::string(text) + "]:" + std::to_string(port);
  }
  return "unknown source";
}

// ---- Accepting side -----------------------------------------------------------------------

struct HandshakeServer::Pending {
  enum class Stage { kFirst, kProof };
  common::Socket socket;
  std::string source;
  Deadline deadline;
  FrameDecoder decoder{kMaxHandshakeBytes};
  Stage stage = Stage::kFirst;
  HandshakeClaim claim;
  std::string nonce_c;
  std::string nonce_a;
};

HandshakeServer::HandshakeServer(const common::Socket& listener, const AuthKey& key,
                                 std::vector<MessageKind> kinds, double hello_seconds)
    : listener_(listener), key_(key), kinds_(std::move(kinds)), hello_seconds_(hello_seconds) {}

HandshakeServer::~HandshakeServer() = default;

std::size_t HandshakeServer::pending() const noexcept { return pending_.size(); }

namespace {

// Finishes `p` as a refusal; tells the peer why when `tell` is not empty (best effort, short).
HandshakeEvent refuse(common::Socket* s, const std::string& source, const HandshakeClaim& claim,
                      MessageKind reply_kind, const std::string& tell, bool key_mismatch,
                      const std::string& reason) {
  if (!tell.empty() && s->valid()) {
    json j{{"ok", false}, {"error", tell}};
    if (key_mismatch) j["key_mismatch"] = true;
    send_message(s->fd(), reply_kind, j.dump(), common::deadline_after(0.2));
  }
  HandshakeEvent e;
  e.source = source;
  e.claim = claim;
  e.key_mismatch = key_mismatch;
  e.reason = reason;
  return e;
}

}  // namespace

void HandshakeServer::advance(Pending* p) {
  using Stage = Pending::Stage;
  IoResult io;
  FrameDecoder::State state = p->decoder.read_from(p->socket.fd(), &io);
  if (state == FrameDecoder::State::kNeedMore) return;
  auto refused = [&](MessageKind reply_kind, const std::string& tell, bool key_mismatch,
                     const std::string& reason) {
    ready_.push_back(
        refuse(&p->socket, p->source, p->claim, reply_kind, tell, key_mismatch, reason));
    p->socket.close();
  };
  if (state == FrameDecoder::State::kError) {
    refused(MessageKind::kChallenge, "", false,
            io.status == IoStatus::kClosed ? std::string("closed the connection mid-handshake")
            : io.error == EPROTO ? std::string("sent bytes that are not a libmwms frame")
                                 : io.describe());
    return;
  }
  const MessageKind kind = p->decoder.kind();
  const std::string text = p->decoder.text();
  p->decoder = FrameDecoder(kMaxHandshakeBytes);
  if (p->stage == Stage::kFirst) {
    if (std::find(kinds_.begin(), kinds_.end(), kind) == kinds_.end()) {
      refused(MessageKind::kChallenge,
              "this listener takes no " + std::string(kind == MessageKind::kHello
                                                          ? "rendezvous hello"
                                                          : "frame of kind " + std::to_string(
                                                                static_cast<std::uint32_t>(kind))) +
                  " now (the rendezvous is over, or this task is not the leader)",
              false,
              "sent a frame of kind " + std::to_string(static_cast<std::uint32_t>(kind)) +
                  ", not a hello this listener expects now");
      return;
    }
    bool auth = false;
    std::string why;
    if (!detail::decode_first_message(kind, text, &p->claim, &auth, &p->nonce_c, &why)) {
      refused(MessageKind::kChallenge, why, false, "sent an invalid hello: " + why);
      return;
    }
    if (key_.enabled() != auth) {
      refused(MessageKind::kChallenge,
              key_.enabled() ? "key mismatch: the accepting side requires MWMS_AUTH_KEY and the "
                               "connecting side has none"
                             : "key mismatch: the connecting side has an MWMS_AUTH_KEY and the "
                               "accepting side has none",
              true,
              key_.enabled() ? "key mismatch: it has no MWMS_AUTH_KEY (this task has one)"
                             : "key mismatch: it has an MWMS_AUTH_KEY and this task has none");
      return;
    }
    p->nonce_a = fresh_nonce();
    json challenge{{"ok", true}, {"nonce", to_hex(p->nonce_a)}};
    if (key_.enabled()) {
      challenge["proof"] =
          to_hex(detail::handshake_proof(key_, true, p->claim, p->nonce_c, p->nonce_a));
    }
    IoResult w = send_message(p->socket.fd(), MessageKind::kChallenge, challenge.dump(), p->deadline);
    if (w.status != IoStatus::kOk) {
      refused(MessageKind::kChallenge, "", false, "challenge not sent: " + w.describe());
      return;
    }
    if (key_.enabled()) {
      p->stage = Stage::kProof;
      return;
    }
  } else {
    json proof;
    if (kind != MessageKind::kProof || !parse_verdict(text, &proof)) {
      refused(MessageKind::kVerdict, "no handshake proof", false, "sent no handshake proof");
      return;
    }
    if (!proof["ok"].get<bool>()) {
      refused(MessageKind::kVerdict, "", true, error_of(proof));
      return;
    }
    std::string got;
    bool proved = proof.contains("proof") && proof["proof"].is_string() &&
                  from_hex(proof["proof"].get<std::string>(), SHA256_DIGEST_LENGTH, &got) &&
                  proofs_equal(got, detail::handshake_proof(key_, false, p->claim, p->nonce_c,
                                                            p->nonce_a));
    if (!proved) {
      refused(MessageKind::kVerdict,
              "key mismatch: the connecting side's proof of MWMS_AUTH_KEY did not verify at the "
              "accepting side",
              true, "key mismatch: its proof of MWMS_AUTH_KEY did not verify (another key)");
      return;
    }
    IoResult w = send_message(p->socket.fd(), MessageKind::kVerdict, json{{"ok", true}}.dump(),
                              p->deadline);
    if (w.status != IoStatus::kOk) {
      refused(MessageKind::kVerdict, "", false, "verdict not sent: " + w.describe());
      return;
    }
  }
  HandshakeEvent e;
  e.ok = true;
  e.source = p->source;
  e.claim = p->claim;
  e.socket = std::move(p->socket);
  ready_.push_back(std::move(e));
}

std::optional<HandshakeEvent> HandshakeServer::next(Deadline until) {
  for (;;) {
    if (!ready_.empty()) {
      HandshakeEvent e = std::move(ready_.front());
      ready_.erase(ready_.begin());
      return e;
    }
    Deadline wake = until;
    for (const auto& p : pending_) wake = std::min(wake, p->deadline);
    double left = common::seconds_left(wake);
    std::vector<pollfd> fds;
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (const auto& p : pending_) fds.push_back({p->socket.fd(), POLLIN, 0});
    int ms = left <= 0 ? 0 : static_cast<int>(left * 1000.0) + 1;
    int rc = ::poll(fds.data(), fds.size(), ms);
    if (rc < 0 && errno != EINTR) {
      MWMS_LOG_WARN(kBoot, "poll over pending handshakes failed: " << std::strerror(errno));
    }
    if (rc > 0 && (fds[0].revents & POLLIN) != 0) {
      int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        auto p = std::make_unique<Pending>();
        p->socket = common::Socket(fd);
        p->source = peer_source(fd);
        p->deadline = common::deadline_after(hello_seconds_);
        if (pending_.size() >= kMaxPending) {
          ready_.push_back(refuse(&p->socket, p->source, {}, MessageKind::kChallenge, "", false,
                                  "too many connections handshaking at once"));
        } else {
          pending_.push_back(std::move(p));
        }
      } else if (common::descriptors_exhausted(errno)) {
        // Note [descriptor budget]: the connection stays queued and the listener readable, and
        // no descriptor comes back by waiting: fail now, naming the limit.
        throw BootstrapError("cannot accept a connection: " + common::errno_description(errno));
      }
    }
    for (std::size_t i = 1; rc > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      advance(pending_[i - 1].get());
    }
    // Finished (socket moved or refused) entries have an invalid socket; expired ones refused.
    const auto now = common::Clock::now();
    for (auto& p : pending_) {
      if (p->socket.valid() && now >= p->deadline) {
        ready_.push_back(refuse(&p->socket, p->source, p->claim, MessageKind::kChallenge, "",
                                false,
                                "no complete handshake within " +
                                    std::to_string(static_cast<int>(hello_seconds_)) + " s"));
        p->socket.close();
      }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const auto& p) { return !p->socket.valid(); }),
                   pending_.end());
    if (ready_.empty() && common::Clock::now() >= until) return std::nullopt;
  }
}

}  // namespace mwms::bootstrap
