// The connection handshake (Note [auth handshake]): right key, wrong key, no key, truncated and
// oversized frames, a replayed exchange, and concurrent deadlines for silent connections. The
// accepting side runs in this thread; the connecting side is driven frame by frame (or, for the
// real connect_handshake, from one helper thread).
#include "bootstrap/handshake.h"

#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "support/handshake_peer.h"

namespace {

using mwms::bootstrap::AuthKey;
using mwms::bootstrap::ConnectOutcome;
using mwms::bootstrap::FrameDecoder;
using mwms::bootstrap::HandshakeClaim;
using mwms::bootstrap::HandshakeEvent;
using mwms::bootstrap::HandshakeServer;
using mwms::bootstrap::MessageKind;
using mwms::common::Socket;
using mwms::testing::TestListener;
using nlohmann::json;
using Catch::Matchers::Contains;

HandshakeClaim claim_of(int rank) {
  return {MessageKind::kHello, rank, "fp-1234", R"({"task":"worker 1"})"};
}

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(d[b >> 4]);
    out.push_back(d[b & 15]);
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string first_message(const HandshakeClaim& c, bool auth, const std::string& nonce) {
  return json{{"v", 1},          {"auth", auth},         {"nonce", hex(nonce)},
              {"rank", c.rank},  {"fingerprint", c.fingerprint}, {"hello", c.hello}}
      .dump();
}

json recv_json(const Socket& s, MessageKind expected) {
  MessageKind kind{};
  std::string text = mwms::testing::recv_text(s.fd(), &kind);
  REQUIRE(kind == expected);
  return json::parse(text);
}

void send_raw(const Socket& s, MessageKind kind, const std::string& text) {
  REQUIRE(mwms::bootstrap::send_message(s.fd(), kind, text, mwms::common::deadline_after(5))
              .status == mwms::common::IoStatus::kOk);
}

// Runs the server until it reports one event (or `seconds` pass).
std::optional<HandshakeEvent> wait_event(HandshakeServer& server, double seconds = 5) {
  return server.next(mwms::common::deadline_after(seconds));
}

// connect_handshake on a helper thread against `server` in this one.
std::pair<ConnectOutcome, std::optional<HandshakeEvent>> run_pair(const AuthKey& server_key,
                                                                  const AuthKey& client_key) {
  TestListener l;
  HandshakeServer server(l.socket, server_key, {MessageKind::kHello}, 5);
  Socket client = l.connect();
  ConnectOutcome outcome;
  std::thread t([&] {
    outcome = mwms::bootstrap::connect_handshake(client.fd(), client_key, claim_of(3),
                                                 mwms::common::deadline_after(5));
  });
  std::optional<HandshakeEvent> ev = wait_event(server);
  t.join();
  return {outcome, std::move(ev)};
}

}  // namespace

TEST_CASE("handshake: the right key on both sides admits the claim unchanged", "[unit]") {
  auto [outcome, ev] = run_pair(AuthKey("s3cret"), AuthKey("s3cret"));
  INFO(outcome.detail);
  CHECK(outcome.status == ConnectOutcome::Status::kOk);
  REQUIRE(ev.has_value());
  CHECK(ev->ok);
  CHECK(ev->socket.valid());
  CHECK(ev->claim.rank == 3);
  CHECK(ev->claim.fingerprint == "fp-1234");
  CHECK(ev->claim.hello == R"({"task":"worker 1"})");
  CHECK_THAT(ev->source, Contains("127.0.0.1:"));
}

TEST_CASE("handshake: without a key on both sides the claim passes unproven", "[unit]") {
  auto [outcome, ev] = run_pair(AuthKey(), AuthKey());
  CHECK(outcome.status == ConnectOutcome::Status::kOk);
  REQUIRE(ev.has_value());
  CHECK(ev->ok);
  CHECK(ev->claim.rank == 3);
}

TEST_CASE("handshake: another key is refused at both ends as a key mismatch", "[unit]") {
  auto [outcome, ev] = run_pair(AuthKey("key-A"), AuthKey("key-B"));
  CHECK(outcome.status == ConnectOutcome::Status::kKeyMismatch);
  REQUIRE(ev.has_value());
  CHECK_FALSE(ev->ok);
  CHECK(ev->key_mismatch);
  CHECK(ev->claim.rank == 3);  // what it claimed, for the log
  CHECK_THAT(ev->reason, Contains("key mismatch"));
  CHECK_THAT(ev->source, Contains("127.0.0.1:"));
}

TEST_CASE("handshake: a side without the key meets one with it: both refuse", "[unit]") {
  auto [outcome, ev] = run_pair(AuthKey("key-A"), AuthKey());
  CHECK(outcome.status == ConnectOutcome::Status::kKeyMismatch);
  CHECK_THAT(outcome.detail, Contains("requires MWMS_AUTH_KEY"));
  REQUIRE(ev.has_value());
  CHECK(ev->key_mismatch);
  auto [outcome2, ev2] = run_pair(AuthKey(), AuthKey("key-A"));
  CHECK(outcome2.status == ConnectOutcome::Status::kKeyMismatch);
  REQUIRE(ev2.has_value());
  CHECK(ev2->key_mismatch);
}

TEST_CASE("handshake: a replayed exchange proves nothing on a new connection", "[unit]") {
  const AuthKey key("s3cret");
  TestListener l;
  HandshakeServer server(l.socket, key, {MessageKind::kHello}, 5);
  const HandshakeClaim claim = claim_of(1);
  const std::string nonce_c(32, '\x11');
  // A real exchange, recorded.
  Socket first = l.connect();
  send_raw(first, MessageKind::kHello, first_message(claim, true, nonce_c));
  CHECK_FALSE(server.next(mwms::common::deadline_after(0.3)).has_value());  // awaits the proof
  json challenge = recv_json(first, MessageKind::kChallenge);
  const std::string nonce_a = unhex(challenge["nonce"].get<std::string>());
  // The acceptor's proof verifies for the real connector.
  CHECK(unhex(challenge["proof"].get<std::string>()) ==
        mwms::bootstrap::detail::handshake_proof(key, true, claim, nonce_c, nonce_a));
  const std::string proof = json{{"ok", true},
                                 {"proof", hex(mwms::bootstrap::detail::handshake_proof(
                                               key, false, claim, nonce_c, nonce_a))}}
                                .dump();
  send_raw(first, MessageKind::kProof, proof);
  auto ok = wait_event(server);
  REQUIRE(ok.has_value());
  CHECK(ok->ok);
  CHECK(recv_json(first, MessageKind::kVerdict)["ok"].get<bool>());
  // A stranger replays both messages on a new connection: the acceptor's nonce is fresh.
  Socket replay = l.connect();
  send_raw(replay, MessageKind::kHello, first_message(claim, true, nonce_c));
  CHECK_FALSE(server.next(mwms::common::deadline_after(0.3)).has_value());
  json challenge2 = recv_json(replay, MessageKind::kChallenge);
  CHECK(challenge2["nonce"] != challenge["nonce"]);
  send_raw(replay, MessageKind::kProof, proof);
  auto refused = wait_event(server);
  REQUIRE(refused.has_value());
  CHECK_FALSE(refused->ok);
  CHECK(refused->key_mismatch);
  CHECK_FALSE(recv_json(replay, MessageKind::kVerdict)["ok"].get<bool>());
}

TEST_CASE("handshake: the proofs cover every claim and the role", "[unit]") {
  const AuthKey key("k");
  const std::string nc(32, 'c'), na(32, 'a');
  const HandshakeClaim base = claim_of(1);
  const std::string p = mwms::bootstrap::detail::handshake_proof(key, false, base, nc, na);
  CHECK(p.size() == 32);
  auto changed = [&](auto edit) {
    HandshakeClaim c = base;
    edit(c);
    return mwms::bootstrap::detail::handshake_proof(key, false, c, nc, na) != p;
  };
  CHECK(changed([](HandshakeClaim& c) { c.rank = 2; }));
  CHECK(changed([](HandshakeClaim& c) { c.fingerprint = "fp-9"; }));
  CHECK(changed([](HandshakeClaim& c) { c.kind = MessageKind::kRingData; }));
  CHECK(changed([](HandshakeClaim& c) { c.hello += " "; }));
  CHECK(mwms::bootstrap::detail::handshake_proof(key, true, base, nc, na) != p);
  CHECK(mwms::bootstrap::detail::handshake_proof(AuthKey("k2"), false, base, nc, na) != p);
  CHECK(mwms::bootstrap::detail::handshake_proof(key, false, base, na, nc) != p);
}

TEST_CASE("handshake: truncated and oversized frames are refused, never waited on", "[unit]") {
  TestListener l;
  HandshakeServer server(l.socket, AuthKey("k"), {MessageKind::kHello}, 0.5);
  // A header announcing more than the handshake bound: refused at once, nothing allocated.
  Socket big = l.connect();
  std::uint32_t header[4] = {0x424D574D, 1, 1, static_cast<std::uint32_t>(
                                                   mwms::bootstrap::kMaxHandshakeBytes + 1)};
  REQUIRE(::send(big.fd(), header, sizeof(header), MSG_NOSIGNAL) == sizeof(header));
  auto start = std::chrono::steady_clock::now();
  auto ev = wait_event(server);
  REQUIRE(ev.has_value());
  CHECK_FALSE(ev->ok);
  CHECK_THAT(ev->reason, Contains("not a libmwms frame"));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 0.4);
  // Half a frame, then the connection closes.
  Socket half = l.connect();
  header[3] = 100;
  REQUIRE(::send(half.fd(), header, sizeof(header), MSG_NOSIGNAL) == sizeof(header));
  REQUIRE(::send(half.fd(), "{\"v\":1", 6, MSG_NOSIGNAL) == 6);
  half.close();
  ev = wait_event(server);
  REQUIRE(ev.has_value());
  CHECK_THAT(ev->reason, Contains("closed"));
  // Half a frame, and silence: refused at the connection's own deadline.
  Socket stall = l.connect();
  REQUIRE(::send(stall.fd(), header, sizeof(header), MSG_NOSIGNAL) == sizeof(header));
  ev = wait_event(server);
  REQUIRE(ev.has_value());
  CHECK_THAT(ev->reason, Contains("no complete handshake"));
  // Valid framing around an invalid first message.
  Socket junk = l.connect();
  send_raw(junk, MessageKind::kHello, R"({"v":1,"auth":true,"rank":"1"})");
  ev = wait_event(server);
  REQUIRE(ev.has_value());
  CHECK_THAT(ev->reason, Contains("invalid hello"));
  CHECK(ev->claim.rank == -1);
  // A frame kind this listener does not serve.
  Socket wrong = l.connect();
  send_raw(wrong, MessageKind::kRingData, first_message(claim_of(1), true, std::string(32, 'x')));
  ev = wait_event(server);
  REQUIRE(ev.has_value());
  CHECK_THAT(ev->reason, Contains("kind 3"));
}

TEST_CASE("handshake: silent connections run their deadlines concurrently", "[unit]") {
  TestListener l;
  HandshakeServer server(l.socket, AuthKey(), {MessageKind::kHello}, 0.5);
  std::vector<Socket> silent;
  for (int i = 0; i < 12; ++i) silent.push_back(l.connect());
  auto start = std::chrono::steady_clock::now();
  int refused = 0;
  while (refused < 12) {
    auto ev = wait_event(server, 3);
    REQUIRE(ev.has_value());
    CHECK_FALSE(ev->ok);
    ++refused;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("12 silent connections took " << seconds << " s");
  CHECK(seconds < 1.5);  // one 0.5 s deadline (one after another would be 6 s)
}

TEST_CASE("handshake: the frame decoder takes a frame in any split and bounds it", "[unit]") {
  std::string frame;
  std::uint32_t header[4] = {0x424D574D, 1, 5, 3};
  frame.append(reinterpret_cast<const char*>(header), sizeof(header));
  frame += "abcNEXT";
  FrameDecoder d(16);
  std::size_t used = 0, total = 0;
  for (std::size_t i = 0; i < frame.size() && d.feed(std::string_view(frame).substr(i, 1), &used) ==
                                                  FrameDecoder::State::kNeedMore;
       ++i) {
    total += used;
  }
  CHECK(d.kind() == MessageKind::kChallenge);
  CHECK(d.text() == "abc");
  FrameDecoder whole(16);
  CHECK(whole.feed(frame, &used) == FrameDecoder::State::kDone);
  CHECK(used == 19);  // stops at the end of the frame: "NEXT" belongs to the next reader
  header[3] = 17;
  FrameDecoder small(16);
  CHECK(small.feed(std::string_view(reinterpret_cast<const char*>(header), 16), &used) ==
        FrameDecoder::State::kError);
  header[0] = 0;
  header[3] = 1;
  FrameDecoder magic(16);
  CHECK(magic.feed(std::string_view(reinterpret_cast<const char*>(header), 16), &used) ==
        FrameDecoder::State::kError);
}
